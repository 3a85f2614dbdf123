package queen

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/apiary-llm/apiary/internal/api"
)

// One worker entry the queen refuses used to fail the whole
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
	kept, keptTokens, refused := splitWorkers(ws, tokens, nil)
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
	if kept, keptTokens, refused := splitWorkers([]api.Worker{good("w1")}, nil, nil); len(kept) != 1 || keptTokens != nil || refused != nil {
		t.Errorf("a clean heartbeat without tokens: kept %v, tokens %v, refused %v", kept, keptTokens, refused)
	}
}

// An unchanged beat renews the lease of a pool whose last full heartbeat
// the queen holds, and sees its workers' rows again; a queen that holds
// none (the pool registered again, or came back from unhealthy) answers
// full_wanted and renews nothing; one that carries anything is refused.
func TestHeartbeatUnchanged(t *testing.T) {
	x := startQueen(t, sqliteDir(t), "")
	unchanged := func(pool string) api.HeartbeatAnswer {
		t.Helper()
		var ans api.HeartbeatAnswer
		x.ok("POST", "/v2/pools/"+pool+"/heartbeat", api.Heartbeat{Unchanged: true}, http.StatusOK, &ans)
		return ans
	}
	x.register("a")
	if ans := unchanged("a"); !ans.FullWanted || ans.Status != "healthy" {
		t.Errorf("an unchanged beat before any full one: %+v, want full_wanted", ans)
	}
	id := x.start("tiny", "a").LifecycleID
	w := worker("w-1", id, "ready")
	x.beat("a", w)
	before := x.pool("a")
	if r := x.row(id); r.Status != "RUNNING" {
		t.Fatalf("row after the full heartbeat: %+v", r)
	}
	if ans := unchanged("a"); ans.FullWanted || ans.Status != "healthy" {
		t.Errorf("an unchanged beat after a full one: %+v", ans)
	}
	after := x.pool("a")
	if !after.LastHeartbeatAt.After(*before.LastHeartbeatAt) || len(after.Workers) != 1 || after.Workers[0].WorkerID != "w-1" ||
		len(after.GPUs) != 1 || after.GPUs[0].FreeBytes != 4<<30 {
		t.Errorf("pool after the unchanged beat %+v, before %+v", after, before)
	}
	if r := x.row(id); r.Status != "RUNNING" || r.LastHeartbeatAt == nil || r.LastHeartbeatAt.Before(*before.LastHeartbeatAt) {
		t.Errorf("row after the unchanged beat: %+v", r)
	}
	code, body := x.do("POST", "/v2/pools/a/heartbeat", "", api.Heartbeat{Unchanged: true, Workers: []api.Worker{w}})
	if code != http.StatusBadRequest || !strings.Contains(string(body), "unchanged heartbeat carries no") {
		t.Errorf("an unchanged beat with workers: %d %s", code, body)
	}

	// Registered again: the inventory comes first.
	x.register("a")
	if ans := unchanged("a"); !ans.FullWanted {
		t.Errorf("an unchanged beat after registering again: %+v", ans)
	}
	x.beat("a", w)
	if ans := unchanged("a"); ans.FullWanted {
		t.Errorf("an unchanged beat after the inventory: %+v", ans)
	}

	if got := metricLine(x, "apiary_queen_heartbeats_unchanged_total"); got != "4" {
		t.Errorf("unchanged beats counted %q, want 4", got)
	}

	// Silent past the timeout: unhealthy; an unchanged beat does not bring
	// it back, the full one does.
	y := startQueen(t, sqliteDir(t), "", func(c *Config) {
		c.HeartbeatTimeout, c.UnhealthyGrace = 100*time.Millisecond, time.Minute
	})
	y.register("b")
	unhealthy := map[string]string{"pool_id": "b", "to": "unhealthy"}
	_, next := y.logs.wait(t, 0, "pool status changed", unhealthy)
	y.beat("b") // back, with a full heartbeat the queen holds; silent again after it
	y.logs.wait(t, next, "pool status changed", unhealthy)
	var ans api.HeartbeatAnswer
	y.ok("POST", "/v2/pools/b/heartbeat", api.Heartbeat{Unchanged: true}, http.StatusOK, &ans)
	if !ans.FullWanted || ans.Status != "unhealthy" {
		t.Errorf("an unchanged beat of an unhealthy pool: %+v", ans)
	}
	if p := y.pool("b"); p.Status != "unhealthy" {
		t.Errorf("pool after an unchanged beat while unhealthy: %s", p.Status)
	}
	y.beat("b")
	if p := y.pool("b"); p.Status != "healthy" {
		t.Errorf("pool after the full heartbeat: %s", p.Status)
	}
}

// A live row's heartbeat time reaches the store at the first beat, then
// only when the stored one is registry.BeatTimeSave old; the final flush
// writes the latest.
func TestRowBeatTimesReachTheStoreAtTheirPace(t *testing.T) {
	x := startQueen(t, sqliteDir(t), "")
	x.register("a")
	id := x.start("tiny", "a").LifecycleID
	w := worker("w-1", id, "ready")
	stored := func() time.Time {
		t.Helper()
		for _, r := range x.storeRows() {
			if r.ID == id && r.LastHeartbeatAt != nil {
				return *r.LastHeartbeatAt
			}
		}
		return time.Time{}
	}
	x.beat("a", w)
	if err := x.q.rows.flush(t.Context(), false); err != nil {
		t.Fatal(err)
	}
	first := stored()
	if first.IsZero() {
		t.Fatal("the first beat's time was not written")
	}
	x.beat("a", w)
	x.q.rows.mu.Lock()
	latest, _ := x.q.rows.seenAt(id)
	x.q.rows.mu.Unlock()
	if err := x.q.rows.flush(t.Context(), false); err != nil {
		t.Fatal(err)
	}
	if got := stored(); !got.Equal(first) || !latest.After(first) {
		t.Errorf("stored %v after a second beat within BeatTimeSave, want the first %v (latest %v)", got, first, latest)
	}
	if err := x.q.rows.flush(t.Context(), true); err != nil {
		t.Fatal(err)
	}
	if got := stored(); !got.Equal(latest) {
		t.Errorf("stored %v after the final flush, want the latest %v", got, latest)
	}
}

// A heartbeat stream checks each worker URI once: a URI that passed is
// not parsed again, any other still is (and refused when bad), and the
// memo stays bounded.
func TestStreamChecksEachWorkerURIOnce(t *testing.T) {
	var m uriMemo
	w := api.Worker{WorkerID: "w1", ModelRef: "tiny", Status: "ready", URI: "http://127.0.0.1:9001"}
	if err := checkWorkerURIs(w, &m); err != nil || !m.has(w.URI) {
		t.Fatalf("a good URI: %v, remembered %v", err, m.ok)
	}
	for _, bad := range []string{"http://127.0.0.1:9001/path", "ftp://127.0.0.1:9001", "http://user@127.0.0.1:9001", "http://127.0.0.1:9001?q"} {
		w.URI = bad
		if err := checkWorkerURIs(w, &m); err == nil || m.has(bad) {
			t.Errorf("URI %q after a good one: %v, remembered %v", bad, err, m.ok)
		}
	}
	for i := range 2 * maxURIMemo {
		w.URI = fmt.Sprintf("http://127.0.0.1:%d", 10000+i)
		if err := checkWorkerURIs(w, &m); err != nil {
			t.Fatal(err)
		}
	}
	if len(m.ok) != maxURIMemo {
		t.Errorf("the memo holds %d URIs, want at most %d", len(m.ok), maxURIMemo)
	}
	if err := checkWorkerURIs(api.Worker{WorkerID: "w2", Status: "ready", URI: "http://127.0.0.1:9001/x"}, nil); err == nil {
		t.Error("a bad URI without a memo was taken")
	}
}
