// The batch tests' helpers, for the in-process tests and the process
// tests (built !race) alike.
package queen

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	oai "github.com/openai/openai-go"
)

// upload sends a batch input file with the official client.
func upload(t testing.TB, c oai.Client, content string) (*oai.FileObject, error) {
	t.Helper()
	return c.Files.New(t.Context(), oai.FileNewParams{File: oai.File(strings.NewReader(content), "batch.jsonl", "application/jsonl"),
		Purpose: oai.FilePurposeBatch})
}

// batchFile is a JSONL batch input of n chat requests of maxTokens each,
// custom_ids req-0 … req-(n-1).
func batchFile(n, maxTokens int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, `{"custom_id":"req-%d","method":"POST","url":"/v1/chat/completions","body":{"model":"tiny","messages":[{"role":"user","content":"Tell me about %d"}],"max_tokens":%d,"temperature":0,"ignore_eos":true}}`+"\n", i, i, maxTokens)
	}
	return b.String()
}

// completedOnce checks that an ended batch of n requests completed every
// one, each custom_id once in its output file.
func completedOnce(t *testing.T, client oai.Client, b *oai.Batch, n int) {
	t.Helper()
	if b.Status != oai.BatchStatusCompleted || b.RequestCounts.Completed != int64(n) || b.RequestCounts.Failed != 0 {
		t.Fatalf("ended batch: status %s, counts %+v, errors %+v", b.Status, b.RequestCounts, b.Errors)
	}
	out := results(t, client, b.OutputFileID)
	onceEach(t, n, out)
	for _, l := range out {
		if l.Response == nil || l.Response.StatusCode != http.StatusOK {
			t.Fatalf("result line: %+v", l)
		}
	}
}

// results downloads a file and parses its lines; "" gives none.
func results(t *testing.T, c oai.Client, fileID string) []resultLine {
	t.Helper()
	if fileID == "" {
		return nil
	}
	resp, err := c.Files.Content(t.Context(), fileID)
	if err != nil {
		t.Fatalf("download %s: %v", fileID, err)
	}
	defer resp.Body.Close()
	var out []resultLine
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var l resultLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("file %s: line %q: %v", fileID, sc.Text(), err)
		}
		out = append(out, l)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// resultLine is a line of an output or error file as a client reads it.
type resultLine struct {
	ID       string `json:"id"`
	CustomID string `json:"custom_id"`
	Response *struct {
		StatusCode int             `json:"status_code"`
		Body       json.RawMessage `json:"body"`
	} `json:"response"`
	Error *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// onceEach checks that the lines name every custom_id of n requests
// exactly once.
func onceEach(t *testing.T, n int, lines ...[]resultLine) {
	t.Helper()
	seen := map[string]int{}
	for _, ls := range lines {
		for _, l := range ls {
			seen[l.CustomID]++
		}
	}
	for i := range n {
		if id := fmt.Sprintf("req-%d", i); seen[id] != 1 {
			t.Errorf("custom_id %s has %d result lines, want 1", id, seen[id])
		}
		delete(seen, fmt.Sprintf("req-%d", i))
	}
	if len(seen) > 0 {
		t.Errorf("result lines of custom_ids not in the input: %v", seen)
	}
}

// newBatch uploads a batch input of n requests and creates its batch.
func newBatch(t testing.TB, client oai.Client, n, maxTokens int) string {
	t.Helper()
	f, err := upload(t, client, batchFile(n, maxTokens))
	if err != nil {
		t.Fatal(err)
	}
	b, err := client.Batches.New(t.Context(), oai.BatchNewParams{InputFileID: f.ID, Endpoint: oai.BatchNewParamsEndpointV1ChatCompletions,
		CompletionWindow: oai.BatchNewParamsCompletionWindow24h})
	if err != nil {
		t.Fatal(err)
	}
	return b.ID
}
