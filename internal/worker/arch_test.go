package worker

import (
	"path/filepath"
	"regexp"
	"testing"

	"github.com/apiary-llm/apiary/internal/testbin"
	"github.com/apiary-llm/apiary/internal/testmodel"
)

// replacements is a run of U+FFFD.
var replacements = regexp.MustCompile("\uFFFD+")

// Every architecture `apiary models testmodel --arch` writes loads in the
// worker and generates exactly the greedy text of llama.cpp's own
// llama-server of the same source and commit, for two prompts. The
// random weights emit byte tokens that are no valid UTF-8; the two
// servers write such a run of bytes as different numbers of U+FFFD, so
// each run of U+FFFD counts as one (every valid character must match, in
// order, and the places of the invalid ones).
func TestArchitecturesGenerateAsLlamaServerDoes(t *testing.T) {
	server := testbin.LlamaServer(t)
	for _, arch := range testmodel.Archs() {
		t.Run(string(arch), func(t *testing.T) {
			model := filepath.Join(t.TempDir(), string(arch)+".gguf")
			if err := testmodel.WriteFile(model, testmodel.Options{Arch: arch}); err != nil {
				t.Fatal(err)
			}
			_, worker := startWorkerBinaryOn(t, model, nil, "--ctx-size", "512")
			ls := testbin.StartLlamaServer(t, server, "-m", model, "-c", "512", "-t", "1", "--no-warmup")
			for _, prompt := range []string{"Once upon a time", "The quick brown fox jumps over the lazy dog. 0123456789"} {
				got, want := greedy(t, worker, string(arch), prompt, 24, "the worker"), greedy(t, ls, string(arch), prompt, 24, "llama-server")
				if replacements.ReplaceAllString(got, "\uFFFD") != replacements.ReplaceAllString(want, "\uFFFD") {
					t.Errorf("%s, %q: worker %q, llama-server %q", arch, prompt, got, want)
				}
			}
		})
	}
}
