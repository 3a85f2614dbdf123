package queen

// In-process tests of what bounds a batch and its requests (#32): a
// queen on SQLite or PostgreSQL, fake workers scripted by each test.

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	oai "github.com/openai/openai-go"
	"github.com/openai/openai-go/option"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/batch"
	"github.com/apiary-llm/apiary/internal/openai"
	"github.com/apiary-llm/apiary/internal/routing"
)

// scriptWorker is a fake worker whose answer to a chat request is
// answer(w, r, the first message's content); started receives each
// content as its request arrives, cancelled each one whose client went
// away before the answer was written.
type scriptWorker struct {
	*httptest.Server
	started, cancelled chan string
}

func newScriptWorker(t *testing.T, answer func(w http.ResponseWriter, r *http.Request, content string)) *scriptWorker {
	sw := &scriptWorker{started: make(chan string, 1024), cancelled: make(chan string, 1024)}
	sw.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			openai.WriteJSON(w, http.StatusOK, api.WorkerHealth{Status: "ready", Model: "tiny"})
			return
		}
		var req struct {
			Messages []struct {
				Content string `json:"content"`
			} `json:"messages"`
		}
		_ = json.NewDecoder(r.Body).Decode(&req)
		what := req.Messages[0].Content
		sw.started <- what
		answer(w, r, what)
		if r.Context().Err() != nil {
			sw.cancelled <- what
		}
	}))
	t.Cleanup(sw.Close)
	return sw
}

// chatAnswer writes a chat completion whose content is text.
func chatAnswer(w http.ResponseWriter, text string) {
	w.Header().Set("Content-Type", "application/json")
	data, _ := json.Marshal(text)
	_, _ = w.Write([]byte(`{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"tiny","choices":[{"index":0,"message":{"role":"assistant","content":` +
		string(data) + `},"finish_reason":"stop"}]}`))
}

// batchQueen is an in-process queen on SQLite whose one worker (two
// slots) is w, with an OpenAI client.
func batchQueen(t *testing.T, w *scriptWorker, mods ...func(*Config)) (*tq, oai.Client) {
	t.Helper()
	return batchQueenOn(t, backends[0], w, mods...)
}

// batchQueenOn is batchQueen on a fresh database of b.
func batchQueenOn(t *testing.T, b backend, w *scriptWorker, mods ...func(*Config)) (*tq, oai.Client) {
	t.Helper()
	dir, url := b.new(t)
	x, _ := routeQueen(t, map[string][]api.Model{"http://127.0.0.1:1": {tinyModel}}, append([]func(*Config){func(c *Config) {
		c.Routing = routing.Config{WorkerSlots: 2, MaxWorkers: 1, QueueTimeout: time.Minute}
		if url != "" {
			c.DatabaseURL = url
		} else {
			c.DataDir = dir
		}
	}}, mods...)...)
	x.registerAt("node-1", "http://127.0.0.1:1")
	x.readyWorker("node-1", w.URL)
	return x, oai.NewClient(option.WithBaseURL(x.url+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
}

// chatLines is a batch input of one chat request a content, custom_ids
// req-0 … .
func chatLines(contents ...string) string {
	var b strings.Builder
	for i, c := range contents {
		fmt.Fprintf(&b, `{"custom_id":"req-%d","method":"POST","url":"/v1/chat/completions","body":{"model":"tiny","messages":[{"role":"user","content":%q}]}}`+"\n", i, c)
	}
	return b.String()
}

// createBatch uploads content and creates a batch over it.
func createBatch(t *testing.T, client oai.Client, content string) (*oai.Batch, error) {
	t.Helper()
	f, err := upload(t, client, content)
	if err != nil {
		return nil, err
	}
	return client.Batches.New(t.Context(), oai.BatchNewParams{InputFileID: f.ID, Endpoint: oai.BatchNewParamsEndpointV1ChatCompletions,
		CompletionWindow: oai.BatchNewParamsCompletionWindow24h})
}

// Batches in progress share the slots: a batch created behind a large
// one has its first result long before the large one completes (the
// dispatcher once took the oldest batch's jobs until none was left).
func TestBatchesShareTheSlots(t *testing.T) {
	eachBackend(t, testBatchesShareTheSlots)
}

func testBatchesShareTheSlots(t *testing.T, be backend) {
	w := newScriptWorker(t, func(w http.ResponseWriter, r *http.Request, content string) {
		time.Sleep(5 * time.Millisecond)
		chatAnswer(w, "ok "+content)
	})
	x, client := batchQueenOn(t, be, w, func(c *Config) { c.Batch = batch.Config{Concurrency: 2} })
	const large = 80
	contents := make([]string, large)
	for i := range contents {
		contents[i] = fmt.Sprintf("large %d", i)
	}
	a, err := createBatch(t, client, chatLines(contents...))
	if err != nil {
		t.Fatal(err)
	}
	b, err := createBatch(t, client, chatLines("small 0", "small 1", "small 2"))
	if err != nil {
		t.Fatal(err)
	}
	x.logs.wait(t, 0, "job attempt ended", map[string]string{"batch_id": b.ID, "state": "succeeded"})
	now, err := client.Batches.Get(t.Context(), a.ID)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the small batch's first result came when the large one had %d of %d completed", now.RequestCounts.Completed, large)
	if now.Status != oai.BatchStatusInProgress || now.RequestCounts.Completed > large/2 {
		t.Errorf("the small batch's first result came when the large one was %s with %d of %d completed", now.Status, now.RequestCounts.Completed, large)
	}
	completedOnce(t, client, x.waitBatchEnd(t, client, b.ID), 3)
	completedOnce(t, client, x.waitBatchEnd(t, client, a.ID), large)
}
