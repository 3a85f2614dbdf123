package queen

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
)

// Issue 12: one worker entry the queen refuses used to fail the whole
// heartbeat, and the hive then lost its lease and killed every worker.
// Now the bad entry is refused alone and named; the rest is taken; the
// refused worker's row fails with the refusal as its reason and the hive
// is asked to stop it.
func TestHeartbeatRefusesABadEntryAlone(t *testing.T) {
	x := startQueen(t, sqliteDir(t), "")
	x.register("a")
	good, bad := x.start("tiny", "a"), x.start("tiny", "a")
	now := time.Now().UTC()
	workers := []api.Worker{
		{WorkerID: good.Worker.WorkerID, LifecycleID: good.LifecycleID, ModelRef: "tiny", URI: "http://127.0.0.1:8001", Status: "ready", PID: 10, StartedAt: now},
		{WorkerID: bad.Worker.WorkerID, LifecycleID: "not a lifecycle id!", ModelRef: "tiny", URI: "http://127.0.0.1:8002", Status: "ready", PID: 11, StartedAt: now},
	}
	var ans api.HeartbeatAnswer
	x.ok("POST", "/v2/pools/a/heartbeat", api.Heartbeat{Workers: workers}, http.StatusOK, &ans)
	if ans.Status != "healthy" || len(ans.Refused) != 1 || ans.Refused[0].WorkerID != bad.Worker.WorkerID ||
		!strings.Contains(ans.Refused[0].Reason, "lifecycle_id") {
		t.Fatalf("answer %+v", ans)
	}
	if r := x.row(good.LifecycleID); r.Status != "RUNNING" {
		t.Errorf("the good worker's row: %+v", r)
	}
	if r := x.row(bad.LifecycleID); r.Status != "FAILED" || !strings.Contains(r.Reason, "refused") {
		t.Errorf("the refused worker's row: %+v", r)
	}
	select {
	case id := <-x.hive.stopped:
		if id != bad.Worker.WorkerID {
			t.Errorf("stopped %s, want the refused %s", id, bad.Worker.WorkerID)
		}
	case <-time.After(waitLimit):
		t.Error("the refused worker was not stopped")
	}
	if p := x.pool("a"); len(p.Workers) != 1 || p.Workers[0].WorkerID != good.Worker.WorkerID {
		t.Errorf("pool workers %+v", p.Workers)
	}
}
