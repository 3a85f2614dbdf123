package queen

// In-process tests of what bounds a batch and its requests (#32): a
// queen on SQLite or PostgreSQL, fake workers scripted by each test.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
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
	"github.com/apiary-llm/apiary/internal/store"
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

// apiError is the status and message of the client's error.
func apiError(t *testing.T, err error) (int, string) {
	t.Helper()
	var ae *oai.Error
	if !errors.As(err, &ae) {
		t.Fatalf("want an API error, got %v", err)
	}
	return ae.StatusCode, ae.Message
}

// A batch's jobs are written a chunk a transaction while other writes go
// in between: the batch is listed as validating while its jobs are
// written, and admin writes sent all along the creation of a batch of
// 40 000 requests (10 000 under the race detector) each succeed, none
// waiting an eighth of the creation (a one-transaction creation held the
// write lock for most of it, seconds, and writes beside it failed
// "database is locked"; not timed under the race detector).
func TestBatchCreationLetsAdminWritesIn(t *testing.T) {
	x, _ := routeQueen(t, nil)
	client := oai.NewClient(option.WithBaseURL(x.url+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	n := 40000
	if raceDetector {
		n = 10000
	}
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
	if bt.RequestCounts.Total != int64(n) || bt.Status != oai.BatchStatusInProgress {
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
	// Under the race detector every step is many times slower, unevenly:
	// its timings say nothing of the chunks.
	if took := ended.Sub(began); slowest > took/8 && !raceDetector {
		t.Errorf("an admin write beside the creation took %s of the creation's %s: it waited for more than a chunk of jobs", slowest, took)
	}
	if got := x.audit(bt.ID); len(got) != 1 || got[0] != "batch.created" {
		t.Errorf("audit of the batch: %v", got)
	}
}

// A creation that fails once jobs were written (here: a file uploaded
// under a larger --batch-max-lines than the queen has now) leaves no
// batch and no job behind, and a creation the queen's end cut short
// (a batch still validating, some jobs written) is removed at the next
// start.
func TestBatchCreationCutShortLeavesNothing(t *testing.T) {
	dir := sqliteDir(t)
	x := startQueen(t, dir, "", func(c *Config) { c.Batch = batch.Config{MaxLines: 5000} })
	client := oai.NewClient(option.WithBaseURL(x.url+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	contents := make([]string, 3000)
	for i := range contents {
		contents[i] = fmt.Sprint(i)
	}
	f, err := upload(t, client, chatLines(contents...))
	if err != nil {
		t.Fatal(err)
	}
	x.q.Close()

	y := startQueen(t, dir, "", func(c *Config) { c.Batch = batch.Config{MaxLines: 2500} })
	client = oai.NewClient(option.WithBaseURL(y.url+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	_, err = client.Batches.New(t.Context(), oai.BatchNewParams{InputFileID: f.ID, Endpoint: oai.BatchNewParamsEndpointV1ChatCompletions,
		CompletionWindow: oai.BatchNewParamsCompletionWindow24h})
	if status, msg := apiError(t, err); status != http.StatusBadRequest || !strings.Contains(msg, "line 2501: the file holds more than 2500 requests") {
		t.Fatalf("creation past --batch-max-lines: %d %s", status, msg)
	}
	rec, _ := y.logs.wait(t, 0, "batch creation failed; what it wrote is removed", nil)
	gone := func(q *tq, id string) {
		t.Helper()
		err := q.q.st.View(t.Context(), func(tx *store.Tx) error {
			if _, err := tx.Batch(id); !errors.Is(err, store.ErrNotFound) {
				return fmt.Errorf("batch %s: %v, want it gone", id, err)
			}
			counts, err := tx.BatchJobCounts(id)
			if err == nil && len(counts) > 0 {
				err = fmt.Errorf("jobs of batch %s left: %v", id, counts)
			}
			return err
		})
		if err != nil {
			t.Error(err)
		}
	}
	gone(y, rec.Attrs["batch_id"])

	// A creation cut short: the batch validating, 3 jobs written.
	cut := store.Batch{ID: "batch_cut", Endpoint: "/v1/chat/completions", InputFileID: f.ID, CompletionWindow: "24h", Status: "validating",
		CreatedAt: time.Now(), ExpiresAt: time.Now().Add(24 * time.Hour)}
	if err := y.q.st.Update(t.Context(), func(tx *store.Tx) error {
		if err := tx.PutBatch(cut); err != nil {
			return err
		}
		var jobs []store.BatchJob
		for i := range 3 {
			jobs = append(jobs, store.BatchJob{BatchID: cut.ID, Line: i + 1, CustomID: fmt.Sprint(i), ModelRef: "tiny", Body: "{}", State: "queued", UpdatedAt: time.Now()})
		}
		return tx.PutBatchJobs(jobs)
	}); err != nil {
		t.Fatal(err)
	}
	y.q.Close()
	z := startQueen(t, dir, "")
	z.logs.wait(t, 0, "removed a batch whose creation the queen's end cut short; its client was never answered and may create it again",
		map[string]string{"batch_id": cut.ID})
	gone(z, cut.ID)
}

// The queen's limits refuse, each naming itself and its flag: a line
// past --max-body-bytes (400, its line), more requests than
// --batch-max-lines (400, the first line past it), more input files than
// --batch-max-files (429), more batches not ended than
// --batch-max-open-batches (429); once the open batch ends, another may
// be created.
func TestBatchLimitsRefuseNamingTheFlag(t *testing.T) {
	release := make(chan struct{})
	w := newScriptWorker(t, func(w http.ResponseWriter, r *http.Request, content string) {
		select { // held until the test lets the answers go
		case <-release:
			chatAnswer(w, "ok")
		case <-r.Context().Done():
		}
	})
	x, client := batchQueen(t, w, func(c *Config) {
		c.MaxBodyBytes = 4096
		c.Batch = batch.Config{MaxLines: 3, MaxFiles: 2, MaxOpenBatches: 1}
	})
	refused := func(what string, err error, status int, has ...string) {
		t.Helper()
		code, msg := apiError(t, err)
		if code != status {
			t.Errorf("%s: %d %q, want %d", what, code, msg, status)
		}
		for _, h := range has {
			if !strings.Contains(msg, h) {
				t.Errorf("%s: %q does not say %q", what, msg, h)
			}
		}
	}
	_, err := upload(t, client, chatLines("a", strings.Repeat("x", 5000), "c"))
	refused("a long line", err, http.StatusBadRequest, "line 2: the line is longer than 4096 bytes", "--max-body-bytes")
	_, err = upload(t, client, chatLines("a", "b", "c", "d"))
	refused("four lines", err, http.StatusBadRequest, "line 4: the file holds more than 3 requests", "--batch-max-lines")

	first, err := createBatch(t, client, chatLines("a", "b"))
	if err != nil {
		t.Fatal(err)
	}
	second, err := upload(t, client, chatLines("c"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = upload(t, client, chatLines("d"))
	refused("a third file", err, http.StatusTooManyRequests, "2 batch input files", "--batch-max-files")
	_, err = client.Batches.New(t.Context(), oai.BatchNewParams{InputFileID: second.ID, Endpoint: oai.BatchNewParamsEndpointV1ChatCompletions,
		CompletionWindow: oai.BatchNewParamsCompletionWindow24h})
	refused("a second batch", err, http.StatusTooManyRequests, "1 batches that have not ended", "--batch-max-open-batches")

	close(release)
	completedOnce(t, client, x.waitBatchEnd(t, client, first.ID), 2)
	if _, err := client.Batches.New(t.Context(), oai.BatchNewParams{InputFileID: second.ID, Endpoint: oai.BatchNewParamsEndpointV1ChatCompletions,
		CompletionWindow: oai.BatchNewParamsCompletionWindow24h}); err != nil {
		t.Fatalf("a batch once the open one ended: %v", err)
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

// An attempt past --batch-attempt-timeout is cancelled at its worker and
// its request fails (attempt_timeout), and an answer over
// --batch-max-answer-bytes is cut off and its request fails
// (answer_too_large); each once, no attempt tried again, the other
// requests served.
func TestBatchAttemptDeadlineAndAnswerBound(t *testing.T) {
	w := newScriptWorker(t, func(w http.ResponseWriter, r *http.Request, content string) {
		switch content {
		case "hang":
			<-r.Context().Done()
		case "big":
			chatAnswer(w, strings.Repeat("b", 8<<10))
		default:
			chatAnswer(w, "ok")
		}
	})
	x, client := batchQueen(t, w, func(c *Config) {
		c.Batch = batch.Config{AttemptTimeout: 500 * time.Millisecond, MaxAnswerBytes: 4096}
	})
	b, err := createBatch(t, client, chatLines("fine", "hang", "big"))
	if err != nil {
		t.Fatal(err)
	}
	// "big" may be seen cancelled too: the queen stops reading its answer
	// at the bound and closes the connection, which can reach the worker
	// before its handler returns.
	for {
		got := recv(t, w.cancelled, "the attempt cancelled at its deadline")
		if got == "hang" {
			break
		}
		if got != "big" {
			t.Fatalf("cancelled %q", got)
		}
	}
	end := x.waitBatchEnd(t, client, b.ID)
	if end.Status != oai.BatchStatusCompleted || end.RequestCounts.Completed != 1 || end.RequestCounts.Failed != 2 {
		t.Fatalf("batch: %s %+v", end.Status, end.RequestCounts)
	}
	errs := results(t, client, end.ErrorFileID)
	want := map[string]string{"req-1": "attempt_timeout", "req-2": "answer_too_large"}
	flag := map[string]string{"req-1": "--batch-attempt-timeout", "req-2": "--batch-max-answer-bytes"}
	for _, l := range errs {
		if l.Error == nil || l.Error.Code != want[l.CustomID] || !strings.Contains(l.Error.Message, flag[l.CustomID]) {
			t.Errorf("error line %s: %+v", l.CustomID, l.Error)
		}
		delete(want, l.CustomID)
	}
	if len(want) > 0 {
		t.Errorf("no error line for %v", want)
	}
	onceEach(t, 3, results(t, client, end.OutputFileID), errs)
	for _, what := range []string{"hang", "big"} {
		n := 0
		for len(w.started) > 0 {
			if <-w.started == what {
				n++
			}
		}
		if n > 1 {
			t.Errorf("%q was tried %d times", what, n)
		}
	}
}

// Cancelling a batch whose requests run on a worker that holds them
// cancels those requests at the worker and ends the batch cancelled
// within 5 s (it once waited for them to finish, however long).
func TestBatchCancelEndsRunningRequests(t *testing.T) {
	eachBackend(t, testBatchCancelEndsRunningRequests)
}

func testBatchCancelEndsRunningRequests(t *testing.T, be backend) {
	w := newScriptWorker(t, func(w http.ResponseWriter, r *http.Request, content string) {
		<-r.Context().Done() // a generation that would last
	})
	x, client := batchQueenOn(t, be, w)
	b, err := createBatch(t, client, chatLines("a", "b", "c"))
	if err != nil {
		t.Fatal(err)
	}
	recv(t, w.started, "first request")
	recv(t, w.started, "second request")
	at := time.Now()
	if _, err := client.Batches.Cancel(t.Context(), b.ID); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	for {
		got, err := client.Batches.Get(ctx, b.ID)
		if err != nil {
			t.Fatalf("the batch did not end cancelled within 5 s of the cancel: %v; logs:\n%s", err, x.logs.String())
		}
		if got.Status == oai.BatchStatusCancelled {
			t.Logf("cancelled %s after the cancel", time.Since(at).Round(time.Millisecond))
			if got.RequestCounts.Failed != 3 || got.RequestCounts.Completed != 0 {
				t.Errorf("counts %+v", got.RequestCounts)
			}
			onceEach(t, 3, results(t, client, got.OutputFileID), results(t, client, got.ErrorFileID))
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	recv(t, w.cancelled, "a running request cancelled at the worker")
	recv(t, w.cancelled, "the other running request cancelled at the worker")
}

// Batches created at once when one place is left: exactly one is
// created, the others are refused 429 (on PostgreSQL, two transactions
// that each added a batch and counted could both take the last place
// before the count was locked).
func TestBatchLastPlaceTakenOnce(t *testing.T) { eachBackend(t, testBatchLastPlaceTakenOnce) }

func testBatchLastPlaceTakenOnce(t *testing.T, be backend) {
	w := newScriptWorker(t, func(w http.ResponseWriter, r *http.Request, content string) {
		<-r.Context().Done() // the created batch stays open
	})
	x, client := batchQueenOn(t, be, w, func(c *Config) {
		c.Batch = batch.Config{MaxOpenBatches: 1, MaxFiles: 64}
	})
	defer func() {
		if t.Failed() {
			t.Logf("queen logs:\n%s", x.logs.String())
		}
	}()
	const n = 12
	files := make([]string, n)
	for i := range files {
		f, err := upload(t, client, chatLines(fmt.Sprint(i)))
		if err != nil {
			t.Fatal(err)
		}
		files[i] = f.ID
	}
	start := make(chan struct{})
	errs := make(chan error, n)
	for _, id := range files {
		go func() {
			<-start
			_, err := client.Batches.New(t.Context(), oai.BatchNewParams{InputFileID: id,
				Endpoint: oai.BatchNewParamsEndpointV1ChatCompletions, CompletionWindow: oai.BatchNewParamsCompletionWindow24h})
			errs <- err
		}()
	}
	close(start)
	created := 0
	for range n {
		err := <-errs
		if err == nil {
			created++
			continue
		}
		if code, msg := apiError(t, err); code != http.StatusTooManyRequests {
			t.Errorf("a creation past the bound: %d %s, want 429", code, msg)
		}
	}
	if created != 1 {
		t.Errorf("%d batches created with one place left, want 1", created)
	}
}
