package queen

// In-process tests of failing fast: a request waits only for capacity
// that is coming; when no pool can serve its model now or soon it gets
// 503 no_capacity with every pool's reason at once, not a 504 at the
// queue timeout. The queue timeout is a minute here, so a pass proves the
// answer did not wait for it.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/openai"
	"github.com/apiary-llm/apiary/internal/routing"
)

// longQueue is the queue timeout of these tests; fastAnswer is the upper
// bound on an answer that must not wait for capacity (far below it).
const (
	longQueue  = time.Minute
	fastAnswer = 10 * time.Second
)

func longQueueConfig(c *Config) {
	c.Routing = routing.Config{QueueTimeout: longQueue, MaxWorkers: 1}
}

// answer is what a request got, and how long it took.
type answer struct {
	status     int
	code       string
	body       string
	retryAfter string
	took       time.Duration
}

// send posts a completion and reads the whole answer; it may run on a
// goroutine of its own (a failure is in the answer, not t.Fatal).
func (x *tq) send(ctx context.Context, body string) answer {
	start := time.Now()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, x.url+"/v1/completions", strings.NewReader(body))
	if err != nil {
		return answer{body: err.Error()}
	}
	resp, err := x.hc.Do(req)
	if err != nil {
		return answer{body: err.Error(), took: time.Since(start)}
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	a := answer{status: resp.StatusCode, body: string(data), retryAfter: resp.Header.Get("Retry-After"), took: time.Since(start)}
	var e openai.ErrorResponse
	if resp.StatusCode != http.StatusOK && json.Unmarshal(data, &e) == nil {
		a.code = e.Error.Code
	}
	return a
}

// noCapacity checks that a is a prompt 503 no_capacity whose message has
// each of want.
func noCapacity(t *testing.T, what string, a answer, want ...string) {
	t.Helper()
	if a.status != http.StatusServiceUnavailable || a.code != "no_capacity" || a.retryAfter == "" || a.took > fastAnswer {
		t.Errorf("%s: %d %s (Retry-After %q) after %s, want a 503 no_capacity within %s", what, a.status, a.body, a.retryAfter, a.took, fastAnswer)
		return
	}
	for _, w := range want {
		if !strings.Contains(a.body, w) {
			t.Errorf("%s: %s, want it to name %q", what, a.body, w)
		}
	}
	t.Logf("%s: 503 after %s: %s", what, a.took.Round(time.Millisecond), a.body)
}

// busyWorker is a fake worker whose streams hold their slot until
// released.
func busyWorker(t *testing.T) (*fakeWorker, func()) {
	release := make(chan struct{})
	fw := newFakeWorker(t, func(r *http.Request, send func(string) error, _ func()) {
		_ = send(`{"choices":[{"text":"a"}]}`)
		select {
		case <-release:
		case <-r.Context().Done():
		}
		_ = send("[DONE]")
	})
	return fw, sync.OnceFunc(func() { close(release) })
}

// holdSlot starts a stream on the only worker and returns once it began;
// the stream ends when the test does.
func (x *tq) holdSlot(t *testing.T) {
	resp := x.post(t.Context(), "/v1/completions", streamBody)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("busy stream: %d", resp.StatusCode)
	}
	t.Cleanup(func() { resp.Body.Close() })
}

// queue sends a request that must wait (the only slot is taken) and
// returns its answer's channel once it is queued (the test's first).
func (x *tq) queue(t *testing.T) <-chan answer {
	out := make(chan answer, 1)
	go func() { out <- x.send(context.Background(), `{"model":"tiny","prompt":"hi"}`) }()
	x.logs.wait(t, 0, "request queued", map[string]string{"model_ref": "tiny"})
	return out
}

func wait(t *testing.T, c <-chan answer) answer {
	t.Helper()
	select {
	case a := <-c:
		return a
	case <-time.After(waitLimit):
		t.Fatalf("no answer within %s", waitLimit)
		return answer{}
	}
}

// The only pool is drained while a request waits for its busy worker:
// drained means no new workers, and the running one serves on — the
// waiting request once its slot frees, and a new one; nothing is refused.
func TestRouteDrainedPoolKeepsServing(t *testing.T) {
	x, _ := routeQueen(t, map[string][]api.Model{"http://hive-a": {tinyModel}}, longQueueConfig)
	x.registerAt("a", "http://hive-a")
	fw, release := busyWorker(t)
	x.readyWorker("a", fw.URL)
	x.holdSlot(t)
	waiting := x.queue(t)

	x.ok("POST", "/v2/pools/a/drain", api.PoolAction{Reason: "maintenance"}, http.StatusOK, nil)
	select {
	case a := <-waiting:
		t.Fatalf("the waiting request was answered while the slot was taken: %+v", a)
	case <-time.After(300 * time.Millisecond):
	}
	release()
	if a := wait(t, waiting); a.status != http.StatusOK {
		t.Errorf("the request waiting when the pool was drained: %+v", a)
	}
	if a := x.send(t.Context(), `{"model":"tiny","prompt":"hi"}`); a.status != http.StatusOK {
		t.Errorf("a request after the drain: %+v", a)
	}
	if got := metricLine(x, `apiary_queen_queue_rejected_total{model="tiny",reason="no_capacity"}`); got != "" && got != "0" {
		t.Errorf("no_capacity count %q, want none", got)
	}
}

// The only pool's hive went silent (its lease ended; its worker's row is
// still RUNNING until the unhealthy grace): a waiting request and a new
// one get 503 no_capacity naming "unhealthy".
func TestRouteUnhealthyPoolAnswersNoCapacity(t *testing.T) {
	x, _ := routeQueen(t, map[string][]api.Model{"http://hive-a": {tinyModel}}, longQueueConfig, func(c *Config) {
		c.HeartbeatTimeout, c.UnhealthyGrace = 1500*time.Millisecond, time.Hour
	})
	x.registerAt("a", "http://hive-a")
	fw, release := busyWorker(t)
	defer release()
	lid := x.readyWorker("a", fw.URL)
	wid := x.row(lid).WorkerID
	ready := worker(wid, lid, "ready")
	ready.URI = fw.URL
	x.beat("a", ready) // the lease runs from here
	x.holdSlot(t)
	waiting := x.queue(t)

	x.logs.wait(t, 0, "pool status changed", map[string]string{"pool_id": "a", "to": "unhealthy"})
	noCapacity(t, "waiting when the pool went unhealthy", wait(t, waiting), "a: pool is unhealthy")
	noCapacity(t, "sent after", x.send(t.Context(), `{"model":"tiny","prompt":"hi"}`), "a: pool is unhealthy")
	if row := x.row(lid); row.Status != "RUNNING" {
		t.Errorf("row %s, want RUNNING still (the grace is an hour)", row.Status)
	}
}

// The hive refuses the start of the worker placed for a request: the
// request gets 503 no_capacity with the hive's reason, with Retry-After
// until the controller may place again.
func TestRoutePlacedWorkerRefusedByTheHive(t *testing.T) {
	x, mh := routeQueen(t, map[string][]api.Model{"http://hive-a": {tinyModel}}, longQueueConfig)
	x.registerAt("a", "http://hive-a")
	x.logs.wait(t, 0, "hive model list read", map[string]string{"pool_id": "a"})
	mh.set(&HiveError{Status: http.StatusInsufficientStorage, Code: "insufficient_memory", Message: "tiny needs 9 GiB, device 0 has 4 GiB"}, nil)
	a := x.send(t.Context(), `{"model":"tiny","prompt":"hi"}`)
	// The client reads the reason in words; the hive's own message is in
	// the queen's log.
	noCapacity(t, "refused start", a, "a: its hive has not enough memory for it")
	if strings.Contains(a.body, "9 GiB") {
		t.Errorf("the answer holds the hive's message: %s", a.body)
	}
	x.logs.wait(t, 0, "placement refused; placing again without the pool", map[string]string{"pool_id": "a"})
	if got := metricLine(x, `apiary_queen_placements_total{model="tiny",result="failed"}`); got != "1" {
		t.Errorf("failed placements %q", got)
	}
}

// The hive accepts the start but the worker fails while loading: the
// request waiting for it gets 503 no_capacity with the worker's failure;
// a request within the backoff gets the same answer without a new start.
func TestRoutePlacedWorkerFailsToStart(t *testing.T) {
	x, mh := routeQueen(t, map[string][]api.Model{"http://hive-a": {tinyModel}}, longQueueConfig)
	x.registerAt("a", "http://hive-a")
	out := make(chan answer, 1)
	go func() { out <- x.send(context.Background(), `{"model":"tiny","prompt":"hi"}`) }()
	var req api.StartWorkerRequest
	select {
	case req = <-mh.started:
	case <-time.After(waitLimit):
		t.Fatal("no worker placed")
	}
	x.logs.wait(t, 0, "worker placed on demand", map[string]string{"lifecycle_id": req.LifecycleID})
	row := x.row(req.LifecycleID)
	failed := time.Now()
	x.event(api.WorkerEvent{PoolID: "a", WorkerID: row.WorkerID, LifecycleID: req.LifecycleID, From: "starting", To: "failed",
		Reason: "exit status 1: cannot load tiny.gguf", At: failed.UTC(),
		Worker: api.Worker{WorkerID: row.WorkerID, LifecycleID: req.LifecycleID, ModelRef: "tiny", Status: "failed", PID: 1, StartedAt: failed.UTC()}})
	a := wait(t, out)
	// The client reads that it failed; the row, and the worker's exit
	// that names its file, are in the log (and the row's audit entries).
	want := "the worker placed for tiny on pool a failed to start"
	noCapacity(t, "waiting for the worker that failed", a, want)
	if strings.Contains(a.body, req.LifecycleID) || strings.Contains(a.body, "tiny.gguf") {
		t.Errorf("the answer holds the row or the worker's exit: %s", a.body)
	}
	x.logs.wait(t, 0, "a worker placed on demand failed to start", map[string]string{"lifecycle_id": req.LifecycleID, "reason": "exit status 1: cannot load tiny.gguf"})
	// Within the backoff (a second from the failure) a new request gets
	// the same reason without a new start.
	if time.Since(failed) < time.Second/2 {
		noCapacity(t, "within the backoff", x.send(t.Context(), `{"model":"tiny","prompt":"hi"}`), want)
		mh.fakeHive.mu.Lock()
		n := len(mh.fakeHive.starts)
		mh.fakeHive.mu.Unlock()
		if n != 1 {
			t.Errorf("%d starts, want 1", n)
		}
	}
}

// A worker that is starting is capacity that is coming: the request waits
// for it through several of the controller's rounds and is served.
func TestRouteWaitsForAStartingWorker(t *testing.T) {
	x, mh := routeQueen(t, map[string][]api.Model{"http://hive-a": {tinyModel}}, longQueueConfig)
	x.registerAt("a", "http://hive-a")
	fw := newFakeWorker(t, tokens(2))
	out := make(chan answer, 1)
	go func() { out <- x.send(context.Background(), streamBody) }()
	var req api.StartWorkerRequest
	select {
	case req = <-mh.started:
	case <-time.After(waitLimit):
		t.Fatal("no worker placed")
	}
	x.logs.wait(t, 0, "worker placed on demand", map[string]string{"lifecycle_id": req.LifecycleID})
	// The controller looks at the waiting request again each demandResync
	// (three rounds) and leaves it waiting for the starting worker.
	rounds := func() int {
		var n int
		fmt.Sscan(metricLine(x, "apiary_queen_controller_rounds_total"), &n)
		return n
	}
	for before, deadline := rounds(), time.Now().Add(waitLimit); rounds() < before+3; {
		select {
		case a := <-out:
			t.Fatalf("answered while the worker starts: %d %s", a.status, a.body)
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("the controller did not look again at the waiting request")
		}
	}
	x.workerReady("a", req.LifecycleID, x.row(req.LifecycleID).WorkerID, fw.URL)
	a := wait(t, out)
	if a.status != http.StatusOK || !strings.Contains(a.body, "[DONE]") {
		t.Errorf("request: %d %s, want it served by the started worker", a.status, a.body)
	}
}
