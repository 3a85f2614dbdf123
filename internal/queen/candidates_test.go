package queen

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/routing"
)

// TestCandidatesFollowEveryChange: a model's candidates are kept between
// requests, and each thing they are made of changes them at once: a
// worker's load and status in a heartbeat, its token, its pool's status,
// its row.
func TestCandidatesFollowEveryChange(t *testing.T) {
	x, _ := routeQueen(t, map[string][]api.Model{"http://hive-a": {tinyModel}, "http://hive-b": {tinyModel}})
	x.registerAt("a", "http://hive-a")
	x.registerAt("b", "http://hive-b")
	lidA, lidB := x.readyWorker("a", "http://worker-a"), x.readyWorker("b", "http://worker-b")
	cp := controlPlane{x.q}
	// The loads hives report move no generation; a list is kept up to
	// a heartbeat interval with them, here not at all.
	x.q.cands.setMaxAge(0)
	rowA, rowB := x.row(lidA), x.row(lidB)
	worker := func(row api.LifecycleRow, status string, inFlight int) api.Worker {
		return api.Worker{WorkerID: row.WorkerID, LifecycleID: row.ID, ModelRef: "tiny", URI: "http://worker-" + row.PoolID,
			Status: status, PID: 1, InFlight: inFlight, StartedAt: time.Now()}
	}
	beat := func(pool string, w api.Worker, token string) {
		t.Helper()
		hb := api.Heartbeat{GPUs: []api.GPU{{ID: 0, Kind: "cpu", TotalBytes: 8 << 30, FreeBytes: 4 << 30}}, Workers: []api.Worker{w}}
		if token != "" {
			hb.WorkerTokens = map[string]string{w.WorkerID: token}
		}
		x.ok("POST", "/v2/pools/"+pool+"/heartbeat", hb, http.StatusOK, nil)
	}
	type seen struct {
		pool, token string
		reported    int
	}
	check := func(step string, want ...seen) {
		t.Helper()
		var got []seen
		for _, c := range cp.Candidates("tiny", "") {
			got = append(got, seen{c.Key.Pool, c.Token, c.Reported})
		}
		if len(got) != len(want) {
			t.Fatalf("%s: candidates %+v, want %+v", step, got, want)
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("%s: candidates %+v, want %+v", step, got, want)
			}
		}
		// The answer is the same when asked again (from the cache).
		again := cp.Candidates("tiny", "")
		if len(again) != len(want) {
			t.Fatalf("%s, asked again: %d candidates, want %d", step, len(again), len(want))
		}
	}
	beat("a", worker(rowA, "ready", 0), "tok-a1")
	beat("b", worker(rowB, "ready", 0), "tok-b1")
	check("both ready", seen{"a", "tok-a1", 0}, seen{"b", "tok-b1", 0})
	if n := cp.Count("tiny", "", false); n.Running != 2 {
		t.Fatalf("count %+v, want 2 running", n)
	}

	beat("a", worker(rowA, "busy", 3), "tok-a1")
	check("a's load in a heartbeat", seen{"a", "tok-a1", 3}, seen{"b", "tok-b1", 0})
	x.q.cands.setMaxAge(time.Hour)
	beat("a", worker(rowA, "busy", 4), "tok-a1")
	check("a's load, kept", seen{"a", "tok-a1", 3}, seen{"b", "tok-b1", 0})
	beat("a", worker(rowA, "ready", 4), "tok-a1")
	check("a's status, at once", seen{"a", "tok-a1", 4}, seen{"b", "tok-b1", 0})
	beat("a", worker(rowA, "busy", 3), "tok-a1")

	beat("b", worker(rowB, "ready", 0), "tok-b2")
	check("b's new token", seen{"a", "tok-a1", 3}, seen{"b", "tok-b2", 0})

	beat("a", worker(rowA, "degraded", 3), "tok-a1")
	check("a degraded", seen{"b", "tok-b2", 0})
	beat("a", worker(rowA, "ready", 1), "tok-a1")
	check("a ready again", seen{"a", "tok-a1", 1}, seen{"b", "tok-b2", 0})

	// Drained means no new workers: b's running worker serves on.
	x.ok("POST", "/v2/pools/b/drain", api.PoolAction{Reason: "test"}, http.StatusOK, nil)
	check("pool b drained", seen{"a", "tok-a1", 1}, seen{"b", "tok-b2", 0})
	if n := cp.Count("tiny", "", true); n.Running != 2 {
		t.Fatalf("serving count with b drained %+v, want 2 running", n)
	}
	x.ok("POST", "/v2/pools/b/undrain", api.PoolAction{Reason: "test"}, http.StatusOK, nil)
	check("pool b back", seen{"a", "tok-a1", 1}, seen{"b", "tok-b2", 0})

	if _, err := x.q.StopWorker(context.Background(), lidA, true, "test", "admin"); err != nil {
		t.Fatal(err)
	}
	check("a's row stopping", seen{"b", "tok-b2", 0})
	if n := cp.Count("tiny", "", false); n.Running != 1 {
		t.Fatalf("count after a's stop %+v, want 1 running", n)
	}
	var _ routing.ControlPlane = cp
}
