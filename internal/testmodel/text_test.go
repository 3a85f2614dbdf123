package testmodel_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/apiary-llm/apiary/internal/testmodel"
)

// A text model's vocabulary is the byte-level one, at the same ids, then
// words of at least two letters, each once; what it may write is decided
// by its output weights (TestTextModelWritesOnlyWords in internal/llamacpp
// runs it).
func TestTextModelVocabulary(t *testing.T) {
	plain, _ := mustLookup(t, parse(t, generate(t, testmodel.Options{})).Metadata, "tokenizer.ggml.tokens").AsStrings()
	f := parse(t, generate(t, testmodel.Options{Text: true}))
	tokens, _ := mustLookup(t, f.Metadata, "tokenizer.ggml.tokens").AsStrings()
	if len(tokens) != testmodel.TextVocabSize || testmodel.TextVocabSize < testmodel.VocabSize+100 {
		t.Fatalf("%d tokens, TextVocabSize %d; want TextVocabSize, and a hundred words at least", len(tokens), testmodel.TextVocabSize)
	}
	for i, tok := range plain {
		if tokens[i] != tok {
			t.Fatalf("token %d is %q, the byte-level model's %q: the ids must stay", i, tokens[i], tok)
		}
	}
	seen := map[string]bool{}
	for _, tok := range tokens {
		if seen[tok] {
			t.Errorf("token %q appears twice", tok)
		}
		seen[tok] = true
	}
	for _, tok := range tokens[testmodel.VocabSize:] {
		w, ok := strings.CutPrefix(tok, "▁")
		if !ok || len(w) < 2 || strings.Trim(w, "abcdefghijklmnopqrstuvwxyz") != "" {
			t.Errorf("word token %q: want ▁ and two or more lowercase letters", tok)
		}
	}
	if name := f.Info().Name; name != "apiary test model (seed 1, 2 layers, dim 64, text)" {
		t.Errorf("name %q", name)
	}

	// Pairs come after the words.
	o := testmodel.Options{Text: true, Vocab: testmodel.TextVocabSize + 2}
	more, _ := mustLookup(t, parse(t, generate(t, o)).Metadata, "tokenizer.ggml.tokens").AsStrings()
	if got := more[testmodel.TextVocabSize:]; len(got) != 2 || got[0] != "!!" || got[1] != `!"` {
		t.Errorf("tokens after the words: %q, want the first pairs", got)
	}
	for _, tt := range []struct {
		o   testmodel.Options
		bad bool
	}{
		{testmodel.Options{Text: true, Vocab: testmodel.TextVocabSize - 1}, true},
		{testmodel.Options{Text: true, Vocab: testmodel.MaxVocab + testmodel.TextVocabSize - testmodel.VocabSize}, false},
		{testmodel.Options{Text: true, Vocab: testmodel.MaxVocab + testmodel.TextVocabSize - testmodel.VocabSize + 1}, true},
	} {
		if err := tt.o.Validate(); errors.Is(err, testmodel.ErrOptions) != tt.bad {
			t.Errorf("Validate(vocab %d) = %v, want an error: %v", tt.o.Vocab, err, tt.bad)
		}
	}
}

// The weights that keep a text model to words (text.go): component 0 of
// the residual stream is a constant that no layer writes to, and the
// output reads it as a large penalty for every token but the words, ","
// and ".", and end of text. Every architecture has an output of its own.
func TestTextModelWeights(t *testing.T) {
	for _, arch := range testmodel.Archs() {
		t.Run(string(arch), func(t *testing.T) {
			o := testmodel.Options{Arch: arch, Text: true}
			b := generate(t, o)
			f := parse(t, b)
			tokens, _ := mustLookup(t, f.Metadata, "tokenizer.ggml.tokens").AsStrings()
			values := func(name string) ([]float32, []uint64) {
				ti, ok := f.Tensor(name)
				if !ok {
					t.Fatalf("no tensor %s", name)
				}
				vs := make([]float32, ti.Elements)
				if err := binary.Read(f.TensorData(bytes.NewReader(b), ti), binary.LittleEndian, vs); err != nil {
					t.Fatal(err)
				}
				return vs, ti.Shape
			}
			const dim = 64
			embd, _ := values("token_embd.weight")
			out, _ := values("output.weight")
			for id, tok := range tokens {
				if embd[id*dim] != 1 {
					t.Fatalf("token_embd of %q: component 0 is %g, want 1", tok, embd[id*dim])
				}
				writes := id == testmodel.EOSToken || tok == "," || tok == "." || strings.HasPrefix(tok, "▁") && tok != "▁"
				if got, want := out[id*dim], map[bool]float32{true: 0, false: -100}[writes]; got != want {
					t.Errorf("output of %q: component 0 is %g, want %g", tok, got, want)
				}
			}
			writers := 0
			for _, ti := range f.Tensors {
				if !strings.HasSuffix(ti.Name, "_output.weight") && !strings.HasSuffix(ti.Name, "ssm_out.weight") && !strings.Contains(ti.Name, "ffn_down") {
					continue
				}
				writers++
				vs, shape := values(ti.Name)
				in := int(shape[0])
				for i, v := range vs {
					if (i/in)%dim == 0 && v != 0 {
						t.Fatalf("%s: value %d (row 0) is %g: no layer may write to component 0", ti.Name, i, v)
					}
				}
			}
			if writers < 2*2 {
				t.Errorf("%d matrices write to the residual stream, want at least 2 a layer", writers)
			}
			// Outside component 0 the weights are random as ever.
			var sum, sumSq float64
			n := 0
			for i, v := range out {
				if i%dim != 0 {
					sum, sumSq, n = sum+float64(v), sumSq+float64(v)*float64(v), n+1
				}
			}
			if std := math.Sqrt(sumSq/float64(n) - (sum/float64(n))*(sum/float64(n))); std < 0.01 {
				t.Errorf("output weights outside component 0: std %g, want random", std)
			}
		})
	}
}

// The byte-level model stays what other packages' tests rely on, and the
// text model is another model.
func TestTextModelIsAnotherModel(t *testing.T) {
	for _, arch := range testmodel.Archs() {
		a, b := generate(t, testmodel.Options{Arch: arch}), generate(t, testmodel.Options{Arch: arch, Text: true})
		if bytes.Equal(a, b) {
			t.Errorf("%s: the text model is the byte-level model", arch)
		}
		if _, ok := parse(t, a).Tensor("output.weight"); ok == (arch == testmodel.Gemma3 || arch == testmodel.Gemma4) {
			t.Errorf("%s: byte-level model: output.weight present %v", arch, ok)
		}
	}
	if name := parse(t, generate(t, testmodel.Options{Text: true, Dim: 32})).Info().Name; !strings.HasSuffix(name, ", text)") {
		t.Errorf("name %q, want it to say text", name)
	}
}
