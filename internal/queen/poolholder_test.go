package queen

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/rpc"
)

// hiveCall sends what a hive of instance sends (the cluster token, and
// its instance in api.HiveInstanceHeader) and returns the status and the
// body.
func (x *tq) hiveCall(method, path, instance string, body any) (int, string) {
	x.t.Helper()
	data, err := json.Marshal(body)
	if err != nil {
		x.t.Fatal(err)
	}
	req, err := http.NewRequest(method, x.url+path, bytes.NewReader(data))
	if err != nil {
		x.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if instance != "" {
		req.Header.Set(api.HiveInstanceHeader, instance)
	}
	resp, err := x.hc.Do(req)
	if err != nil {
		x.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// hiveRegistration is hive instance's registration of pool id at endpoint.
func hiveRegistration(id, endpoint, node, instance string) api.RegisterPool {
	return api.RegisterPool{PoolID: id, Endpoint: endpoint, NodeID: node, Version: "t", Instance: instance,
		GPUs: []api.GPU{{ID: 0, Kind: "cpu", TotalBytes: 8 << 30, FreeBytes: 4 << 30}}}
}

// Two hives with one pool id (cloned machines share the host name, the
// old default pool id) were both accepted: about 21 s after the second
// registered, the first one's heartbeats marked the second's healthy
// worker lost, and the queen killed it. Now a second hive that claims a
// pool id a live hive holds is refused at registration, 409 naming the
// pool, the holder and --pool-id, and its heartbeats are refused too; the
// holder's worker keeps running.
func TestSecondHiveWithTheSamePoolIDIsRefused(t *testing.T) {
	x := startQueen(t, sqliteDir(t), "")
	hb := func(workers ...api.Worker) api.Heartbeat {
		return api.Heartbeat{GPUs: []api.GPU{{ID: 0, Kind: "cpu", TotalBytes: 8 << 30, FreeBytes: 4 << 30}}, Workers: workers}
	}
	if code, body := x.hiveCall("POST", "/v2/pools/register", "", hiveRegistration("node", "http://127.0.0.1:1", "node", "hive-a")); code != http.StatusOK {
		t.Fatalf("first registration: %d %s", code, body)
	}
	lc := x.start("tiny", "node")
	w := worker(lc.Worker.WorkerID, lc.LifecycleID, "ready")
	if code, body := x.hiveCall("POST", "/v2/pools/node/heartbeat", "hive-a", hb(w)); code != http.StatusOK {
		t.Fatalf("the holder's heartbeat: %d %s", code, body)
	}

	code, body := x.hiveCall("POST", "/v2/pools/register", "", hiveRegistration("node", "http://127.0.0.1:2", "node", "hive-b"))
	if code != http.StatusConflict {
		t.Fatalf("a second live hive with the pool id registered: %d %s", code, body)
	}
	for _, want := range []string{`"code":"pool_id_in_use"`, `pool id \"node\"`, "http://127.0.0.1:1", `node \"node\"`, "--pool-id"} {
		if !strings.Contains(body, want) {
			t.Errorf("refusal %s lacks %s", body, want)
		}
	}
	x.logs.wait(t, 0, "registration refused: another live hive holds the pool id",
		map[string]string{"pool_id": "node", "endpoint": "http://127.0.0.1:2", "holder_endpoint": "http://127.0.0.1:1"})
	// The refused hive's heartbeat, which lacks the holder's worker,
	// would mark its row lost: it is refused too.
	if code, body := x.hiveCall("POST", "/v2/pools/node/heartbeat", "hive-b", hb()); code != http.StatusConflict ||
		!strings.Contains(body, "pool_id_in_use") {
		t.Errorf("the refused hive's heartbeat: %d %s", code, body)
	}
	if r := x.row(lc.LifecycleID); r.Status != "RUNNING" {
		t.Errorf("the holder's worker's row: %+v", r)
	}
	if p := x.pool("node"); p.Endpoint != "http://127.0.0.1:1" || p.Status != "healthy" || len(p.Workers) != 1 {
		t.Errorf("pool after the refusal: %+v", p)
	}

	// The holder restarted (a new instance at its endpoint) registers
	// again; its old instance's messages are refused from then on.
	if code, body := x.hiveCall("POST", "/v2/pools/register", "", hiveRegistration("node", "http://127.0.0.1:1", "node", "hive-a2")); code != http.StatusOK {
		t.Fatalf("the holder registering again after a restart: %d %s", code, body)
	}
	if code, body := x.hiveCall("POST", "/v2/pools/node/heartbeat", "hive-a", hb(w)); code != http.StatusConflict {
		t.Errorf("the heartbeat of the holder's old instance: %d %s", code, body)
	}
	if code, body := x.hiveCall("POST", "/v2/pools/node/heartbeat", "hive-a2", hb(w)); code != http.StatusOK {
		t.Errorf("the heartbeat of the holder's new instance: %d %s", code, body)
	}
	if r := x.row(lc.LifecycleID); r.Status != "RUNNING" {
		t.Errorf("the worker's row after the holder's restart: %+v", r)
	}
}

// A pool whose holder stopped beating (unhealthy) is taken over by the
// hive that registers it next, audited as such; from then on the old
// holder's heartbeats, events and going offline are refused (409), so
// that a hive that comes back from a partition cannot mark the new
// holder's workers lost or take its pool offline.
func TestPoolOfASilentHiveIsTakenOver(t *testing.T) {
	x := startQueen(t, sqliteDir(t), "", func(c *Config) { c.HeartbeatTimeout = 300 * time.Millisecond })
	if code, body := x.hiveCall("POST", "/v2/pools/register", "", hiveRegistration("node", "http://127.0.0.1:1", "node", "hive-a")); code != http.StatusOK {
		t.Fatalf("first registration: %d %s", code, body)
	}
	x.logs.wait(t, 0, "pool status changed", map[string]string{"pool_id": "node", "to": "unhealthy"})
	if code, body := x.hiveCall("POST", "/v2/pools/register", "", hiveRegistration("node", "http://127.0.0.1:2", "node-b", "hive-b")); code != http.StatusOK {
		t.Fatalf("taking over the pool of a silent hive: %d %s", code, body)
	}
	lc := x.start("tiny", "node")
	w := worker(lc.Worker.WorkerID, lc.LifecycleID, "ready")
	if code, body := x.hiveCall("POST", "/v2/pools/node/heartbeat", "hive-b", api.Heartbeat{Workers: []api.Worker{w}}); code != http.StatusOK {
		t.Fatalf("the new holder's heartbeat: %d %s", code, body)
	}

	var audit api.AuditList
	x.ok("GET", "/api/admin/audit?target=node&limit=1", nil, http.StatusOK, &audit)
	if e := audit.Entries; len(e) != 1 || e[0].Action != "pool.register" ||
		!strings.HasPrefix(e[0].Reason, "taken over by another hive (the one at http://127.0.0.1:1 stopped beating") ||
		e[0].Metadata["previous_endpoint"] != "http://127.0.0.1:1" {
		t.Errorf("audit of the takeover: %+v", e)
	}

	for _, c := range []struct {
		path string
		body any
	}{
		{"/v2/pools/node/heartbeat", api.Heartbeat{}},
		{"/v2/internal/workers/events", api.WorkerEvent{PoolID: "node", WorkerID: w.WorkerID, LifecycleID: lc.LifecycleID,
			From: "ready", To: "failed", Reason: "the old hive's view", Worker: w}},
		{"/v2/pools/node/offline", api.PoolAction{Reason: "the hive stopped"}},
	} {
		code, body := x.hiveCall("POST", c.path, "hive-a", c.body)
		if code != http.StatusConflict || !strings.Contains(body, "pool_id_in_use") || !strings.Contains(body, "http://127.0.0.1:2") {
			t.Errorf("the old holder's POST %s: %d %s", c.path, code, body)
		}
	}
	// A hive older than the queen names no instance: refused too, while a
	// hive that names one holds the pool.
	if code, body := x.hiveCall("POST", "/v2/pools/node/heartbeat", "", api.Heartbeat{}); code != http.StatusConflict {
		t.Errorf("a heartbeat without an instance: %d %s", code, body)
	}
	if r := x.row(lc.LifecycleID); r.Status != "RUNNING" {
		t.Errorf("the new holder's worker's row: %+v", r)
	}
	if p := x.pool("node"); p.Endpoint != "http://127.0.0.1:2" || p.Status != "healthy" {
		t.Errorf("pool after the old holder's messages: %+v", p)
	}
}

// After a queen restart the holder of a pool is the one stored: another
// hive with its pool id is refused at registration (409), and so is every
// later call it makes — heartbeats, the heartbeat stream, events, a pull
// report, going offline — each changing nothing: the holder's worker's
// row stays RUNNING, the pool healthy. Before, a restarted queen knew no
// holder and let every call through: the refused hive's going offline
// took the pool down and failed the holder's worker's row.
func TestRefusedHiveChangesNothingAfterQueenRestart(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		dir, url := b.new(t)
		x := startQueen(t, dir, url)
		if code, body := x.hiveCall("POST", "/v2/pools/register", "", hiveRegistration("node", "http://127.0.0.1:1", "node", "hive-a")); code != http.StatusOK {
			t.Fatalf("registration: %d %s", code, body)
		}
		lc := x.start("tiny", "node")
		w := worker(lc.Worker.WorkerID, lc.LifecycleID, "ready")
		hb := api.Heartbeat{GPUs: []api.GPU{{ID: 0, Kind: "cpu", TotalBytes: 8 << 30, FreeBytes: 4 << 30}}, Workers: []api.Worker{w}}
		if code, body := x.hiveCall("POST", "/v2/pools/node/heartbeat", "hive-a", hb); code != http.StatusOK {
			t.Fatalf("heartbeat: %d %s", code, body)
		}
		x.q.Close()

		y := startQueen(t, dir, url)
		if code, body := y.hiveCall("POST", "/v2/pools/node/heartbeat", "hive-a", hb); code != http.StatusOK {
			t.Fatalf("the holder's heartbeat to the restarted queen: %d %s", code, body)
		}
		code, body := y.hiveCall("POST", "/v2/pools/register", "", hiveRegistration("node", "http://127.0.0.1:2", "node-b", "hive-b"))
		if code != http.StatusConflict || !strings.Contains(body, "pool_id_in_use") {
			t.Fatalf("another hive registering after the restart: %d %s", code, body)
		}
		for _, c := range []struct {
			path string
			body any
		}{
			{"/v2/pools/node/heartbeat", api.Heartbeat{}},
			{"/v2/internal/workers/events", api.WorkerEvent{PoolID: "node", WorkerID: w.WorkerID, LifecycleID: lc.LifecycleID,
				From: "ready", To: "failed", Reason: "the refused hive's view", Worker: w}},
			{"/v2/internal/models/pulls", api.ModelPull{ID: "pull-1", PoolID: "node", Model: "tiny", State: api.PullDone}},
			{"/v2/pools/node/offline", api.PoolAction{Reason: "the hive stopped"}},
		} {
			code, body := y.hiveCall("POST", c.path, "hive-b", c.body)
			if code != http.StatusConflict || !strings.Contains(body, "pool_id_in_use") || !strings.Contains(body, "http://127.0.0.1:1") {
				t.Errorf("the refused hive's POST %s: %d %s", c.path, code, body)
			}
		}
		// The heartbeat stream refuses its beats the same way.
		hc := &http.Client{}
		s, err := rpc.OpenStream(t.Context(), hc, rpc.Call{URL: y.url + "/v2/pools/node/beats", Header: http.Header{api.HiveInstanceHeader: {"hive-b"}}}, waitLimit)
		if err == nil {
			var ans api.HeartbeatAnswer
			err = s.Round(api.Heartbeat{}, &ans, waitLimit)
			s.Close()
		}
		if se := (*rpc.StatusError)(nil); !errors.As(err, &se) || se.Status != http.StatusConflict {
			t.Errorf("the refused hive's heartbeat stream: %v, want 409", err)
		}
		if r := y.row(lc.LifecycleID); r.Status != "RUNNING" {
			t.Errorf("the holder's worker's row after the refused hive's calls: %+v", r)
		}
		if p := y.pool("node"); p.Status != "healthy" || p.Endpoint != "http://127.0.0.1:1" || len(p.Workers) != 1 {
			t.Errorf("the pool after the refused hive's calls: %+v", p)
		}
	})
}
