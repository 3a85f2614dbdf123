package queen

// Strikes through the real queen HTTP path: fake workers (httptest
// servers) that answer 500, a client error or 503, beside a worker that
// serves.

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/openai"
)

// steeredWorker answers /health ready and every inference request as its
// mode says: "500", "400" (an OpenAI client error), "503", or "ok".
type steeredWorker struct {
	*httptest.Server
	mu       sync.Mutex
	mode     string // guarded by mu
	requests int    // guarded by mu
}

func newSteeredWorker(t *testing.T, mode string) *steeredWorker {
	sw := &steeredWorker{mode: mode}
	sw.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			openai.WriteJSON(w, http.StatusOK, api.WorkerHealth{Status: "ready", Model: "tiny"})
			return
		}
		sw.mu.Lock()
		sw.requests++
		mode := sw.mode
		sw.mu.Unlock()
		switch mode {
		case "500":
			openai.WriteError(w, &openai.Error{Status: http.StatusInternalServerError, Code: "internal_error", Type: openai.TypeServer, Message: "the model is broken"})
		case "400":
			openai.WriteError(w, &openai.Error{Status: http.StatusBadRequest, Code: openai.CodeInvalidValue, Param: "prompt", Message: "prompt too long"})
		case "503":
			openai.WriteError(w, &openai.Error{Status: http.StatusServiceUnavailable, Code: "queue_full", Message: "full"})
		default:
			openai.WriteJSON(w, http.StatusOK, map[string]any{"object": "text_completion", "choices": []any{map[string]any{"text": "fine"}}})
		}
	}))
	t.Cleanup(sw.Close)
	return sw
}

func (sw *steeredWorker) set(mode string) {
	sw.mu.Lock()
	sw.mode = mode
	sw.mu.Unlock()
}

func (sw *steeredWorker) count() int {
	sw.mu.Lock()
	defer sw.mu.Unlock()
	return sw.requests
}

// complete sends a small completion and returns its status and worker.
func (x *tq) complete(t *testing.T) (int, string) {
	t.Helper()
	resp := x.post(t.Context(), "/v1/completions", `{"model":"tiny","prompt":"hi"}`)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get(api.WorkerHeader)
}

// A worker that answers 500 to every request: degraded after
// --strike-limit failures (audited; it gets no new requests, its health
// check readmits it, and each failure after degrades it again), stopped
// by the queen after 3 × --strike-limit (the admin stop path, actor
// queen); the clients are served by the other worker throughout.
func TestStrikesDegradeThenStopAWorkerThatFails(t *testing.T) {
	const limit = 2
	bad := newSteeredWorker(t, "500")
	good := newFakeWorker(t, tokens(1))
	x, _ := routeQueen(t, map[string][]api.Model{"http://hive-a": {tinyModel}}, func(c *Config) { c.Routing.StrikeLimit = limit })
	x.registerAt("a", "http://hive-a")
	badID := x.readyWorker("a", bad.URL) // worker-1: wins ties
	goodID := x.readyWorker("a", good.URL)
	badWorker := x.row(badID).WorkerID

	for range limit {
		if code, by := x.complete(t); code != http.StatusOK || by != goodID {
			t.Fatalf("answered %d by %s, want 200 by %s", code, by, goodID)
		}
	}
	x.logs.wait(t, 0, "worker degraded by the queen", map[string]string{"lifecycle_id": badID})
	if row := x.row(badID); row.Strikes == nil || row.Strikes.Failures < limit || row.Strikes.Limit != limit ||
		!strings.Contains(row.Strikes.LastError, "500") {
		t.Errorf("strikes of the degraded worker: %+v", row.Strikes)
	}
	if got := metricLine(x, `apiary_queen_worker_strikes_total{lifecycle_id="`+badID+`"}`); got != "2" {
		t.Errorf("strikes metric %q, want 2", got)
	}

	// Requests go on; the worker is readmitted after each health check and
	// degraded again by its next failure, until the queen stops it.
	sent := limit
	deadline := time.Now().Add(2 * waitLimit)
	var stopped string
	for stopped == "" {
		if time.Now().After(deadline) {
			t.Fatalf("no stop after %d requests; the bad worker got %d", sent, bad.count())
		}
		if code, by := x.complete(t); code != http.StatusOK || by != goodID {
			t.Fatalf("answered %d by %s, want 200 by %s", code, by, goodID)
		}
		sent++
		select {
		case stopped = <-x.hive.stopped:
		default:
		}
	}
	if stopped != badWorker {
		t.Fatalf("the queen stopped %s, want %s", stopped, badWorker)
	}
	x.logs.wait(t, 0, "lifecycle row changed", map[string]string{"lifecycle_id": badID, "to": "DRAINING"})
	// Exactly 3 × limit requests reached it: a degraded worker gets none.
	if bad.count() != 3*limit || sent <= 3*limit {
		t.Errorf("the bad worker got %d of %d requests, want %d", bad.count(), sent, 3*limit)
	}
	if row := x.row(badID); row.Status != "DRAINING" ||
		!strings.HasPrefix(row.Reason, "stopped by the queen: 6 failures in a row (3 × --strike-limit 2); last: worker answered 500") {
		t.Errorf("row %s %q", row.Status, row.Reason)
	}
	var audit api.AuditList
	x.ok("GET", "/api/admin/audit?target="+badID, nil, http.StatusOK, &audit)
	var actions []string
	for i := len(audit.Entries) - 1; i >= 0; i-- {
		e := audit.Entries[i]
		actions = append(actions, e.Action)
		switch e.Action {
		case "worker.degraded":
			if failures, _ := e.Metadata["failures"].([]any); e.Actor != "queen" || len(failures) != limit ||
				!strings.HasPrefix(e.Reason, "degraded by the queen: 2 relay failures in a row") {
				t.Errorf("worker.degraded entry: %+v", e)
			}
		case "worker.stop":
			if e.Actor != "queen" || !strings.HasPrefix(e.Reason, "stopped by the queen") {
				t.Errorf("worker.stop entry: %+v", e)
			}
		}
	}
	if want := "worker.start worker.spawned worker.running worker.degraded worker.stop"; strings.Join(actions, " ") != want {
		t.Errorf("audit of %s: %v, want %s", badID, actions, want)
	}
	// Its strikes go with its RUNNING row: the series is removed.
	x.logs.wait(t, 0, "strikes forgotten: the row is no longer RUNNING", map[string]string{"lifecycle_id": badID})
	if got := metricLine(x, `apiary_queen_worker_strikes_total{lifecycle_id="`+badID+`"}`); got != "" {
		t.Errorf("strikes series of an ended row: %q", got)
	}
	if got := metricLine(x, "apiary_queen_strike_stops_total"); got != "1" {
		t.Errorf("strike stops %q", got)
	}
	if got := metricLine(x, "apiary_queen_workers_degraded"); got != "0" {
		t.Errorf("degraded workers %q", got)
	}
	// The hive reports it stopped: the row ends.
	now := time.Now().UTC()
	x.event(api.WorkerEvent{PoolID: "a", WorkerID: badWorker, LifecycleID: badID, From: "draining", To: "stopped", Reason: "stopped", At: now,
		Worker: api.Worker{WorkerID: badWorker, LifecycleID: badID, ModelRef: "tiny", URI: bad.URL, Status: "stopped", PID: 1, StartedAt: now, StoppedAt: &now}})
	if row := x.row(badID); row.Status != "STOPPED" {
		t.Errorf("after the hive's event: %s", row.Status)
	}
	if code, by := x.complete(t); code != http.StatusOK || by != goodID || bad.count() != 3*limit {
		t.Errorf("after the stop: %d by %s, the bad worker got %d", code, by, bad.count())
	}
}

// A request a worker serves clears its strikes; a client error it
// rightly answers (400) or its "not now" (503) is no strike. A degraded
// worker that its health check readmits and that then serves a request
// has recovered (audited).
func TestStrikesClearedBySuccessNotCountedForClientErrors(t *testing.T) {
	flaky := newSteeredWorker(t, "500")
	good := newFakeWorker(t, tokens(1))
	x, _ := routeQueen(t, map[string][]api.Model{"http://hive-a": {tinyModel}}, func(c *Config) { c.Routing.StrikeLimit = 2 })
	x.registerAt("a", "http://hive-a")
	flakyID := x.readyWorker("a", flaky.URL) // worker-1: wins ties
	goodID := x.readyWorker("a", good.URL)

	if code, by := x.complete(t); code != http.StatusOK || by != goodID {
		t.Fatalf("500: answered %d by %s", code, by)
	}
	if s := x.row(flakyID).Strikes; s == nil || s.Failures != 1 || s.Degraded {
		t.Fatalf("after a 500: %+v", s)
	}
	flaky.set("ok")
	if code, by := x.complete(t); code != http.StatusOK || by != flakyID {
		t.Fatalf("ok: answered %d by %s", code, by)
	}
	if s := x.row(flakyID).Strikes; s != nil {
		t.Fatalf("after a success: %+v, want none", s)
	}
	flaky.set("400")
	for range 3 {
		if code, by := x.complete(t); code != http.StatusBadRequest || by != flakyID {
			t.Fatalf("400: answered %d by %s", code, by)
		}
	}
	flaky.set("503")
	for range 3 {
		if code, by := x.complete(t); code != http.StatusOK || by != goodID {
			t.Fatalf("503: answered %d by %s", code, by)
		}
	}
	if s := x.row(flakyID).Strikes; s != nil {
		t.Errorf("after client errors and 503s: %+v, want none", s)
	}
	if got := metricLine(x, `apiary_queen_worker_strikes_total{lifecycle_id="`+flakyID+`"}`); got != "1" {
		t.Errorf("strikes metric %q, want 1", got)
	}
	if got := x.audit(flakyID); strings.Join(got, " ") != "worker.start worker.spawned worker.running" {
		t.Errorf("audit %v", got)
	}

	// Degraded, readmitted by its health check, then a request it serves:
	// recovered (audited), its strikes cleared.
	flaky.set("500")
	for range 2 {
		if code, by := x.complete(t); code != http.StatusOK || by != goodID {
			t.Fatalf("500: answered %d by %s", code, by)
		}
	}
	x.logs.wait(t, 0, "worker degraded by the queen", map[string]string{"lifecycle_id": flakyID})
	flaky.set("ok")
	x.logs.wait(t, 0, "degraded worker readmitted: its health check answered", map[string]string{"lifecycle_id": flakyID})
	if code, by := x.complete(t); code != http.StatusOK || by != flakyID {
		t.Fatalf("after the readmission: answered %d by %s", code, by)
	}
	x.logs.wait(t, 0, "degraded worker recovered", map[string]string{"lifecycle_id": flakyID})
	if s := x.row(flakyID).Strikes; s != nil {
		t.Errorf("after the recovery: %+v, want none", s)
	}
	if got := x.audit(flakyID); strings.Join(got, " ") != "worker.start worker.spawned worker.running worker.degraded worker.recovered" {
		t.Errorf("audit %v", got)
	}
}
