package queen

// In-process tests of replicas (apiary models scale): the controller
// keeps min_workers of a model live with no request waiting, replaces a
// worker that fails, and stops replacing quickly a model whose workers
// keep failing (a crash loop).

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/routing"
)

func intp(n int) *int { return &n }

// scale sets model's min (and max) workers; it must answer want.
func (x *tq) scale(model string, req api.ModelScaleRequest, want int) api.ModelSetting {
	x.t.Helper()
	var out api.ModelSetting
	if want != http.StatusOK {
		status, data := x.do("PUT", "/api/admin/models/"+model, x.cfg.Tokens.Admin, req)
		if status != want {
			x.t.Fatalf("PUT /api/admin/models/%s %+v: %d %s, want %d", model, req, status, data, want)
		}
		return out
	}
	x.ok("PUT", "/api/admin/models/"+model, req, http.StatusOK, &out)
	return out
}

func (x *tq) models() []api.ModelSetting {
	x.t.Helper()
	var out api.ModelSettingList
	x.ok("GET", "/api/admin/models", nil, http.StatusOK, &out)
	return out.Models
}

// nextStart waits for the controller's next start on the fake hive and
// for its row; it returns the lifecycle id.
func (x *tq) nextStart(mh *modelHive) string {
	x.t.Helper()
	select {
	case req := <-mh.started:
		x.logs.wait(x.t, 0, "worker placed on demand", map[string]string{"lifecycle_id": req.LifecycleID, "kind": "replica"})
		return req.LifecycleID
	case <-time.After(waitLimit):
		x.t.Fatalf("no worker placed within %s", waitLimit)
		return ""
	}
}

// failWorker reports the worker of row id failed with exit code code.
func (x *tq) failWorker(pool, id string, code int, why string) {
	x.t.Helper()
	row := x.row(id)
	now := time.Now().UTC()
	ack := x.event(api.WorkerEvent{PoolID: pool, WorkerID: row.WorkerID, LifecycleID: id, From: "starting", To: "failed", Reason: why, At: now,
		Worker: api.Worker{WorkerID: row.WorkerID, LifecycleID: id, ModelRef: "tiny", Status: "failed", PID: 1, StartedAt: now, ExitCode: &code}})
	if !ack.Applied {
		x.t.Fatalf("failed event not applied: %+v", ack)
	}
}

// min_workers 1 places a worker with no request; when it fails after
// serving, another is placed; settings are checked, listed and audited.
func TestReplicasPlacedWithoutRequestsAndReplaced(t *testing.T) {
	x, mh := routeQueen(t, map[string][]api.Model{"http://hive-a": {tinyModel}}, longQueueConfig)
	x.registerAt("a", "http://hive-a")
	for _, bad := range []struct {
		model string
		body  string
	}{
		{"tiny", `{"reason":"x"}`},                                 // min_workers missing
		{"tiny", `{"min_workers":-1,"reason":"x"}`},                // negative
		{"tiny", `{"min_workers":2,"max_workers":1,"reason":"x"}`}, // max below min
		{"tiny", `{"min_workers":1}`},                              // no reason
		{"tiny", `{"min_workers":1,"reason":"x","replicas":3}`},    // unknown field
		{"tiny", `{"min_workers":1001,"reason":"x"}`},              // above api.MaxReplicas
		{"..%2Fetc", `{"min_workers":1,"reason":"x"}`},             // not a model ref
	} {
		if status, data := x.do("PUT", "/api/admin/models/"+bad.model, "", bad.body); status != http.StatusBadRequest {
			t.Errorf("PUT %s %s: %d %s, want 400", bad.model, bad.body, status, data)
		}
	}
	if got := x.models(); len(got) != 0 {
		t.Fatalf("settings after bad requests: %+v", got)
	}

	set := x.scale("tiny", api.ModelScaleRequest{MinWorkers: intp(1), MaxWorkers: intp(2), Reason: "keep one warm"}, http.StatusOK)
	if set.MinWorkers != 1 || set.MaxWorkers == nil || *set.MaxWorkers != 2 || set.Reason != "keep one warm" {
		t.Errorf("PUT answered %+v", set)
	}
	// The log shows max_workers' value: it once showed the address of
	// the pointer that holds it (max_workers=0x1bfd9c828938).
	x.logs.wait(t, 0, "model scaled", map[string]string{"model_ref": "tiny", "min_workers": "1", "max_workers": "2"})
	first := x.nextStart(mh)
	fw := newFakeWorker(t, tokens(1))
	x.workerReady("a", first, x.row(first).WorkerID, fw.URL)
	if got := x.models(); len(got) != 1 || got[0].Model != "tiny" || got[0].Running != 1 || got[0].CrashLoop != nil {
		t.Errorf("settings with the replica running: %+v", got)
	}
	if acts := x.audit("model:tiny"); len(acts) != 1 || acts[0] != "model.scale" {
		t.Errorf("audit of model:tiny: %v", acts)
	}

	failed := time.Now()
	x.failWorker("a", first, 137, "signal: killed")
	second := x.nextStart(mh)
	t.Logf("replacement placed %s after the failure", time.Since(failed).Round(time.Millisecond))
	if second == first || x.row(second).Status != "STARTING" || x.row(first).Status != "FAILED" {
		t.Errorf("rows: first %s %s, second %s %s", first, x.row(first).Status, second, x.row(second).Status)
	}
	if acts := x.audit(second); len(acts) == 0 || acts[0] != "worker.start" {
		t.Errorf("audit of the replacement: %v", acts)
	}
	var entries api.AuditList
	x.ok("GET", "/api/admin/audit?target="+second+"&action=worker.start", nil, http.StatusOK, &entries)
	if len(entries.Entries) != 1 || entries.Entries[0].Metadata["demand"] != "replica" {
		t.Errorf("start entry of the replacement: %+v", entries.Entries)
	}

	// Scaled to 0: a worker that fails is not replaced.
	x.scale("tiny", api.ModelScaleRequest{MinWorkers: intp(0), Reason: "done"}, http.StatusOK)
	if rec, _ := x.logs.wait(t, 0, "model scaled", map[string]string{"model_ref": "tiny", "min_workers": "0"}); rec.Attrs["max_workers"] != "" {
		t.Errorf("scaled without max_workers, the log shows max_workers=%s", rec.Attrs["max_workers"])
	}
	x.workerReady("a", second, x.row(second).WorkerID, fw.URL)
	if acts := x.audit("model:tiny"); len(acts) != 2 {
		t.Errorf("audit of model:tiny after scaling down: %v", acts)
	}
}

// Workers that keep failing: the replacement waits 1s, then 2s; the
// third failure within the window is a crash loop, audited once with the
// exit codes, in /metrics and the listing; requests get 503 naming it;
// the next replacement waits the slow backoff, and a worker that serves
// for StableAfter ends the loop.
func TestReplicasCrashLoop(t *testing.T) {
	const slow, stable = 3 * time.Second, 300 * time.Millisecond
	x, mh := routeQueen(t, map[string][]api.Model{"http://hive-a": {tinyModel}}, func(c *Config) {
		c.Routing = routing.Config{QueueTimeout: longQueue, MaxWorkers: 1, CrashLoopFailures: 3, CrashLoopWindow: time.Minute,
			CrashLoopBackoff: slow, StableAfter: stable}
	})
	x.registerAt("a", "http://hive-a")
	x.scale("tiny", api.ModelScaleRequest{MinWorkers: intp(1), Reason: "crash loop test"}, http.StatusOK)
	var failedAt time.Time
	var gaps []time.Duration
	for i := range 3 {
		id := x.nextStart(mh)
		if i > 0 {
			gaps = append(gaps, time.Since(failedAt))
		}
		failedAt = time.Now()
		x.failWorker("a", id, 1, fmt.Sprintf("exit status 1: llama_model_load: error loading model (try %d)", i))
	}
	x.logs.wait(t, 0, "model in a crash loop: it is replaced only at the slow pace until a worker serves", map[string]string{"model_ref": "tiny"})
	t.Logf("replacement gaps before the crash loop: %v (backoff 1s, 2s)", gaps)
	for i, g := range gaps {
		if want := time.Second << i; g < want {
			t.Errorf("replacement %d came %s after the failure, before its backoff %s", i+1, g, want)
		}
	}

	if got := metricLine(x, `apiary_queen_model_crashloop{model="tiny"}`); got != "1" {
		t.Errorf("crash loop gauge %q, want 1", got)
	}
	models := x.models()
	if len(models) != 1 || models[0].CrashLoop == nil || models[0].CrashLoop.Failures != 3 || models[0].CrashLoop.LastExit == nil ||
		*models[0].CrashLoop.LastExit != 1 || !strings.Contains(models[0].CrashLoop.LastFailure, "try 2") {
		t.Errorf("listing in the crash loop: %+v", models)
	}
	a := x.send(t.Context(), `{"model":"tiny","prompt":"hi"}`)
	// The client reads the loop in words; the last failure (the worker's
	// exit) is the operator's, in the listing above and the log.
	noCapacity(t, "request in the crash loop", a, "model tiny is in a crash loop (3 failures within 1m0s; replaced every 3s)")

	// The slow retry, then a worker that serves.
	id := x.nextStart(mh)
	gap := time.Since(failedAt)
	t.Logf("replacement in the crash loop %s after the last failure (slow backoff %s)", gap.Round(time.Millisecond), slow)
	if gap < slow {
		t.Errorf("replacement in the crash loop after %s, before the slow backoff %s", gap, slow)
	}
	fw := newFakeWorker(t, tokens(1))
	x.workerReady("a", id, x.row(id).WorkerID, fw.URL)
	x.logs.wait(t, 0, "crash loop ended: a worker of the model served", map[string]string{"model_ref": "tiny"})
	if got := metricLine(x, `apiary_queen_model_crashloop{model="tiny"}`); got != "0" {
		t.Errorf("crash loop gauge after it ended %q, want 0", got)
	}

	var entries api.AuditList
	x.ok("GET", "/api/admin/audit?target=model:tiny&action=worker.crashloop", nil, http.StatusOK, &entries)
	if len(entries.Entries) != 1 {
		t.Fatalf("%d worker.crashloop entries, want 1: %+v", len(entries.Entries), entries.Entries)
	}
	e := entries.Entries[0]
	data, _ := json.Marshal(e.Metadata["failures"])
	var fails []struct {
		LifecycleID string `json:"lifecycle_id"`
		ExitCode    *int   `json:"exit_code"`
		Reason      string `json:"reason"`
	}
	if err := json.Unmarshal(data, &fails); err != nil || len(fails) != 3 || fails[2].ExitCode == nil || *fails[2].ExitCode != 1 ||
		!strings.Contains(fails[2].Reason, "try 2") || fails[0].LifecycleID == "" {
		t.Errorf("crash loop entry failures %s (%v)", data, err)
	}
	t.Logf("worker.crashloop: %s", e.Reason)
	if acts := x.audit("model:tiny"); !contains(acts, "worker.crashloop_ended") {
		t.Errorf("audit of model:tiny: %v", acts)
	}
}

// The settings are in the store: a queen started again on it has them
// and places the replica with no request.
func TestReplicasSettingsSurviveRestart(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		dir, url := b.new(t)
		models := map[string][]api.Model{"http://hive-a": {tinyModel}}
		x1 := startQueen(t, dir, url)
		x1.scale("tiny", api.ModelScaleRequest{MinWorkers: intp(1), MaxWorkers: intp(3), Reason: "before the restart"}, http.StatusOK)
		before := x1.models()
		x1.q.Close()

		var mh *modelHive
		x2 := startQueen(t, dir, url, func(c *Config) {
			mh = &modelHive{fakeHive: c.Hives.(*fakeHive), models: models, started: make(chan api.StartWorkerRequest, 16)}
			c.Hives = mh
		})
		if after := x2.models(); len(after) != 1 || after[0].MinWorkers != 1 || *after[0].MaxWorkers != 3 ||
			after[0].Reason != "before the restart" || !after[0].UpdatedAt.Equal(before[0].UpdatedAt) {
			t.Errorf("settings after the restart %+v, before %+v", after, before)
		}
		x2.registerAt("a", "http://hive-a")
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("queen logs:\n%s", x2.logs.String())
			}
		})
		x2.nextStart(mh)
	})
}

// A hive that refuses every start of the model (preflight): each
// placement that gives no worker is a failure; the third is a crash loop.
func TestReplicasRefusedStartsMakeACrashLoop(t *testing.T) {
	x, mh := routeQueen(t, map[string][]api.Model{"http://hive-a": {tinyModel}}, func(c *Config) {
		c.Routing = routing.Config{QueueTimeout: longQueue, MaxWorkers: 1, CrashLoopFailures: 3, CrashLoopWindow: time.Minute, CrashLoopBackoff: time.Hour}
	})
	x.registerAt("a", "http://hive-a")
	x.logs.wait(t, 0, "hive model list read", map[string]string{"pool_id": "a"})
	mh.set(&HiveError{Status: http.StatusBadRequest, Code: "invalid_model", Message: "model is not a readable GGUF"}, nil)
	x.scale("tiny", api.ModelScaleRequest{MinWorkers: intp(1), Reason: "refused starts"}, http.StatusOK)
	rec, _ := x.logs.wait(t, 0, "model in a crash loop: it is replaced only at the slow pace until a worker serves", map[string]string{"model_ref": "tiny"})
	if !strings.Contains(rec.Attrs["last_failure"], "invalid_model: model is not a readable GGUF") {
		t.Errorf("crash loop's last failure: %q", rec.Attrs["last_failure"])
	}
	var entries api.AuditList
	x.ok("GET", "/api/admin/audit?target=model:tiny&action=worker.crashloop", nil, http.StatusOK, &entries)
	if len(entries.Entries) != 1 {
		t.Errorf("%d worker.crashloop entries, want 1", len(entries.Entries))
	}
	mh.fakeHive.mu.Lock()
	n := len(mh.fakeHive.starts)
	mh.fakeHive.mu.Unlock()
	if n != 3 {
		t.Errorf("%d starts asked of the hive, want 3 (then the slow pace, an hour)", n)
	}
}
