package queen

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

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

// TestSplitWorkers: the good entries are kept in order (splitWorkers
// filters in place), each bad one is refused alone, and a token is kept
// only for a kept worker; a token for a worker the heartbeat does not
// list is refused, one for a refused worker is dropped with it.
func TestSplitWorkers(t *testing.T) {
	good := func(id string) api.Worker { return api.Worker{WorkerID: id, ModelRef: "tiny", Status: "ready"} }
	bad := api.Worker{WorkerID: "w-bad", Status: "no-such-state"}
	ws := []api.Worker{good("w1"), bad, good("w2"), good("w3")}
	tokens := map[string]string{"w2": "token-2", "w-bad": "token-bad", "w-ghost": "token-ghost"}
	kept, keptTokens, refused := splitWorkers(ws, tokens)
	if diff := cmp.Diff([]api.Worker{good("w1"), good("w2"), good("w3")}, kept); diff != "" {
		t.Errorf("kept (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]string{"w2": "token-2"}, keptTokens); diff != "" {
		t.Errorf("tokens kept (-want +got):\n%s", diff)
	}
	var ids []string
	for _, r := range refused {
		ids = append(ids, r.WorkerID)
	}
	if diff := cmp.Diff([]string{"w-bad", "w-ghost"}, ids); diff != "" {
		t.Errorf("refused (-want +got):\n%s", diff)
	}
	if kept, keptTokens, refused := splitWorkers([]api.Worker{good("w1")}, nil); len(kept) != 1 || keptTokens != nil || refused != nil {
		t.Errorf("a clean heartbeat without tokens: kept %v, tokens %v, refused %v", kept, keptTokens, refused)
	}
}
