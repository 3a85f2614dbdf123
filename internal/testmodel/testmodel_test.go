package testmodel_test

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/apiary-llm/apiary/internal/gguf"
	"github.com/apiary-llm/apiary/internal/testmodel"
	"github.com/google/go-cmp/cmp"
)

func generate(t *testing.T, o testmodel.Options) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := testmodel.Write(&buf, o); err != nil {
		t.Fatalf("Write(%+v): %v", o, err)
	}
	return buf.Bytes()
}

func parse(t *testing.T, b []byte) *gguf.File {
	t.Helper()
	f, err := gguf.Read(bytes.NewReader(b), int64(len(b)))
	if err != nil {
		t.Fatalf("reading the generated model: %v", err)
	}
	return f
}

func TestDefaultModel(t *testing.T) {
	b := generate(t, testmodel.Options{})
	f := parse(t, b)

	want := gguf.Info{
		Architecture:      "llama",
		Name:              "apiary test model (seed 1, 2 layers, dim 64)",
		FileType:          0,
		ContextLength:     2048,
		BlockCount:        2,
		EmbeddingLength:   64,
		FeedForwardLength: 256,
		HeadCount:         4,
		HeadCountKV:       4,
		KeyLength:         16,
		ValueLength:       16,
		VocabSize:         3 + 256 + 1 + 94,
		// token_embd + output: 2×64×354; output_norm: 64; per layer
		// 2 norms of 64, q k v o of 64×64, gate up down of 64×256.
		ParameterCount: 2*64*354 + 64 + 2*(2*64+4*64*64+3*64*256),
	}
	want.WeightsBytes = 4 * want.ParameterCount
	if diff := cmp.Diff(want, f.Info()); diff != "" {
		t.Errorf("Info (-want +got):\n%s", diff)
	}
	if f.Info().FileType.String() != "F32" {
		t.Errorf("file type %s, want F32", f.Info().FileType)
	}
	if len(b) < 600_000 || len(b) > 1_100_000 {
		t.Errorf("default model is %d bytes, want about 1 MB at most", len(b))
	}
	if _, ok := f.Metadata.Lookup("tokenizer.chat_template"); ok {
		t.Error("the model has a chat template; the worker's fallback is meant to be used")
	}
}

func TestTensors(t *testing.T) {
	for _, o := range []testmodel.Options{{}, {Layers: 3, Dim: 32}, {Layers: 1, Dim: 8}, {Layers: 1, Dim: 24, Heads: 6, FF: 40, Vocab: 500}} {
		t.Run(fmt.Sprintf("layers=%d,dim=%d,heads=%d,ff=%d,vocab=%d", o.Layers, o.Dim, o.Heads, o.FF, o.Vocab), func(t *testing.T) {
			f := parse(t, generate(t, o))
			layers, dim := or(o.Layers, 2), uint64(or(o.Dim, 64))
			vocab, ff := uint64(or(o.Vocab, testmodel.VocabSize)), uint64(or(o.FF, 4*int(dim)))
			want := map[string][]uint64{
				"token_embd.weight":  {dim, vocab},
				"output_norm.weight": {dim},
				"output.weight":      {dim, vocab},
			}
			for l := range layers {
				for name, shape := range map[string][]uint64{
					"attn_norm": {dim}, "attn_q": {dim, dim}, "attn_k": {dim, dim}, "attn_v": {dim, dim},
					"attn_output": {dim, dim}, "ffn_norm": {dim},
					"ffn_gate": {dim, ff}, "ffn_up": {dim, ff}, "ffn_down": {ff, dim},
				} {
					want[fmt.Sprintf("blk.%d.%s.weight", l, name)] = shape
				}
			}
			got := map[string][]uint64{}
			for _, ti := range f.Tensors {
				if ti.Type != gguf.TypeF32 {
					t.Errorf("tensor %s is %s, want F32", ti.Name, ti.Type)
				}
				got[ti.Name] = ti.Shape
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("tensor shapes (-want +got):\n%s", diff)
			}
		})
	}
}

// TestWeights checks the values: norms are 1, the other weights small and
// centred on 0.
func TestWeights(t *testing.T) {
	b := generate(t, testmodel.Options{})
	f := parse(t, b)
	for _, name := range []string{"output_norm.weight", "blk.1.ffn_norm.weight", "blk.0.attn_q.weight", "token_embd.weight"} {
		ti, ok := f.Tensor(name)
		if !ok {
			t.Fatalf("no tensor %s", name)
		}
		data := make([]byte, ti.Size)
		if _, err := f.TensorData(bytes.NewReader(b), ti).Read(data); err != nil {
			t.Fatal(err)
		}
		var sum, sumSq float64
		for i := 0; i < len(data); i += 4 {
			v := float64(math.Float32frombits(uint32(data[i]) | uint32(data[i+1])<<8 | uint32(data[i+2])<<16 | uint32(data[i+3])<<24))
			sum += v
			sumSq += v * v
		}
		n := float64(ti.Elements)
		mean, std := sum/n, math.Sqrt(sumSq/n-(sum/n)*(sum/n))
		isNorm := name == "output_norm.weight" || name == "blk.1.ffn_norm.weight"
		switch {
		case isNorm && (mean != 1 || std != 0):
			t.Errorf("%s: mean %g, std %g; want all ones", name, mean, std)
		case !isNorm && (math.Abs(mean) > 0.005 || math.Abs(std-testmodel.WeightStdDev) > 0.005):
			t.Errorf("%s: mean %g, std %g; want about 0 and %g", name, mean, std, testmodel.WeightStdDev)
		}
	}
}

func TestTokenizer(t *testing.T) {
	md := parse(t, generate(t, testmodel.Options{})).Metadata
	tokens, _ := mustLookup(t, md, "tokenizer.ggml.tokens").AsStrings()
	types, _ := mustLookup(t, md, "tokenizer.ggml.token_type").AsUints()
	if n := mustLookup(t, md, "tokenizer.ggml.scores").Len(); n != len(tokens) || len(types) != len(tokens) {
		t.Fatalf("%d tokens, %d scores, %d types", len(tokens), n, len(types))
	}
	typeOf := map[string]uint64{}
	for i, tok := range tokens {
		if _, dup := typeOf[tok]; dup {
			t.Errorf("token %q appears twice", tok)
		}
		typeOf[tok] = types[i]
	}
	for tok, want := range map[string]uint64{
		"<unk>": 2, "<s>": 3, "</s>": 3, "<0x00>": 6, "<0x0A>": 6, "<0xFF>": 6, "▁": 1, "a": 1, "~": 1, "!": 1,
	} {
		if got, ok := typeOf[tok]; !ok || got != want {
			t.Errorf("token %q: type %d (present %v), want %d", tok, got, ok, want)
		}
	}
	for i, want := range []string{"<unk>", "<s>", "</s>"} {
		if tokens[i] != want {
			t.Errorf("token %d is %q, want %q", i, tokens[i], want)
		}
	}
	for key, want := range map[string]uint64{
		"tokenizer.ggml.unknown_token_id": 0, "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
	} {
		if got, ok := mustLookup(t, md, key).AsUint(); !ok || got != want {
			t.Errorf("%s = %d, want %d", key, got, want)
		}
	}
	if b, _ := mustLookup(t, md, "tokenizer.ggml.add_bos_token").AsBool(); !b {
		t.Error("add_bos_token is not true")
	}
	if got := md.String("tokenizer.ggml.model"); got != "llama" {
		t.Errorf("tokenizer model %q, want llama", got)
	}
}

// or is a, or b when a is 0 (the defaults of Options).
func or(a, b int) int {
	if a == 0 {
		return b
	}
	return a
}

func mustLookup(t *testing.T, md gguf.Metadata, key string) gguf.Value {
	t.Helper()
	v, ok := md.Lookup(key)
	if !ok {
		t.Fatalf("no metadata key %s", key)
	}
	return v
}

func TestDeterministic(t *testing.T) {
	a := generate(t, testmodel.Options{Seed: 7})
	if b := generate(t, testmodel.Options{Seed: 7}); !bytes.Equal(a, b) {
		t.Error("the same seed gave different files")
	}
	if c := generate(t, testmodel.Options{Seed: 8}); bytes.Equal(a, c) || len(a) != len(c) {
		t.Errorf("seeds 7 and 8: equal %v, sizes %d and %d; want different bytes of the same size", bytes.Equal(a, c), len(a), len(c))
	}
	if d := generate(t, testmodel.Options{Seed: 1}); !bytes.Equal(d, generate(t, testmodel.Options{})) {
		t.Error("seed 1 differs from the default seed")
	}
}

func TestOptionsValidate(t *testing.T) {
	tests := []struct {
		o   testmodel.Options
		msg string // "" when valid
	}{
		{testmodel.Options{}, ""},
		{testmodel.Options{Layers: 64, Dim: 4096}, ""},
		{testmodel.Options{Layers: 1, Dim: 8}, ""},
		{testmodel.Options{Layers: 65}, "invalid options: layers 65 is not in 1…64"},
		{testmodel.Options{Layers: -1}, "invalid options: layers -1 is not in 1…64"},
		{testmodel.Options{Dim: 4}, "invalid options: dim 4 is not a multiple of 8 (2 × heads) in 8…4096"},
		{testmodel.Options{Dim: 66}, "invalid options: dim 66 is not a multiple of 8 (2 × heads) in 8…4096"},
		{testmodel.Options{Dim: 4100}, "invalid options: dim 4100 is not a multiple of 8 (2 × heads) in 8…4096"},
		{testmodel.Options{Rerank: true}, ""},
		{testmodel.Options{Rerank: true, Arch: testmodel.Qwen3}, ""},
		{testmodel.Options{Rerank: true, Arch: testmodel.Llama}, "invalid options: a reranker is of architecture qwen3, not llama"},
	}
	for _, tt := range tests {
		err := tt.o.Validate()
		switch {
		case tt.msg == "" && err != nil:
			t.Errorf("Validate(%+v) = %v, want nil", tt.o, err)
		case tt.msg != "" && (err == nil || err.Error() != tt.msg || !errors.Is(err, testmodel.ErrOptions)):
			t.Errorf("Validate(%+v) = %v, want %q", tt.o, err, tt.msg)
		}
	}
	var buf bytes.Buffer
	if err := testmodel.Write(&buf, testmodel.Options{Dim: 6}); !errors.Is(err, testmodel.ErrOptions) || buf.Len() != 0 {
		t.Errorf("Write with a bad dim = %v after %d bytes, want ErrOptions and nothing written", err, buf.Len())
	}
}

func TestWriteFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "tiny.gguf")
	if err := os.WriteFile(path, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := testmodel.WriteFile(path, testmodel.Options{}); err != nil {
		t.Fatalf("WriteFile: %v", err)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, generate(t, testmodel.Options{})) {
		t.Error("the file differs from what Write produces")
	}
	if _, err := gguf.Open(path); err != nil {
		t.Errorf("Open: %v", err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("directory holds %d entries, want only the model (no temporary file left)", len(entries))
	}

	if err := testmodel.WriteFile(filepath.Join(dir, "missing", "x.gguf"), testmodel.Options{}); err == nil {
		t.Error("WriteFile into a missing directory succeeded")
	}
	if err := testmodel.WriteFile(path, testmodel.Options{Layers: 100}); !errors.Is(err, testmodel.ErrOptions) {
		t.Errorf("WriteFile with bad options = %v, want ErrOptions", err)
	}
}

// The benchmark shape (embedding 768, 12 heads, feed-forward 2048)
// at one layer: the options reach the metadata, and the extra tokens are
// pairs of printable characters after the byte-level vocabulary.
func TestCustomShape(t *testing.T) {
	o := testmodel.Options{Layers: 1, Dim: 768, Heads: 12, FF: 2048, Vocab: 4000}
	f := parse(t, generate(t, o))
	i := f.Info()
	if i.HeadCount != 12 || i.HeadCountKV != 12 || i.KeyLength != 64 || i.FeedForwardLength != 2048 || i.VocabSize != 4000 ||
		i.Name != "apiary test model (seed 1, 1 layers, dim 768, 12 heads, feed-forward 2048, vocab 4000)" {
		t.Errorf("info %+v", i)
	}
	v, _ := f.Metadata.Lookup("tokenizer.ggml.tokens")
	tokens, _ := v.AsStrings()
	if len(tokens) != 4000 || tokens[testmodel.VocabSize] != "!!" || tokens[testmodel.VocabSize+94] != "\"!" || tokens[3999] == "" {
		t.Errorf("extra tokens: %q … %q", tokens[testmodel.VocabSize:testmodel.VocabSize+3], tokens[3996:])
	}
	for _, bad := range []testmodel.Options{
		{Dim: 64, Heads: 3}, {Dim: 64, Heads: 64}, {Heads: testmodel.MaxHeads + 1}, {FF: -1}, {FF: testmodel.MaxFF + 1},
		{Vocab: testmodel.VocabSize - 1}, {Vocab: testmodel.MaxVocab + 1},
	} {
		if err := bad.Validate(); !errors.Is(err, testmodel.ErrOptions) {
			t.Errorf("%+v: %v, want ErrOptions", bad, err)
		}
	}
}

// A reranker is a qwen3 model whose metadata names rank pooling, two
// classifier labels and the rerank template, with a classifier head of
// one row a label.
func TestReranker(t *testing.T) {
	f := parse(t, generate(t, testmodel.Options{Rerank: true}))
	md := f.Metadata
	if got := f.Info(); got.Architecture != "qwen3" || got.Pooling != "rank" {
		t.Errorf("architecture %q, pooling %q; want qwen3, rank", got.Architecture, got.Pooling)
	}
	if got := md.String("tokenizer.chat_template.rerank"); got != testmodel.RerankTemplate {
		t.Errorf("rerank template %q, want %q", got, testmodel.RerankTemplate)
	}
	if v, ok := md.Lookup("qwen3.classifier.output_labels"); !ok || v.Len() != len(testmodel.RerankLabels) {
		t.Errorf("classifier labels %v, want %d", v, len(testmodel.RerankLabels))
	}
	var head []uint64
	for _, tn := range f.Tensors {
		if tn.Name == "cls.output.weight" {
			head = tn.Shape
		}
	}
	if diff := cmp.Diff([]uint64{64, uint64(len(testmodel.RerankLabels))}, head); diff != "" {
		t.Errorf("cls.output.weight shape (-want +got):\n%s", diff)
	}
	if plain := parse(t, generate(t, testmodel.Options{Arch: testmodel.Qwen3})); plain.Info().Pooling != "" {
		t.Errorf("a qwen3 model that is no reranker names pooling %q", plain.Info().Pooling)
	}
}
