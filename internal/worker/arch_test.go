package worker

import (
	"bytes"
	"encoding/json"
	"net/http"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/apiary-llm/apiary/internal/testbin"
	"github.com/apiary-llm/apiary/internal/testmodel"
)

// replacements is a run of U+FFFD.
var replacements = regexp.MustCompile("\uFFFD+")

// greedyText asks the server at base (the worker or llama-server, both
// OpenAI-compatible) for n greedy tokens of prompt from model, past end
// of text.
func greedyText(t *testing.T, base, model, prompt string, n int) string {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": model, "prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": true})
	resp, err := http.Post(base+"/v1/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Choices []struct {
			Text string `json:"text"`
		} `json:"choices"`
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusOK || len(out.Choices) != 1 || out.Usage.CompletionTokens != n {
		t.Fatalf("%s: %d %+v %v", base, resp.StatusCode, out, err)
	}
	return out.Choices[0].Text
}

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
				got, want := greedyText(t, worker, string(arch), prompt, 24), greedyText(t, ls, string(arch), prompt, 24)
				if replacements.ReplaceAllString(got, "\uFFFD") != replacements.ReplaceAllString(want, "\uFFFD") {
					t.Errorf("%s, %q: worker %q, llama-server %q", arch, prompt, got, want)
				}
			}
		})
	}
}
