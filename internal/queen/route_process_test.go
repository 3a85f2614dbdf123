//go:build !race

package queen

// End-to-end tests of routing: the real apiary binary as queen and hive,
// real workers on the generated test model, and the official OpenAI Go
// client as the user.

import (
	"cmp"
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	oai "github.com/openai/openai-go"
	"github.com/openai/openai-go/option"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/keeper"
	"github.com/apiary-llm/apiary/internal/testmodel"
)

// cluster is a queen and one hive, run as processes.
type cluster struct {
	t      *testing.T
	queen  *proc
	hive   *proc
	url    string
	client oai.Client
	admin  *keeper.Client
	dir    string // the hive's data directory (its models under models/)
}

// startCluster runs a queen (with extra flags) and a hive "node-1" with
// the test model and one-thread workers (llama.cpp's threads spin-wait:
// on a busy machine more threads than cores slow everything down).
func startCluster(t *testing.T, queenArgs []string, hiveArgs ...string) *cluster {
	t.Helper()
	return startClusterWith(t, clusterOptions{}, queenArgs, hiveArgs...)
}

// clusterOptions change startCluster's cluster.
type clusterOptions struct {
	model    testmodel.Options // of tiny.gguf
	apiToken string            // the queen's APIARY_API_TOKEN; the client sends it
	hiveEnv  []string          // added to the hive's environment
	// more are models besides tiny.gguf in the hive's models directory,
	// by name.
	more map[string]testmodel.Options
	// projectors are the models (by name) that get a vision projector
	// beside them (mmproj-NAME.gguf).
	projectors map[string]testmodel.ProjectorOptions
}

func startClusterWith(t *testing.T, o clusterOptions, queenArgs []string, hiveArgs ...string) *cluster {
	t.Helper()
	args := append([]string{"queen", "--addr", "127.0.0.1:0", "--flush-interval", "100ms", "--data-dir", t.TempDir()}, queenArgs...)
	// A queen with tokens has all three; the hive gets the cluster token.
	var env, hiveEnv []string
	adminToken, clusterToken := "", ""
	if o.apiToken != "" {
		adminToken, clusterToken = "admin-"+o.apiToken, "cluster-"+o.apiToken
		env = []string{"APIARY_API_TOKEN=" + o.apiToken, "APIARY_ADMIN_TOKEN=" + adminToken, "APIARY_CLUSTER_TOKEN=" + clusterToken}
		hiveEnv = []string{"APIARY_CLUSTER_TOKEN=" + clusterToken}
	}
	q := startProc(t, "queen", env, args...)
	rec, _ := q.logs.wait(t, 0, "queen serving", nil)
	qURL := "http://" + rec.Attrs["addr"]
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "models"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := testmodel.WriteFile(filepath.Join(dir, "models", "tiny.gguf"), o.model); err != nil {
		t.Fatal(err)
	}
	for name, opts := range o.more {
		if err := testmodel.WriteFile(filepath.Join(dir, "models", name+".gguf"), opts); err != nil {
			t.Fatal(err)
		}
	}
	for name, opts := range o.projectors {
		if err := testmodel.WriteProjectorFile(filepath.Join(dir, "models", "mmproj-"+name+".gguf"), opts); err != nil {
			t.Fatal(err)
		}
	}
	hargs := append([]string{"hive", "--addr", "127.0.0.1:0", "--queen", qURL, "--pool-id", "node-1", "--data-dir", dir,
		"--heartbeat-interval", "500ms", "--worker-ports", "23000-23999", "--worker-threads", "1"}, hiveArgs...)
	hive := startProc(t, "hive node-1", append(hiveEnv, o.hiveEnv...), hargs...)
	q.logs.wait(t, 0, "pool status changed", map[string]string{"pool_id": "node-1", "to": "healthy"})
	c := &cluster{t: t, queen: q, hive: hive, url: qURL, dir: dir, admin: keeper.NewClient(qURL, adminToken, clusterToken),
		client: oai.NewClient(option.WithBaseURL(qURL+"/v1/"), option.WithAPIKey(cmp.Or(o.apiToken, "unused")), option.WithMaxRetries(0))}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("queen logs:\n%s", q.logs.String())
			t.Logf("hive logs:\n%s", hive.logs.String())
		}
		if err := hive.stop(t, syscall.SIGTERM); err != nil {
			t.Errorf("hive exit: %v", err)
		}
		if err := q.stop(t, syscall.SIGTERM); err != nil {
			t.Errorf("queen exit: %v", err)
		}
	})
	return c
}

// completion is the greedy completion request of n tokens.
func completion(n int) oai.CompletionNewParams {
	return oai.CompletionNewParams{Model: "tiny", Prompt: oai.CompletionNewParamsPromptUnion{OfString: oai.String("Once upon a time")},
		MaxTokens: oai.Int(int64(n)), Temperature: oai.Float(0)}
}

var ignoreEOS = option.WithJSONSet("ignore_eos", true)

// streamed is what one streamed completion gave.
type streamed struct {
	text   string
	chunks int
	tokens int64         // completion tokens, from the usage chunk
	worker string        // X-Apiary-Worker
	ttft   time.Duration // request to first chunk
	err    error
}

// stream runs a streamed completion; first, when not nil, is closed at
// its first chunk.
func (c *cluster) stream(ctx context.Context, params oai.CompletionNewParams, first chan struct{}, opts ...option.RequestOption) streamed {
	var resp *http.Response
	start := time.Now()
	params.StreamOptions = oai.ChatCompletionStreamOptionsParam{IncludeUsage: oai.Bool(true)}
	s := c.client.Completions.NewStreaming(ctx, params, append(opts, ignoreEOS, option.WithResponseInto(&resp))...)
	defer s.Close()
	var out streamed
	var b strings.Builder
	for s.Next() {
		if out.chunks == 0 {
			out.ttft = time.Since(start)
			if first != nil {
				close(first)
			}
		}
		out.chunks++
		for _, ch := range s.Current().Choices {
			b.WriteString(ch.Text)
		}
		if u := s.Current().Usage; u.CompletionTokens > 0 {
			out.tokens = u.CompletionTokens
		}
	}
	out.text, out.err = b.String(), s.Err()
	if resp != nil {
		out.worker = resp.Header.Get(api.WorkerHeader)
	}
	return out
}

// rows returns the lifecycle rows.
func (c *cluster) rows() []api.LifecycleRow {
	c.t.Helper()
	rows, err := c.admin.Workers(context.Background(), keeper.WorkerFilter{})
	if err != nil {
		c.t.Fatal(err)
	}
	return rows
}

// metric returns the value of the queen's first /metrics line that starts
// with prefix.
func (c *cluster) metric(prefix string) string {
	c.t.Helper()
	resp, err := http.Get(c.url + "/metrics")
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, prefix) {
			return line[strings.LastIndexByte(line, ' ')+1:]
		}
	}
	return ""
}

// The first request finds no worker: the controller places one (a queen
// row), the request waits and is served; the next one reuses the worker.
// The chat endpoint streams token by token through the queen.
func TestProcessColdStartThenWarm(t *testing.T) {
	c := startCluster(t, nil)
	ctx := t.Context()
	chat := oai.ChatCompletionNewParams{Model: "tiny", Messages: []oai.ChatCompletionMessageParamUnion{oai.UserMessage("Say hello.")},
		MaxCompletionTokens: oai.Int(16), Temperature: oai.Float(0),
		StreamOptions: oai.ChatCompletionStreamOptionsParam{IncludeUsage: oai.Bool(true)}}
	start := time.Now()
	var resp *http.Response
	s := c.client.Chat.Completions.NewStreaming(ctx, chat, ignoreEOS, option.WithResponseInto(&resp))
	var acc oai.ChatCompletionAccumulator
	chunks := 0
	var ttft time.Duration
	for s.Next() {
		if chunks == 0 {
			ttft = time.Since(start)
		}
		chunks++
		acc.AddChunk(s.Current())
	}
	if err := s.Err(); err != nil {
		t.Fatalf("cold chat stream: %v", err)
	}
	s.Close()
	if chunks < 4 || acc.Usage.CompletionTokens != 16 || acc.Choices[0].FinishReason != "length" || acc.Choices[0].Message.Content == "" {
		t.Fatalf("cold chat: %d chunks, %+v", chunks, acc.Choices)
	}
	cold := resp.Header.Get(api.WorkerHeader)
	rows := c.rows()
	if len(rows) != 1 || rows[0].ID != cold || rows[0].Owner != OwnerQueen || rows[0].Status != "RUNNING" {
		t.Fatalf("rows after the cold start: %+v (served by %s)", rows, cold)
	}
	t.Logf("cold start: first chunk after %s", ttft.Round(time.Millisecond))

	warm := c.stream(ctx, completion(24), nil)
	if warm.err != nil || warm.worker != cold || warm.tokens != 24 || warm.chunks < 4 {
		t.Fatalf("warm request: %+v, want it served by %s", warm, cold)
	}
	whole, err := c.client.Completions.New(ctx, completion(24), ignoreEOS)
	if err != nil || whole.Choices[0].Text != warm.text || whole.Usage.CompletionTokens != 24 {
		t.Fatalf("whole answer %+v %v, want the streamed %q", whole, err, warm.text)
	}
	t.Logf("warm: first chunk after %s", warm.ttft.Round(time.Millisecond))
	if n := len(c.rows()); n != 1 {
		t.Errorf("%d rows after warm requests, want 1", n)
	}
	page, err := c.client.Models.List(ctx)
	if err != nil || len(page.Data) != 1 || page.Data[0].ID != "tiny" {
		t.Errorf("models: %+v %v", page, err)
	}
	if got := c.metric(`apiary_queen_placements_total{model="tiny",result="started"}`); got != "1" {
		t.Errorf("placements %q", got)
	}
	if got := c.metric(`apiary_queen_time_to_first_token_seconds_count{model="tiny"}`); got != "2" {
		t.Errorf("TTFT observations %q, want 2", got)
	}
}

// Requests for a model no pool has are 404 model_not_found.
func TestProcessUnknownModel(t *testing.T) {
	c := startCluster(t, nil)
	params := completion(4)
	params.Model = "no-such-model"
	_, err := c.client.Completions.New(t.Context(), params)
	var apiErr *oai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound || apiErr.Code != "model_not_found" || apiErr.Param != "model" {
		t.Fatalf("unknown model: %v", err)
	}
	if rows := c.rows(); len(rows) != 0 {
		t.Errorf("rows %+v: nothing should be placed", rows)
	}
}

// Four concurrent streams with one slot per worker and up to two workers:
// the queue's wait places a second worker, and the streams are spread
// over both. The streams are held (the workers' test knob) until the
// second worker is ready, so that they still wait then on any CPU.
func TestProcessConcurrentStreamsAcrossTwoWorkers(t *testing.T) {
	h := newHolds(t)
	c := startClusterWith(t, clusterOptions{hiveEnv: h.env()}, []string{"--max-workers", "2", "--scale-up-after", "100ms"}, h.hiveArgs()...)
	ctx := t.Context()
	var wg sync.WaitGroup
	results := make([]streamed, 4)
	h.hold("tiny")
	for i := range results {
		wg.Go(func() { results[i] = c.stream(ctx, completion(64), nil) })
	}
	_, next := c.queen.logs.wait(t, 0, "lifecycle row changed", map[string]string{"to": "RUNNING"})
	c.queen.logs.wait(t, next, "lifecycle row changed", map[string]string{"to": "RUNNING"})
	h.release("tiny")
	wg.Wait()
	workers := map[string]int{}
	for i, r := range results {
		if r.err != nil || r.tokens != 64 || r.text != results[0].text {
			t.Errorf("stream %d: %d chunks, %v", i, r.chunks, r.err)
		}
		workers[r.worker]++
	}
	if len(workers) != 2 {
		t.Errorf("streams by worker %v, want both workers used", workers)
	}
	rows := c.rows()
	if len(rows) != 2 || rows[0].Owner != OwnerQueen || rows[1].Owner != OwnerQueen {
		t.Errorf("rows %+v, want two queen-placed workers", rows)
	}
	var audit []string
	entries, err := c.admin.Audit(ctx, "", 100)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Action == "worker.start" {
			audit = append(audit, strings.SplitN(e.Reason, ",", 2)[0])
		}
	}
	if !slices.ContainsFunc(audit, func(r string) bool { return strings.HasPrefix(r, "demand: ") }) || len(audit) != 2 {
		t.Errorf("start reasons %q", audit)
	}
	if got := c.metric(`apiary_queen_placements_total{model="tiny",result="started"}`); got != "2" {
		t.Errorf("placements %q, want 2", got)
	}
}

// A session keeps its worker: with two workers, each of two sessions
// stays on the worker that served its first request, waiting for it when
// it is busy rather than going to the free one.
func TestProcessSessionAffinity(t *testing.T) {
	h := newHolds(t)
	c := startClusterWith(t, clusterOptions{hiveEnv: h.env()}, []string{"--affinity-ttl", "1m", "--log-level", "debug"}, h.hiveArgs()...)
	ctx := t.Context()
	var ids []string
	for range 2 {
		row, err := c.admin.StartWorker(ctx, "tiny", "node-1", nil, "affinity test")
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, row.LifecycleID)
		h.hold("tiny@" + row.LifecycleID) // each worker holds its streams until let go
	}
	_, next := c.queen.logs.wait(t, 0, "lifecycle row changed", map[string]string{"to": "RUNNING"})
	c.queen.logs.wait(t, next, "lifecycle row changed", map[string]string{"to": "RUNNING"})

	session := func(id string) option.RequestOption { return option.WithHeader(api.SessionHeader, id) }
	// a's first request holds one worker (the test knob keeps it busy,
	// however fast the CPU) while b's first goes to the other, let go.
	var a1 streamed
	var wg sync.WaitGroup
	var aResp *http.Response
	p := completion(32)
	p.StreamOptions = oai.ChatCompletionStreamOptionsParam{IncludeUsage: oai.Bool(true)}
	as := c.client.Completions.NewStreaming(ctx, p, session("a"), ignoreEOS, option.WithResponseInto(&aResp))
	defer as.Close()
	if !as.Next() {
		t.Fatalf("a's first request: no first chunk: %v", as.Err())
	}
	wg.Go(func() {
		for as.Next() {
			if u := as.Current().Usage; u.CompletionTokens > 0 {
				a1.tokens = u.CompletionTokens
			}
		}
		a1.err = as.Err()
	})
	aWorker := aResp.Header.Get(api.WorkerHeader)
	a1.worker = aWorker
	if !slices.Contains(ids, aWorker) {
		t.Fatalf("a's first request went to %q, not one of %v", aWorker, ids)
	}
	for _, id := range ids {
		if id != aWorker {
			h.release("tiny@" + id)
		}
	}
	b1 := c.stream(ctx, completion(8), nil, session("b"))
	// While a's first stream still runs on its worker, a's second request
	// waits for it although b's worker is free.
	var a2 streamed
	a2Done := make(chan struct{})
	wg.Go(func() { defer close(a2Done); a2 = c.stream(ctx, completion(8), nil, session("a")) })
	c.queen.logs.wait(t, 0, "request queued", map[string]string{"model_ref": "tiny"})
	select {
	case <-a2Done:
		t.Fatalf("a's second request was answered while its worker was busy: %+v", a2)
	default:
	}
	h.release("tiny@" + aWorker)
	wg.Wait()
	b2 := c.stream(ctx, completion(8), nil, session("b"))
	for name, r := range map[string]streamed{"a1": a1, "b1": b1, "a2": a2, "b2": b2} {
		if r.err != nil || r.worker == "" {
			t.Fatalf("%s: %+v", name, r)
		}
	}
	if a1.worker == b1.worker || a2.worker != a1.worker || b2.worker != b1.worker {
		t.Errorf("workers: a %s then %s, b %s then %s", a1.worker, a2.worker, b1.worker, b2.worker)
	}
	if hit, miss := c.metric(`apiary_queen_affinity_total{result="hit"}`), c.metric(`apiary_queen_affinity_total{result="miss"}`); hit != "2" || miss != "2" {
		t.Errorf("affinity hits %q misses %q, want 2 and 2", hit, miss)
	}
}

// kill -9 of the worker in the middle of a stream: the client's stream
// ends with an error within a second, the row is FAILED, and the next
// request is served by a new worker.
func TestProcessWorkerKilledMidStream(t *testing.T) {
	h := newHolds(t)
	c := startClusterWith(t, clusterOptions{hiveEnv: h.env()}, nil, h.hiveArgs()...)
	ctx := t.Context()
	if r := c.stream(ctx, completion(4), nil); r.err != nil {
		t.Fatalf("cold request: %v", r.err)
	}
	rows := c.rows()
	if len(rows) != 1 || rows[0].PID == nil {
		t.Fatalf("rows %+v", rows)
	}
	victim := rows[0]

	// Held after its first token (the test knob), the stream is still
	// under way when its worker is killed, however fast the CPU.
	h.hold("tiny@" + victim.ID)
	var resp *http.Response
	s := c.client.Completions.NewStreaming(ctx, completion(1800), ignoreEOS, option.WithResponseInto(&resp))
	defer s.Close()
	if !s.Next() {
		t.Fatalf("no first chunk: %v", s.Err())
	}
	killed := time.Now()
	if err := syscall.Kill(*victim.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	n := 0
	for s.Next() {
		n++
	}
	took := time.Since(killed)
	if err := s.Err(); err == nil || !strings.Contains(err.Error(), "worker_failed") {
		t.Fatalf("stream after kill -9 (%d more chunks): err %v, want a worker_failed error event", n, err)
	}
	t.Logf("stream ended with an error event %s after kill -9", took.Round(time.Millisecond))
	if took > time.Second {
		t.Errorf("error event %s after the kill, want within 1s", took)
	}
	rec, _ := c.queen.logs.wait(t, 0, "lifecycle row changed", map[string]string{"lifecycle_id": victim.ID, "to": "FAILED"})
	t.Logf("row FAILED: %s", rec.Attrs["reason"])

	after := c.stream(ctx, completion(8), nil)
	if after.err != nil || after.worker == "" || after.worker == victim.ID {
		t.Fatalf("request after the kill: %+v", after)
	}
}

// One slot, a queue of one: a third request is refused with 429 and
// Retry-After, and a queued request that waits past the queue timeout
// gets 504. The test holds the long stream (the workers' test knob) until
// both answers came, then lets it finish whole.
func TestProcessQueueFullAndTimeout(t *testing.T) {
	h := newHolds(t)
	c := startClusterWith(t, clusterOptions{hiveEnv: h.env()}, []string{"--queue-size", "1", "--queue-timeout", "500ms", "--log-level", "debug"}, h.hiveArgs()...)
	ctx := t.Context()
	if _, err := c.admin.StartWorker(ctx, "tiny", "node-1", nil, "queue test"); err != nil {
		t.Fatal(err)
	}
	c.queen.logs.wait(t, 0, "lifecycle row changed", map[string]string{"to": "RUNNING"})
	first := make(chan struct{})
	var long streamed
	var wg sync.WaitGroup
	longDone := make(chan struct{})
	h.hold("tiny")
	wg.Go(func() {
		defer close(longDone)
		long = c.stream(ctx, completion(64), first)
	})
	select {
	case <-first:
	case <-longDone:
		t.Fatalf("the long stream ended before its first chunk: %v", long.err)
	}
	queued := make(chan error, 1)
	go func() {
		_, err := c.client.Completions.New(ctx, completion(4), ignoreEOS)
		queued <- err
	}()
	c.queen.logs.wait(t, 0, "request queued", map[string]string{"model_ref": "tiny", "queued": "1"})

	var resp *http.Response
	_, err := c.client.Completions.New(ctx, completion(4), ignoreEOS, option.WithResponseInto(&resp))
	var apiErr *oai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusTooManyRequests || apiErr.Code != "queue_full" ||
		apiErr.Response.Header.Get("Retry-After") == "" {
		t.Errorf("request beyond the queue: %v", err)
	}
	err = <-queued
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusGatewayTimeout || apiErr.Code != "queue_timeout" {
		t.Errorf("queued request: %v, want 504 queue_timeout", err)
	}
	select {
	case <-longDone:
		t.Errorf("the held stream ended before the test let it: %+v", long)
	default:
	}
	h.release("tiny")
	wg.Wait()
	if long.err != nil || long.tokens != 64 {
		t.Errorf("the long stream: %d tokens, %v; want all 64", long.tokens, long.err)
	}
	if got := c.metric(`apiary_queen_queue_rejected_total{model="tiny",reason="queue_full"}`); got != "1" {
		t.Errorf("queue_full count %q", got)
	}
	if got := c.metric(`apiary_queen_queue_rejected_total{model="tiny",reason="timeout"}`); got != "1" {
		t.Errorf("timeout count %q", got)
	}
}
