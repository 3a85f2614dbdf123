package queen

// In-process tests of what bounds a batch and its requests (#32): a
// queen on SQLite or PostgreSQL, fake workers scripted by each test.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
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

// A batch's jobs are written a chunk a transaction while other writes go
// in between: the batch is listed as validating while its jobs are
// written, and admin writes sent all along the creation of a batch of
// 40 000 requests each succeed, none waiting as long as the whole
// creation's writes (a one-transaction creation held the write lock for
// seconds, and writes beside it failed "database is locked").
func TestBatchCreationLetsAdminWritesIn(t *testing.T) {
	x, _ := routeQueen(t, nil)
	client := oai.NewClient(option.WithBaseURL(x.url+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	const n = 40000
	var b strings.Builder
	pad := strings.Repeat("p", 600)
	for i := range n {
		fmt.Fprintf(&b, `{"custom_id":"req-%d","method":"POST","url":"/v1/chat/completions","body":{"model":"nomodel","messages":[{"role":"user","content":"%s"}]}}`+"\n", i, pad)
	}
	f, err := upload(t, client, b.String())
	if err != nil {
		t.Fatal(err)
	}

	type write struct {
		status  int
		took    time.Duration
		endedAt time.Time
		body    string
	}
	var (
		mu         sync.Mutex
		writes     []write
		validating int // GET /v1/batches answers that listed it validating
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	hc := &http.Client{Timeout: waitLimit}
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			req, _ := http.NewRequest(http.MethodPut, x.url+"/api/admin/models/tiny", strings.NewReader(fmt.Sprintf(`{"min_workers":0,"reason":"write %d"}`, i)))
			req.Header.Set("Content-Type", "application/json")
			at := time.Now()
			resp, err := hc.Do(req)
			w := write{took: time.Since(at), endedAt: time.Now()}
			if err != nil {
				w.body = err.Error()
			} else {
				data, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				w.status, w.body = resp.StatusCode, string(data)
			}
			mu.Lock()
			writes = append(writes, w)
			mu.Unlock()
			time.Sleep(5 * time.Millisecond)
		}
	})
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			resp, err := hc.Get(x.url + "/v1/batches?limit=1")
			if err == nil {
				data, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if bytes.Contains(data, []byte(`"status":"validating"`)) {
					mu.Lock()
					validating++
					mu.Unlock()
				}
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
	time.Sleep(50 * time.Millisecond) // a few writes before, as a baseline
	began := time.Now()
	bt, err := client.Batches.New(t.Context(), oai.BatchNewParams{InputFileID: f.ID, Endpoint: oai.BatchNewParamsEndpointV1ChatCompletions,
		CompletionWindow: oai.BatchNewParamsCompletionWindow24h})
	ended := time.Now()
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if bt.RequestCounts.Total != n || bt.Status != oai.BatchStatusInProgress {
		t.Fatalf("created: %s, %+v", bt.Status, bt.RequestCounts)
	}
	during, slowest := 0, time.Duration(0)
	for _, w := range writes {
		if w.status != http.StatusOK {
			t.Errorf("an admin write beside the creation: %d %s", w.status, w.body)
		}
		if w.endedAt.After(began) && w.endedAt.Before(ended) {
			during++
			slowest = max(slowest, w.took)
		}
	}
	t.Logf("creation of %d requests: %s; %d admin writes ended during it, the slowest %s; listed validating %d times",
		n, ended.Sub(began).Round(time.Millisecond), during, slowest.Round(time.Millisecond), validating)
	if validating == 0 {
		t.Error("the batch was never listed as validating while its jobs were written")
	}
	if during < 3 {
		t.Errorf("only %d admin writes ended while the batch was created: they did not go in between", during)
	}
	if slowest > time.Second {
		t.Errorf("an admin write beside the creation took %s: it waited for more than a chunk of jobs", slowest)
	}
	if got := x.audit(bt.ID); len(got) != 1 || got[0] != "batch.created" {
		t.Errorf("audit of the batch: %v", got)
	}
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
