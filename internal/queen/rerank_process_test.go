//go:build !race

package queen

import (
	"bytes"
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/apiary-llm/apiary/internal/keeper"
	"github.com/apiary-llm/apiary/internal/openai"
	"github.com/apiary-llm/apiary/internal/testmodel"
)

// POST /v1/rerank (and /rerank, /v1/reranking) is routed like
// embeddings, with the API token: a worker of the reranker starts (by
// its configured name) and ranks three documents, the highest score
// first; top_n keeps the best, return_documents adds the texts. A model
// the hive lists without rank pooling is refused 400 by the queen, and no
// worker of it starts.
func TestProcessRerankThroughTheQueen(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "apiary.yaml")
	writeConfig(t, cfg, "models:\n  ranker:\n    file: rr\n")
	const token = "rerank-token-of-the-test"
	c := startClusterWith(t, clusterOptions{apiToken: token, more: map[string]testmodel.Options{"rr": {Rerank: true}}}, []string{"--config", cfg})
	docs := []string{"Bees make honey in the hive.", "The stock market fell today.", "A queen lays the eggs."}
	post := func(path, auth string, body any) (int, []byte) {
		t.Helper()
		b, _ := json.Marshal(body)
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, c.url+path, bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		if auth != "" {
			req.Header.Set("Authorization", "Bearer "+auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out bytes.Buffer
		out.ReadFrom(resp.Body)
		return resp.StatusCode, out.Bytes()
	}
	rank := func(path string, body map[string]any) openai.RerankResponse {
		t.Helper()
		code, b := post(path, token, body)
		var res openai.RerankResponse
		if err := json.Unmarshal(b, &res); code != http.StatusOK || err != nil {
			t.Fatalf("%s: %d %s (%v)", path, code, b, err)
		}
		return res
	}

	for _, path := range []string{"/v1/rerank", "/rerank", "/v1/reranking"} {
		if code, b := post(path, "", map[string]any{"model": "ranker", "query": "Who makes honey?", "documents": docs}); code != http.StatusUnauthorized {
			t.Errorf("%s without the API token: %d %s, want 401", path, code, b)
		}
	}
	all := rank("/v1/rerank", map[string]any{"model": "ranker", "query": "Who makes honey?", "documents": docs, "return_documents": true})
	if all.Model != "ranker" || all.Object != "list" || len(all.Results) != len(docs) || all.Usage.PromptTokens == 0 || all.Usage.TotalTokens != all.Usage.PromptTokens {
		t.Fatalf("rerank answer %+v", all)
	}
	seen := map[int]bool{}
	for i, r := range all.Results {
		if i > 0 && r.RelevanceScore > all.Results[i-1].RelevanceScore {
			t.Errorf("results not sorted by score, highest first: %+v", all.Results)
		}
		if r.Index < 0 || r.Index >= len(docs) || seen[r.Index] || r.Document == nil || r.Document.Text != docs[r.Index] {
			t.Errorf("result %d: %+v (document %+v), want each index once with its text", i, r, r.Document)
		}
		seen[r.Index] = true
	}
	for _, path := range []string{"/rerank", "/v1/reranking"} {
		top := rank(path, map[string]any{"model": "rr", "query": "Who makes honey?", "documents": docs, "top_n": 2})
		if top.Model != "rr" || len(top.Results) != 2 {
			t.Fatalf("%s with top_n 2: %+v", path, top)
		}
		for i, r := range top.Results {
			want := all.Results[i]
			want.Document = nil
			if r != want {
				t.Errorf("%s result %d: %+v, want %+v (the same score, no document)", path, i, r, want)
			}
		}
	}

	code, b := post("/v1/rerank", token, map[string]any{"model": "tiny", "query": "Who makes honey?", "documents": docs})
	var bad openai.ErrorResponse
	if err := json.Unmarshal(b, &bad); err != nil || code != http.StatusBadRequest || bad.Error.Code != openai.CodeNotReranker || !strings.Contains(bad.Error.Message, "not a reranker") {
		t.Errorf("rerank of a model that is none: %d %s, want 400 %s", code, b, openai.CodeNotReranker)
	}
	rows, err := c.admin.Workers(t.Context(), keeper.WorkerFilter{Model: "tiny"})
	if err != nil || len(rows) != 0 {
		t.Errorf("workers of tiny after its refused rerank: %+v (%v), want none", rows, err)
	}
}
