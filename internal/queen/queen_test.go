package queen

import (
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/store"
)

func TestRegisterHeartbeatAndQuery(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		x := startOn(t, b)
		x.register("a")
		x.register("b")
		x.beat("a", worker("w1", "", "ready"))
		var list api.PoolList
		x.ok("GET", "/v2/pools?status=healthy&model=tiny", nil, http.StatusOK, &list)
		if len(list.Pools) != 1 || list.Pools[0].PoolID != "a" {
			t.Fatalf("healthy pools with tiny: %+v", list.Pools)
		}
		x.ok("GET", "/v2/pools?min_vram_bytes=5000000000", nil, http.StatusOK, &list)
		if len(list.Pools) != 0 {
			t.Errorf("pools with 5 GB free: %+v, want none", list.Pools)
		}
		x.ok("GET", "/v2/pools", nil, http.StatusOK, &list)
		if len(list.Pools) != 2 {
			t.Errorf("all pools: %d, want 2", len(list.Pools))
		}
		if diff := cmp.Diff([]string{"pool.register"}, x.audit("a")); diff != "" {
			t.Errorf("audit of a (-want +got):\n%s", diff)
		}
	})
}

// The row exists, STARTING, before the hive is asked, and the hive gets
// its lifecycle id.
func TestAdminStartWritesRowBeforeAskingHive(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		x := startOn(t, b)
		var seen []store.Row
		x.hive.onStart = func(req api.StartWorkerRequest) {
			if err := x.q.st.View(t.Context(), func(tx *store.Tx) error {
				r, err := tx.Row(req.LifecycleID)
				seen = append(seen, r)
				return err
			}); err != nil {
				t.Errorf("hive asked to start %q before its row exists: %v", req.LifecycleID, err)
			}
		}
		x.register("a")
		resp := x.start("tiny", "a")
		if !strings.HasPrefix(resp.LifecycleID, "wk-") {
			t.Fatalf("lifecycle id %q", resp.LifecycleID)
		}
		if len(seen) != 1 || seen[0].Status != rowStarting || seen[0].Owner != OwnerOperator || seen[0].Reason != "test" {
			t.Fatalf("row at hive start: %+v", seen)
		}
		r := x.row(resp.LifecycleID)
		if r.Status != "STARTING" || r.WorkerID != "worker-1" || r.StartedAt == nil {
			t.Errorf("row after the hive accepted: %+v", r)
		}
		if diff := cmp.Diff([]string{"worker.start", "worker.spawned"}, x.audit(resp.LifecycleID)); diff != "" {
			t.Errorf("audit (-want +got):\n%s", diff)
		}
	})
}

func TestHiveRefusalFailsTheRow(t *testing.T) {
	x := startQueen(t, sqliteDir(t), "")
	x.register("a")
	x.hive.set(&HiveError{Status: http.StatusInsufficientStorage, Code: "insufficient_memory", Message: "model needs 9 GiB"}, nil)
	status, body := x.do("POST", "/api/admin/workers", "", api.AdminWorkerRequest{Action: "start", Model: "big", PoolID: "a", Reason: "try"})
	if status != http.StatusInsufficientStorage || !strings.Contains(string(body), "insufficient_memory") {
		t.Fatalf("start refused by the hive: %d %s", status, body)
	}
	rows := x.storeRows()
	if len(rows) != 1 || rows[0].Status != rowFailed || !strings.Contains(rows[0].Reason, "model needs 9 GiB") || rows[0].StoppedAt == nil {
		t.Fatalf("rows after a refused start: %+v", rows)
	}
	if diff := cmp.Diff([]string{"worker.start", "worker.start_failed"}, x.audit(rows[0].ID)); diff != "" {
		t.Errorf("audit (-want +got):\n%s", diff)
	}
}

func TestStartOnUnavailablePoolWritesNothing(t *testing.T) {
	x := startQueen(t, sqliteDir(t), "")
	x.register("a")
	x.ok("POST", "/v2/pools/a/drain", `{"reason":"test"}`, http.StatusOK, nil)
	for _, tc := range []struct {
		pool   string
		status int
		code   string
	}{
		{"a", http.StatusConflict, "pool_unavailable"},
		{"nope", http.StatusNotFound, "pool_not_found"},
		{"", http.StatusServiceUnavailable, "no_pool_available"},
	} {
		status, body := x.do("POST", "/api/admin/workers", "", api.AdminWorkerRequest{Action: "start", Model: "tiny", PoolID: tc.pool, Reason: "x"})
		if status != tc.status || !strings.Contains(string(body), tc.code) {
			t.Errorf("start on %q: %d %s, want %d %s", tc.pool, status, body, tc.status, tc.code)
		}
	}
	if rows := x.storeRows(); len(rows) != 0 {
		t.Errorf("refused starts left rows: %+v", rows)
	}
}

func TestEventsDriveTheRow(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		x := startOn(t, b)
		x.register("a")
		id := x.start("tiny", "a").LifecycleID
		ev := func(from, to, reason string) api.EventAck {
			w := worker("worker-1", id, to)
			if to == "failed" || to == "stopped" {
				code := 0
				w.ExitCode = &code
			}
			return x.event(api.WorkerEvent{PoolID: "a", WorkerID: "worker-1", LifecycleID: id, From: from, To: to, Reason: reason, At: time.Now(), Worker: w})
		}
		ev("", "starting", "spawned")
		if r := x.row(id); r.Status != "STARTING" || r.PID == nil || *r.PID != 100 {
			t.Errorf("after starting: %+v", r)
		}
		ev("starting", "ready", "ready callback")
		r := x.row(id)
		if r.Status != "RUNNING" || r.ReadyAt == nil || r.URI != "http://127.0.0.1:8001" || r.VRAMBytes != 1<<20 {
			t.Errorf("after ready: %+v", r)
		}
		ev("ready", "busy", "request")
		ev("busy", "ready", "idle")
		ev("ready", "degraded", "missed health check")
		ev("degraded", "ready", "recovered")
		var stopResp api.AdminWorkerResponse
		x.ok("POST", "/api/admin/workers", api.AdminWorkerRequest{Action: "stop", LifecycleID: id, Drain: true, Reason: "scale down"}, http.StatusAccepted, &stopResp)
		if stopResp.Worker.Status != "DRAINING" {
			t.Errorf("after stop: %+v", stopResp.Worker)
		}
		ev("ready", "busy", "a request still in flight") // the stop had not reached it yet
		ev("busy", "draining", "drain requested")
		ev("draining", "stopped", "exit code 0")
		r = x.row(id)
		if r.Status != "STOPPED" || r.StoppedAt == nil || r.ExitCode == nil || *r.ExitCode != 0 || r.Reason != "stopped by admin: scale down (exit code 0)" { // who stopped it, why, then how
			t.Errorf("after stopped: %+v", r)
		}
		want := []string{"worker.start", "worker.spawned", "worker.starting", "worker.running", "worker.stop", "worker.stopped"}
		if diff := cmp.Diff(want, x.audit(id)); diff != "" {
			t.Errorf("audit (-want +got):\n%s", diff)
		}
		if n := x.logs.Count("refused lifecycle transition", nil); n != 0 {
			t.Errorf("%d refused transitions in a clean life", n)
		}
	})
}

func TestFailedEventKeepsExitCode(t *testing.T) {
	x := startQueen(t, sqliteDir(t), "")
	x.register("a")
	id := x.start("tiny", "a").LifecycleID
	w := worker("worker-1", id, "failed")
	code := 137
	w.ExitCode = &code
	x.event(api.WorkerEvent{PoolID: "a", WorkerID: "worker-1", LifecycleID: id, From: "starting", To: "failed", Reason: "killed by signal 9", At: time.Now(), Worker: w})
	r := x.row(id)
	if r.Status != "FAILED" || r.ExitCode == nil || *r.ExitCode != 137 || r.Reason != "killed by signal 9" {
		t.Errorf("failed row: %+v", r)
	}
}

// A transition against the table is refused, logged, counted, and answered
// 200 (the hive must not retry it forever).
func TestRefusedTransitionIsLoggedAndCounted(t *testing.T) {
	x := startQueen(t, sqliteDir(t), "")
	x.register("a")
	id := x.start("tiny", "a").LifecycleID
	ack := x.event(api.WorkerEvent{PoolID: "a", WorkerID: "worker-1", LifecycleID: id, From: "draining", To: "stopped", Reason: "?", Worker: worker("worker-1", id, "stopped")})
	if ack.Applied || !strings.Contains(ack.Message, "STARTING → STOPPED") {
		t.Errorf("ack %+v", ack)
	}
	if r := x.row(id); r.Status != "STARTING" {
		t.Errorf("row after a refused transition: %s", r.Status)
	}
	x.logs.wait(t, 0, "refused lifecycle transition", map[string]string{"lifecycle_id": id, "from": "STARTING", "to": "STOPPED"})
	_, body := x.do("GET", "/metrics", "", nil)
	if !strings.Contains(string(body), "apiary_queen_row_transitions_refused_total 1") {
		t.Errorf("refusal not counted:\n%s", grep(string(body), "refused"))
	}
}

func TestStopNeedsReasonAndALiveRow(t *testing.T) {
	x := startQueen(t, sqliteDir(t), "")
	x.register("a")
	id := x.start("tiny", "a").LifecycleID
	for _, tc := range []struct {
		req    api.AdminWorkerRequest
		status int
		code   string
	}{
		{api.AdminWorkerRequest{Action: "stop", LifecycleID: id}, 400, "reason is required"},
		{api.AdminWorkerRequest{Action: "stop", LifecycleID: id, Reason: "  "}, 400, "reason is required"},
		{api.AdminWorkerRequest{Action: "stop", LifecycleID: "wk-0000000000000000", Reason: "x"}, 404, "worker_not_found"},
		{api.AdminWorkerRequest{Action: "stop", LifecycleID: "../etc", Reason: "x"}, 400, "lifecycle id"},
		{api.AdminWorkerRequest{Action: "start", Model: "tiny"}, 400, "reason is required"},
		{api.AdminWorkerRequest{Action: "start", Model: "../x", Reason: "x"}, 400, "not a model ref"},
		{api.AdminWorkerRequest{Action: "stop", LifecycleID: id, Model: "tiny", Reason: "x"}, 400, "belong to action start"},
		{api.AdminWorkerRequest{Action: "restart", Reason: "x"}, 400, "want start or stop"},
	} {
		status, body := x.do("POST", "/api/admin/workers", "", tc.req)
		if status != tc.status || !strings.Contains(string(body), tc.code) {
			t.Errorf("%+v: %d %s, want %d %q", tc.req, status, body, tc.status, tc.code)
		}
	}
	if diff := cmp.Diff([]string{"worker.start", "worker.spawned"}, x.audit(id)); diff != "" {
		t.Errorf("refused requests changed the audit (-want +got):\n%s", diff)
	}
	// A worker the hive no longer knows is lost.
	x.hive.set(nil, &HiveError{Status: 404, Code: "worker_not_found", Message: "gone"})
	var resp api.AdminWorkerResponse
	x.ok("POST", "/api/admin/workers", api.AdminWorkerRequest{Action: "stop", LifecycleID: id, Reason: "x"}, http.StatusAccepted, &resp)
	if resp.Worker.Status != "FAILED" || !strings.HasPrefix(resp.Worker.Reason, "lost:") {
		t.Errorf("stop of a worker the hive forgot: %+v", resp.Worker)
	}
	status, body := x.do("POST", "/api/admin/workers", "", api.AdminWorkerRequest{Action: "stop", LifecycleID: id, Reason: "x"})
	if status != http.StatusConflict || !strings.Contains(string(body), "worker_ended") {
		t.Errorf("stop of an ended row: %d %s", status, body)
	}
}

// A hive that registers again reports its whole inventory: matching
// workers are adopted, rows without a worker are lost, workers without a
// live row are stopped and audited.
func TestReRegistrationReconciles(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		x := startOn(t, b)
		x.register("a")
		alive := x.start("tiny", "a").LifecycleID
		gone := x.start("tiny", "a").LifecycleID
		ended := x.start("tiny", "a").LifecycleID
		x.event(api.WorkerEvent{PoolID: "a", WorkerID: "worker-3", LifecycleID: ended, From: "starting", To: "failed", Reason: "crash", Worker: worker("worker-3", ended, "failed")})

		x.register("a") // the hive restarted
		x.beat("a", worker("worker-1", alive, "ready"), worker("worker-9", "", "ready"), worker("worker-3", ended, "ready"))

		if r := x.row(alive); r.Status != "RUNNING" || r.LastHeartbeatAt == nil {
			t.Errorf("adopted row: %+v", r)
		}
		if r := x.row(gone); r.Status != "FAILED" || !strings.HasPrefix(r.Reason, "lost") {
			t.Errorf("row of a missing worker: %+v", r)
		}
		stopped := map[string]bool{x.hive.waitStop(t): true, x.hive.waitStop(t): true}
		if !stopped["worker-9"] || !stopped["worker-3"] {
			t.Errorf("stopped %v, want worker-9 (no row) and worker-3 (ended row)", stopped)
		}
		if diff := cmp.Diff([]string{"worker.stop_unknown"}, x.audit("a/worker-9")); diff != "" {
			t.Errorf("audit of the unknown worker (-want +got):\n%s", diff)
		}
		x.logs.wait(t, 0, "pool inventory reconciled", map[string]string{"pool_id": "a", "adopted": "1", "lost": "1", "unknown": "2"})
		// The next heartbeat does not stop them again.
		x.beat("a", worker("worker-1", alive, "ready"), worker("worker-9", "", "ready"))
		select {
		case id := <-x.hive.stopped:
			t.Errorf("stopped %s again within the window", id)
		default:
		}
	})
}

func TestMissingFromTwoHeartbeatsIsLost(t *testing.T) {
	x := startQueen(t, sqliteDir(t), "")
	x.register("a")
	x.beat("a")
	id := x.start("tiny", "a").LifecycleID
	x.beat("a", worker("worker-1", id, "ready"))
	x.beat("a")
	if r := x.row(id); r.Status != "RUNNING" {
		t.Fatalf("after one miss: %s, want RUNNING", r.Status)
	}
	x.beat("a")
	if r := x.row(id); r.Status != "FAILED" || r.Reason != "lost: missing from 2 heartbeats in a row" {
		t.Errorf("after two misses: %+v", r)
	}
}

// A start whose answer has not come back yet is not lost by a heartbeat
// that crossed it.
func TestStartInFlightIsNotLost(t *testing.T) {
	x := startQueen(t, sqliteDir(t), "")
	x.register("a")
	x.beat("a")
	var id string
	x.hive.onStart = func(req api.StartWorkerRequest) {
		id = req.LifecycleID
		x.beat("a")
		x.beat("a")
		x.beat("a")
	}
	x.start("tiny", "a")
	if r := x.row(id); r.Status != "STARTING" {
		t.Errorf("row of a start in flight: %+v", r)
	}
}

// The watchdog: rows of a pool unhealthy past the grace become FAILED.
func TestWatchdogFailsRowsOfSilentPool(t *testing.T) {
	x := startQueen(t, sqliteDir(t), "", func(c *Config) {
		c.HeartbeatTimeout, c.UnhealthyGrace = 200*time.Millisecond, 200*time.Millisecond
	})
	x.register("a")
	id := x.start("tiny", "a").LifecycleID
	x.event(api.WorkerEvent{PoolID: "a", WorkerID: "worker-1", LifecycleID: id, From: "starting", To: "ready", Worker: worker("worker-1", id, "ready")})
	_, next := x.logs.wait(t, 0, "pool status changed", map[string]string{"pool_id": "a", "to": "unhealthy"})
	if r := x.row(id); r.Status != "RUNNING" {
		t.Errorf("row during the grace: %s", r.Status)
	}
	x.logs.wait(t, next, "lifecycle row changed", map[string]string{"lifecycle_id": id, "to": "FAILED"})
	r := x.row(id)
	if !strings.HasPrefix(r.Reason, "lost: pool unhealthy for") {
		t.Errorf("watchdog reason %q", r.Reason)
	}
	if diff := cmp.Diff([]string{"pool.register", "pool.unhealthy"}, x.audit("a")); diff != "" {
		t.Errorf("pool audit (-want +got):\n%s", diff)
	}
}

func TestDrainDeregisterAndComeBack(t *testing.T) {
	x := startQueen(t, sqliteDir(t), "")
	x.register("a")
	id := x.start("tiny", "a").LifecycleID
	var p api.Pool
	x.ok("POST", "/v2/pools/a/drain", `{"reason":"maintenance"}`, http.StatusOK, &p)
	if p.Status != "draining" || !p.Drained {
		t.Errorf("drained pool: %+v", p)
	}
	x.beat("a", worker("worker-1", id, "ready"))
	x.ok("DELETE", "/v2/pools/a", `{"reason":"deregistered for the test"}`, http.StatusOK, &p)
	if p.Status != "offline" {
		t.Errorf("deregistered pool: %+v", p)
	}
	if r := x.row(id); r.Status != "FAILED" || !strings.Contains(r.Reason, "deregistered") {
		t.Errorf("row of a deregistered pool: %+v", r)
	}
	status, body := x.do("POST", "/v2/pools/a/heartbeat", "", api.Heartbeat{})
	if status != http.StatusGone || !strings.Contains(string(body), "pool_offline") {
		t.Errorf("heartbeat of an offline pool: %d %s", status, body)
	}
	x.register("a")
	if p := x.pool("a"); p.Status != "healthy" || p.Drained {
		t.Errorf("re-registered pool: %+v", p)
	}
	want := []string{"pool.register", "pool.drain", "pool.offline", "pool.register"}
	if diff := cmp.Diff(want, x.audit("a")); diff != "" {
		t.Errorf("pool audit (-want +got):\n%s", diff)
	}
}

// A queen restart keeps every row and every pool, and the pools stay
// healthy while their hives beat.
func TestRestartKeepsRowsAndPools(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		dir, url := b.new(t)
		x := startQueen(t, dir, url)
		x.register("a")
		x.register("b")
		running := x.start("tiny", "a").LifecycleID
		x.event(api.WorkerEvent{PoolID: "a", WorkerID: "worker-1", LifecycleID: running, From: "starting", To: "ready", Worker: worker("worker-1", running, "ready")})
		x.beat("a", worker("worker-1", running, "ready"))
		failed := x.start("tiny", "b").LifecycleID
		x.event(api.WorkerEvent{PoolID: "b", WorkerID: "worker-2", LifecycleID: failed, From: "starting", To: "failed", Reason: "crash", Worker: worker("worker-2", failed, "failed")})
		before := x.storeRows()
		x.q.Close()

		y := startQueen(t, dir, url)
		// The final flush of a stopping queen writes the last heartbeat
		// times; everything else is as it was.
		ignoreBeat := cmp.FilterPath(func(p cmp.Path) bool { return p.Last().String() == ".LastHeartbeatAt" }, cmp.Ignore())
		if diff := cmp.Diff(before, y.storeRows(), ignoreBeat); diff != "" {
			t.Errorf("rows after restart (-before +after):\n%s", diff)
		}
		if r := y.row(running); r.LastHeartbeatAt == nil {
			t.Errorf("last heartbeat of the running row was not kept: %+v", r)
		}
		// Not healthy until its hive is heard from (these hives do not
		// answer the queen's calls): a hive may have stopped with the queen.
		for _, id := range []string{"a", "b"} {
			if p := y.pool(id); p.Status != "unhealthy" {
				t.Errorf("pool %s after restart, before its hive beat: %s", id, p.Status)
			}
		}
		y.beat("a", worker("worker-1", running, "ready"))
		y.beat("b")
		for _, id := range []string{"a", "b"} {
			if p := y.pool(id); p.Status != "healthy" {
				t.Errorf("pool %s after its hive beat: %s", id, p.Status)
			}
		}
		if r := y.row(running); r.Status != "RUNNING" {
			t.Errorf("running row after the first heartbeat: %+v", r)
		}
		y.logs.wait(t, 0, "pool inventory reconciled", map[string]string{"pool_id": "a", "adopted": "1", "lost": "0"})
	})
}

func TestTokens(t *testing.T) {
	tokens := Tokens{API: "api-t-0123456789", Admin: "admin-t-0123456789", Cluster: "cluster-t-0123456789"}
	x := startQueen(t, sqliteDir(t), "", func(c *Config) { c.Tokens = tokens })
	reg := api.RegisterPool{PoolID: "a", Endpoint: "http://127.0.0.1:1"}
	for _, tc := range []struct {
		method, path, token string
		body                any
		want                int
	}{
		{"GET", "/health", "", nil, 200},
		{"GET", "/metrics", "", nil, 401},
		{"GET", "/metrics", "admin-t-0123456789", nil, 200},
		{"POST", "/v2/pools/register", "", reg, 401},
		{"POST", "/v2/pools/register", "admin-t-0123456789", reg, 401},
		{"POST", "/v2/pools/register", "api-t-0123456789", reg, 401},
		{"POST", "/v2/pools/register", "cluster-t-0123456789", reg, 200},
		{"GET", "/v2/pools", "", nil, 401},
		{"GET", "/v2/pools", "admin-t-0123456789", nil, 200},
		{"GET", "/v2/pools", "cluster-t-0123456789", nil, 200},
		{"POST", "/v2/pools/a/drain", "api-t-0123456789", nil, 401},
		{"POST", "/v2/pools/a/drain", "cluster-t-0123456789", nil, 401}, // admin only
		{"DELETE", "/v2/pools/a", "cluster-t-0123456789", nil, 401},
		{"GET", "/api/admin/workers", "cluster-t-0123456789", nil, 401},
		{"GET", "/api/admin/workers", "admin-t-0123456789", nil, 200},
		{"GET", "/api/admin/audit", "admin-t-0123456789x", nil, 401},
		{"GET", "/api/admin/audit", "admin-t-0123456789", nil, 200},
		{"POST", "/v2/internal/workers/events", "admin-t-0123456789", api.WorkerEvent{}, 401},
	} {
		status, body := x.do(tc.method, tc.path, tc.token, tc.body)
		if status != tc.want {
			t.Errorf("%s %s with %q: %d %s, want %d", tc.method, tc.path, tc.token, status, body, tc.want)
		}
		if status == 401 && !strings.Contains(string(body), `"code":"unauthorized"`) {
			t.Errorf("401 body %s", body)
		}
	}
	// The scheme is case-insensitive (RFC 7235): "bearer T" was once 401.
	for _, scheme := range []string{"bearer", "BEARER"} {
		req, err := http.NewRequest("GET", x.url+"/api/admin/workers", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", scheme+" admin-t-0123456789")
		resp, err := x.hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("the admin token with the scheme %q: %d, want 200", scheme, resp.StatusCode)
		}
	}
	// The hive calls refused for their token are counted and logged (once
	// a minute per address): a hive with the wrong token is not silent at
	// the queen.
	for endpoint, want := range map[string]string{"/v2/pools/register": "3", "/v2/internal/workers/events": "1"} {
		if got := metricLineWith(x, `apiary_queen_hive_calls_refused_total{endpoint="`+endpoint+`"}`, "admin-t-0123456789"); got != want {
			t.Errorf("refused hive calls at %s: %q, want %s", endpoint, got, want)
		}
	}
	if n := x.logs.Count("refused a hive's call: missing or wrong cluster token (APIARY_CLUSTER_TOKEN must be the queen's); logged once a minute per address",
		map[string]string{"remote": "127.0.0.1", "endpoint": "/v2/pools/register"}); n != 1 {
		t.Errorf("the refused hive calls were logged %d times, want once", n)
	}
	logs := x.logs.String()
	_, audit := x.do("GET", "/api/admin/audit", "admin-t-0123456789", nil)
	for _, secret := range []string{"admin-t-0123456789", "cluster-t-0123456789", "api-t-0123456789"} {
		if strings.Contains(logs, secret) || strings.Contains(string(audit), secret) {
			t.Errorf("token %q is in the logs or the audit log", secret)
		}
	}
}

func TestNonLoopbackAddressNeedsAllTokens(t *testing.T) {
	for _, tc := range []struct {
		addr   string
		tokens Tokens
		ok     bool
		names  string // what the error names: the missing tokens' variables, or the field of the token at fault
	}{
		{"127.0.0.1:0", Tokens{}, true, ""},
		{"[::1]:0", Tokens{}, true, ""},
		{"localhost:0", Tokens{}, true, ""},
		{"0.0.0.0:8080", Tokens{}, false, "APIARY_"},
		{":8080", Tokens{}, false, "APIARY_"},
		{"0.0.0.0:8080", Tokens{Admin: "admin-0123456789", Cluster: "cluster-0123456789"}, false, "APIARY_API_TOKEN"},
		{"127.0.0.1:0", Tokens{Admin: "admin-0123456789"}, false, "APIARY_API_TOKEN"},                                                // a partial set leaves roles open: refused
		{"0.0.0.0:8080", Tokens{API: "x", Admin: "admin-0123456789", Cluster: "cluster-0123456789"}, false, "Tokens.API is 1 bytes"}, // too short
		{"0.0.0.0:8080", Tokens{API: "api-0123456789ab", Admin: "admin-0123456789", Cluster: "cluster-0123456789"}, true, ""},
		// Tokens no request can carry (cmd/apiary names each by its
		// variable: TestTokensThatCanNeverWorkAreRefused).
		{"0.0.0.0:8080", Tokens{API: strings.Repeat(" ", 20), Admin: "admin-0123456789", Cluster: "cluster-0123456789"}, false, "Tokens.API is blank"},
		{"0.0.0.0:8080", Tokens{API: "api-0123456789ab", Admin: "admin-0123456789\n", Cluster: "cluster-0123456789"}, false, "Tokens.Admin has a newline"},
		{"0.0.0.0:8080", Tokens{API: "api-0123456789ab", Admin: "admin-0123456789", Cluster: "cluster 0123456789"}, false, "Tokens.Cluster has a space"},
	} {
		_, err := New(Config{Addr: tc.addr, Tokens: tc.tokens, DataDir: t.TempDir()})
		if (err == nil) != tc.ok {
			t.Errorf("%s with %+v: err %v, want ok=%v", tc.addr, tc.tokens, err, tc.ok)
		}
		if err != nil && !strings.Contains(err.Error(), tc.names) {
			t.Errorf("error does not name %q: %v", tc.names, err)
		}
	}
}

func TestInputValidation(t *testing.T) {
	x := startQueen(t, sqliteDir(t), "", func(c *Config) { c.MaxBodyBytes = 4096 })
	x.register("a")
	big := `{"pool_id":"a","endpoint":"http://x","node_id":"` + strings.Repeat("x", 5000) + `"}`
	for _, tc := range []struct {
		method, path string
		body         any
		status       int
		code         string
	}{
		{"POST", "/v2/pools/register", `{"pool_id":"a","endpoint":"http://x","extra":1}`, 400, "unknown field"},
		{"POST", "/v2/pools/register", `{"pool_id":"a b","endpoint":"http://x"}`, 400, "pool_id"},
		{"POST", "/v2/pools/register", `{"pool_id":"a","endpoint":"ftp://x"}`, 400, "endpoint"},
		{"POST", "/v2/pools/register", `not json`, 400, "invalid JSON"},
		{"POST", "/v2/pools/register", ``, 400, "empty"},
		{"POST", "/v2/pools/register", big, 413, "body_too_large"},
		{"POST", "/v2/pools/a/heartbeat", `{"gpus":[{"id":-1}],"workers":[]}`, 400, "negative"},
		{"POST", "/v2/pools/nope/heartbeat", `{"gpus":[],"workers":[]}`, 404, "pool_not_found"},
		{"POST", "/v2/internal/workers/events", `{"pool_id":"a","worker_id":"w","to":"flying"}`, 400, "unknown state"},
		{"POST", "/v2/internal/workers/events", `{"pool_id":"zz","worker_id":"w","to":"ready"}`, 404, "pool_not_found"},
		{"GET", "/v2/pools?colour=red", nil, 400, "unknown query parameter"},
		{"GET", "/v2/pools?status=sleepy", nil, 400, "unknown pool status"},
		{"GET", "/v2/pools?min_vram_bytes=-1", nil, 400, "min_vram_bytes"},
		{"GET", "/api/admin/workers?status=WALKING", nil, 400, "lifecycle status"},
		{"GET", "/api/admin/workers?limit=0", nil, 400, "limit"},
		{"GET", "/api/admin/audit?since=yesterday", nil, 400, "since"},
		{"POST", "/api/admin/workers", `{"action":"start","model":"tiny","reason":"x","worker_id":"w-1"}`, 400, "unknown field"},
		{"POST", "/v2/pools/a/drain", `{"reason":"x","why":"y"}`, 400, "unknown field"},
		{"PUT", "/v2/pools", nil, 405, "method_not_allowed"},
		{"GET", "/v3/everything", nil, 404, "not_found"},
	} {
		status, body := x.do(tc.method, tc.path, "", tc.body)
		if status != tc.status || !strings.Contains(string(body), tc.code) || !strings.HasPrefix(string(body), `{"error":{"code":`) {
			t.Errorf("%s %s %.60v: %d %s, want %d with %q", tc.method, tc.path, tc.body, status, body, tc.status, tc.code)
		}
	}
	if diff := cmp.Diff([]string{"pool.register"}, x.audit("a")); diff != "" {
		t.Errorf("bad requests changed the audit (-want +got):\n%s", diff)
	}
}

func TestHealthAndMetrics(t *testing.T) {
	x := startQueen(t, sqliteDir(t), "")
	var h api.Health
	x.ok("GET", "/health", nil, http.StatusOK, &h)
	if h.Status != "ok" || h.Version == "" {
		t.Errorf("health %+v", h)
	}
	x.register("a")
	x.beat("a")
	x.start("tiny", "a")
	_, body := x.do("GET", "/metrics", "", nil)
	for _, want := range []string{
		`apiary_queen_pools{status="healthy"} 1`,
		`apiary_queen_pools{status="unhealthy"} 0`,
		`apiary_queen_heartbeats_received_total 1`,
		`apiary_queen_heartbeat_duration_seconds_count 1`,
		`apiary_queen_worker_rows{status="STARTING"} 1`,
		`apiary_queen_pools_registered_total 1`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

func grep(text, word string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, word) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// An unknown /v1/ path is 404 naming it, a known path with a method it
// does not take 405 with Allow (issue #31's item 2: every unknown /v1/
// path answered 405, telling a client the endpoint existed).
func TestUnknownOpenAIPaths(t *testing.T) {
	x := startQueen(t, sqliteDir(t), "")
	for _, tc := range []struct {
		method, path string
		status       int
		want, allow  string
	}{
		{"POST", "/v1/chat/completion", 404, "no endpoint POST /v1/chat/completion (check the URL for typos)", ""},
		{"POST", "/v1/responsez", 404, "no endpoint POST /v1/responsez", ""},
		{"POST", "/v1/nope", 404, "no endpoint POST /v1/nope", ""},
		{"GET", "/v1/nothing/here", 404, "not_found", ""},
		{"GET", "/v1/chat/completions", 405, "GET /v1/chat/completions is not allowed; use POST, OPTIONS", "POST, OPTIONS"},
		{"DELETE", "/v1/models", 405, "method_not_allowed", "GET, OPTIONS"},
		{"PUT", "/v1/files", 405, "method_not_allowed", "GET, POST, OPTIONS"},
		{"POST", "/v1/batches/b-1", 405, "method_not_allowed", "GET, OPTIONS"},
	} {
		req, err := http.NewRequest(tc.method, x.url+tc.path, strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.status || !strings.Contains(string(body), tc.want) || resp.Header.Get("Allow") != tc.allow ||
			!strings.HasPrefix(string(body), `{"error":{"code":`) {
			t.Errorf("%s %s: %d (Allow %q) %s, want %d with %q (Allow %q)", tc.method, tc.path, resp.StatusCode, resp.Header.Get("Allow"), body, tc.status, tc.want, tc.allow)
		}
	}
}

// Ollama's paths answer in Ollama's error shape ({"error": "…"}): an
// unknown one 404, a known one with another method 405, a bad request
// 400, pulling (apiary's own command) 404 saying so.
func TestOllamaPathsAnswerInOllamasShape(t *testing.T) {
	x := startQueen(t, sqliteDir(t), "")
	for _, tc := range []struct {
		method, path, body string
		status             int
		want, allow        string
	}{
		{"POST", "/api/chatt", "{}", 404, `{"error":"no endpoint POST /api/chatt"}`, ""},
		{"GET", "/api/chat", "", 405, `{"error":"GET /api/chat is not allowed; use POST, OPTIONS"}`, "POST, OPTIONS"},
		{"POST", "/api/pull", `{"model":"x"}`, 404, "apiary models pull", ""},
		{"POST", "/api/chat", `{"model":"x","messages":[{"role":"user","content":"hi"}],"options":{"temprature":1}}`, 400, "options.temprature is not an Ollama option", ""},
		{"POST", "/api/chat", `{"messages":[{"role":"user","content":"hi"}]}`, 400, "model is required", ""},
		{"POST", "/api/chat", `{"model":"nosuch","messages":[{"role":"user","content":"hi"}]}`, 404, `model \"nosuch\"`, ""},
		{"POST", "/api/show", `{"model":"nosuch"}`, 404, `{"error":"model 'nosuch' not found"}`, ""},
		{"GET", "/api/tags", "", 200, `{"models":[]}`, ""},
		{"GET", "/api/ps", "", 200, `{"models":[]}`, ""},
	} {
		req, err := http.NewRequest(tc.method, x.url+tc.path, strings.NewReader(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.status || !strings.Contains(string(body), tc.want) || resp.Header.Get("Allow") != tc.allow ||
			(tc.status != 200 && !strings.HasPrefix(string(body), `{"error":"`)) {
			t.Errorf("%s %s: %d (Allow %q) %s, want %d with %q (Allow %q)", tc.method, tc.path, resp.StatusCode, resp.Header.Get("Allow"), body, tc.status, tc.want, tc.allow)
		}
	}
}

// metricLineWith is metricLine for a queen whose /metrics needs a token.
func metricLineWith(x *tq, prefix, token string) string {
	_, body := x.do("GET", "/metrics", token, nil)
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, prefix) {
			return line[strings.LastIndexByte(line, ' ')+1:]
		}
	}
	return ""
}

// One reason rule for a pool's state changes: drain and removal need a
// reason as undrain does; a drain of a drained pool is audited too; a
// drain with "now" stops the pool's running workers gracefully, one
// without leaves them serving.
func TestDrainNeedsAReasonAndNowStopsWorkers(t *testing.T) {
	x := startQueen(t, sqliteDir(t), "")
	x.register("a")
	id := x.start("tiny", "a").LifecycleID
	x.beat("a", worker("worker-1", id, "ready"))
	for _, c := range []struct{ method, path string }{{"POST", "/v2/pools/a/drain"}, {"DELETE", "/v2/pools/a"}, {"POST", "/v2/pools/a/undrain"}} {
		if status, body := x.do(c.method, c.path, "", nil); status != http.StatusBadRequest || !strings.Contains(string(body), "reason is required") {
			t.Errorf("%s %s without a reason: %d %s", c.method, c.path, status, body)
		}
	}
	if status, body := x.do("POST", "/v2/pools/a/undrain", "", api.PoolAction{Reason: "x", Now: true}); status != http.StatusBadRequest || !strings.Contains(string(body), "now applies to a drain only") {
		t.Errorf("undrain with now: %d %s", status, body)
	}
	x.ok("POST", "/v2/pools/a/drain", api.PoolAction{Reason: "maintenance"}, http.StatusOK, nil)
	if r := x.row(id); r.Status != "RUNNING" {
		t.Errorf("a drain without now stopped the worker: %+v", r)
	}
	x.ok("POST", "/v2/pools/a/drain", api.PoolAction{Reason: "maintenance, now", Now: true}, http.StatusOK, nil)
	if r := x.row(id); r.Status != "DRAINING" || !strings.Contains(r.Reason, "pool drained now: maintenance, now") {
		t.Errorf("the worker after a drain with now: %+v", r)
	}
	var list api.AuditList
	x.ok("GET", "/api/admin/audit?action=pool.drain", nil, http.StatusOK, &list)
	var reasons []string
	for _, e := range list.Entries {
		reasons = append(reasons, e.Reason)
	}
	if !slices.Contains(reasons, "maintenance") || !slices.Contains(reasons, "maintenance, now (already drained)") {
		t.Errorf("pool.drain entries: %q, want both drains", reasons)
	}
}
