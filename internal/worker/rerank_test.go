package worker

import (
	"bytes"
	"encoding/json"
	"math"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/apiary-llm/apiary/internal/openai"
	"github.com/apiary-llm/apiary/internal/testbin"
	"github.com/apiary-llm/apiary/internal/testmodel"
)

// rerankDocs are the documents the rerank tests rank.
var rerankDocs = []string{"Bees make honey in the hive.", "The stock market fell today.", "A queen lays the eggs."}

// postRerank posts body to url+path and decodes the answer or the error.
func postRerank(t *testing.T, url, path string, body any) (int, openai.RerankResponse, openai.ErrorResponse) {
	t.Helper()
	b, _ := json.Marshal(body)
	resp, err := http.Post(url+path, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var ok openai.RerankResponse
	var bad openai.ErrorResponse
	if resp.StatusCode == http.StatusOK {
		err = json.NewDecoder(resp.Body).Decode(&ok)
	} else {
		err = json.NewDecoder(resp.Body).Decode(&bad)
	}
	if err != nil {
		t.Fatalf("%s answer: %v", path, err)
	}
	return resp.StatusCode, ok, bad
}

// A reranker's worker answers POST /v1/rerank (and /rerank,
// /v1/reranking) with every document's score, the highest first, the same
// scores every time; top_n keeps the best, return_documents adds the
// texts. A model that is no reranker is refused 400.
func TestBinaryRerank(t *testing.T) {
	model := filepath.Join(t.TempDir(), "ranker.gguf")
	if err := testmodel.WriteFile(model, testmodel.Options{Rerank: true}); err != nil {
		t.Fatal(err)
	}
	_, url := startWorkerBinaryOn(t, model, nil)
	code, all, _ := postRerank(t, url, "/v1/rerank", map[string]any{"model": "ranker", "query": "Who makes honey?", "documents": rerankDocs, "return_documents": true})
	if code != http.StatusOK || all.Model != "ranker" || all.Object != "list" || len(all.Results) != len(rerankDocs) ||
		all.Usage.PromptTokens == 0 || all.Usage.TotalTokens != all.Usage.PromptTokens {
		t.Fatalf("rerank: %d %+v", code, all)
	}
	seen := map[int]bool{}
	for i, r := range all.Results {
		if i > 0 && r.RelevanceScore > all.Results[i-1].RelevanceScore {
			t.Errorf("results not sorted by score, highest first: %+v", all.Results)
		}
		if r.Index < 0 || r.Index >= len(rerankDocs) || seen[r.Index] || r.Document == nil || r.Document.Text != rerankDocs[r.Index] ||
			r.RelevanceScore <= 0 || r.RelevanceScore >= 1 {
			t.Errorf("result %d: %+v (document %+v), want each index once, its text, a probability", i, r, r.Document)
		}
		seen[r.Index] = true
	}
	for _, path := range []string{"/rerank", "/v1/reranking"} {
		code, top, _ := postRerank(t, url, path, map[string]any{"query": "Who makes honey?", "documents": rerankDocs, "top_n": 2})
		if code != http.StatusOK || len(top.Results) != 2 {
			t.Fatalf("%s with top_n 2: %d %+v", path, code, top)
		}
		for i, r := range top.Results {
			want := all.Results[i]
			want.Document = nil
			if r != want {
				t.Errorf("%s result %d: %+v, want %+v (the same score, no document)", path, i, r, want)
			}
		}
	}
	if code, _, bad := postRerank(t, url, "/v1/rerank", map[string]any{"query": "x", "documents": []string{}}); code != http.StatusBadRequest || errParam(bad) != "documents" {
		t.Errorf("no documents: %d %+v, want a 400 naming documents", code, bad)
	}

	_, plain := startWorkerBinary(t, nil)
	code, _, bad := postRerank(t, plain, "/v1/rerank", map[string]any{"model": "tiny", "query": "x", "documents": rerankDocs})
	if code != http.StatusBadRequest || bad.Error.Code != openai.CodeNotReranker || errParam(bad) != "model" ||
		!strings.Contains(bad.Error.Message, "not a reranker") {
		t.Errorf("rerank of a model that is none: %d %+v, want 400 %s saying it is not a reranker", code, bad, openai.CodeNotReranker)
	}
}

// errParam is the field an error answer names ("" for none).
func errParam(e openai.ErrorResponse) string {
	if e.Error.Param == nil {
		return ""
	}
	return *e.Error.Param
}

// The worker's rerank scores are llama-server's (--reranking, the same
// llama.cpp commit) on the same model and inputs, within 1e-3: the same
// pairs formatted the same way, the same rank pooling.
func TestRerankScoresAsLlamaServerDoes(t *testing.T) {
	server := testbin.LlamaServer(t)
	model := filepath.Join(t.TempDir(), "ranker.gguf")
	if err := testmodel.WriteFile(model, testmodel.Options{Rerank: true}); err != nil {
		t.Fatal(err)
	}
	_, worker := startWorkerBinaryOn(t, model, nil, "--ctx-size", "512")
	ls := testbin.StartLlamaServer(t, server, "-m", model, "-c", "512", "-t", "1", "--no-warmup", "--reranking")
	body := map[string]any{"model": "ranker", "query": "Who makes honey?", "documents": rerankDocs}
	code, got, bad := postRerank(t, worker, "/v1/rerank", body)
	if code != http.StatusOK {
		t.Fatalf("the worker: %d %+v", code, bad)
	}
	code, want, bad := postRerank(t, ls, "/v1/rerank", body)
	if code != http.StatusOK {
		t.Fatalf("llama-server: %d %+v", code, bad)
	}
	scores := func(r openai.RerankResponse) map[int]float64 {
		m := map[int]float64{}
		for _, x := range r.Results {
			m[x.Index] = x.RelevanceScore
		}
		return m
	}
	g, w := scores(got), scores(want)
	if len(g) != len(rerankDocs) || len(w) != len(rerankDocs) {
		t.Fatalf("scores of %d and %d documents, want %d: worker %+v, llama-server %+v", len(g), len(w), len(rerankDocs), got, want)
	}
	for i := range rerankDocs {
		if math.Abs(g[i]-w[i]) > 1e-3 {
			t.Errorf("document %d: the worker scores %v, llama-server %v", i, g[i], w[i])
		}
	}
}
