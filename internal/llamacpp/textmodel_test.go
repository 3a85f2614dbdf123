package llamacpp_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/apiary-llm/apiary/internal/engine"
	"github.com/apiary-llm/apiary/internal/llamacpp"
	"github.com/apiary-llm/apiary/internal/testmodel"
)

// The test model `apiary models testmodel` writes by default (a text
// model) answers in words, whatever the sampler: greedy, and temperature
// sampling over the whole vocabulary (no top-k, top-p or min-p to cut the
// unlikely tokens off) at 1 and 2, with several seeds, in every
// architecture. The byte-level model answers mostly in byte tokens, which
// are no text: the demo's answer was "�I��W7" (issue #34).
func TestTextModelWritesOnlyWords(t *testing.T) {
	for _, arch := range testmodel.Archs() {
		t.Run(string(arch), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "text.gguf")
			if err := testmodel.WriteFile(path, testmodel.Options{Arch: arch, Text: true}); err != nil {
				t.Fatal(err)
			}
			e, err := llamacpp.Load(context.Background(), engine.Options{ModelPath: path, CtxSize: 512, Slots: 1, Threads: 1, GPUDevice: -1}, nil)
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			defer e.Close()
			// A prompt with a newline and characters outside ASCII: byte
			// tokens in the prompt, as in a chat template's.
			p := prompt(t, e, "Say hello to the bees.\nÀ bientôt 🐝\n")
			words := 0
			for _, s := range []struct {
				temp float32
				seed uint32
			}{{0, 0}, {1, 1}, {1, 2}, {1, 3}, {2, 4}, {2, 5}} {
				var b strings.Builder
				if _, err := e.Generate(t.Context(), engine.Request{Prompt: p, MaxTokens: 48, Temperature: s.temp, Seed: s.seed}, func(tok engine.Token) error {
					if piece := string(tok.Piece); !isWord(piece) && piece != "," && piece != "." {
						return fmt.Errorf("token %d %q is not a word, \",\" or \".\"", tok.ID, piece)
					}
					b.Write(tok.Piece)
					words++
					return nil
				}); err != nil {
					t.Fatalf("temperature %g, seed %d: after %q: %v", s.temp, s.seed, b.String(), err)
				}
				if !utf8.ValidString(b.String()) {
					t.Errorf("temperature %g, seed %d: %q is not UTF-8", s.temp, s.seed, b.String())
				}
			}
			if words < 6*8 {
				t.Errorf("%d tokens in 6 answers: want answers of some length (end of text is one token of many)", words)
			}
		})
	}
}

// isWord reports whether piece is a space and two or more lowercase
// letters: one of the text model's words.
func isWord(piece string) bool {
	w, ok := strings.CutPrefix(piece, " ")
	return ok && len(w) >= 2 && strings.Trim(w, "abcdefghijklmnopqrstuvwxyz") == ""
}

// A text model's words never form from a prompt (none is a single letter,
// and "▁" with a letter is no token): it tokenizes any prompt as the
// byte-level model does, to the same ids.
func TestTextModelTokenizesAsTheByteLevelModel(t *testing.T) {
	tokenize := func(o testmodel.Options, text string) []int {
		t.Helper()
		path := filepath.Join(t.TempDir(), "m.gguf")
		if err := testmodel.WriteFile(path, o); err != nil {
			t.Fatal(err)
		}
		e, err := llamacpp.Load(context.Background(), engine.Options{ModelPath: path, CtxSize: 256, Slots: 1, Threads: 1, GPUDevice: -1}, nil)
		if err != nil {
			t.Fatalf("Load: %v", err)
		}
		defer e.Close()
		return prompt(t, e, text)
	}
	const text = "the queen of the hive, a bee.\nÀ bientôt 🐝 <0x0A> ▁the"
	if got, want := tokenize(testmodel.Options{Text: true}, text), tokenize(testmodel.Options{}, text); !slices.Equal(got, want) {
		t.Errorf("the text model tokenizes %q as %v, the byte-level model as %v", text, got, want)
	}
}
