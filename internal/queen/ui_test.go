package queen

import (
	"bufio"
	"encoding/json"
	"maps"
	"net/http"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/dashboard"
	"github.com/apiary-llm/apiary/internal/registry"
)

// uiStream is a page's stream of dashboard messages, read as they come.
type uiStream struct {
	t    *testing.T
	resp *http.Response
	msgs chan dashboard.Message
}

func (x *tq) uiStream(t *testing.T) *uiStream {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, x.url+"/api/admin/ui/events", nil)
	if x.cfg.Tokens.Admin != "" {
		req.Header.Set("Authorization", "Bearer "+x.cfg.Tokens.Admin)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("events: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	s := &uiStream{t: t, resp: resp, msgs: make(chan dashboard.Message, 64)}
	t.Cleanup(func() { resp.Body.Close() })
	go func() {
		defer close(s.msgs)
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			data, ok := strings.CutPrefix(sc.Text(), "data: ")
			if !ok {
				continue
			}
			var m dashboard.Message
			if json.Unmarshal([]byte(data), &m) == nil {
				s.msgs <- m
			}
		}
	}()
	return s
}

// until reads messages until one sets key to a value ok accepts.
func (s *uiStream) until(key string, ok func(json.RawMessage) bool) dashboard.Message {
	s.t.Helper()
	deadline := time.After(waitLimit)
	for {
		select {
		case m, open := <-s.msgs:
			if !open {
				s.t.Fatalf("the stream ended before %s changed as expected", key)
			}
			if v, set := m.Set[key]; set && ok(v) {
				return m
			}
		case <-deadline:
			s.t.Fatalf("%s did not change as expected within %s", key, waitLimit)
		}
	}
}

func hasStatus(status string) func(json.RawMessage) bool {
	return func(v json.RawMessage) bool {
		var r struct{ Status string }
		return json.Unmarshal(v, &r) == nil && r.Status == status
	}
}

// The dashboard's data in process, with a fake hive: the snapshot has the
// pool (its device and whether a worker can go there), the worker's row
// and its model (named and aliased by the model config); the stream starts with every item, then sends a row's
// change as a delta, and a pool that drains makes its device unusable,
// saying why. With tokens, both take only the admin token; the page's
// files take none and carry the CSP.
func TestDashboardSnapshotAndStream(t *testing.T) {
	tokens := Tokens{API: "api-t-0123456789", Admin: "admin-t-0123456789", Cluster: "cluster-t-0123456789"}
	path := filepath.Join(t.TempDir(), "models.yaml")
	writeConfig(t, path, "models:\n  small:\n    file: tiny\n    aliases: [chat, gpt-4o-mini]\n  big:\n    file: large\n")
	x := startQueen(t, sqliteDir(t), "", func(c *Config) { c.Tokens, c.ModelsFile = tokens, path })
	x.register("p1")
	id := x.start("tiny", "p1").LifecycleID

	for _, tok := range []string{"", tokens.API, tokens.Cluster} {
		for _, path := range []string{"/api/admin/ui/snapshot", "/api/admin/ui/events"} {
			if status, body := x.do("GET", path, tok, nil); status != http.StatusUnauthorized {
				t.Errorf("GET %s with %q: %d %s, want 401", path, tok, status, body)
			}
		}
	}
	for _, path := range []string{"/ui/", "/ui/app.js", "/ui/app.css"} {
		req, _ := http.NewRequest("GET", x.url+path, nil)
		resp, err := x.hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Security-Policy") != dashboard.CSP || resp.Header.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("GET %s: %d, headers %v", path, resp.StatusCode, resp.Header)
		}
	}
	if status, _ := x.do("GET", "/ui/../queen.go", "", nil); status != http.StatusNotFound {
		t.Errorf("a path outside the page: %d", status)
	}

	var snap map[string]json.RawMessage
	x.ok("GET", "/api/admin/ui/snapshot", nil, http.StatusOK, &snap)
	var pool uiPool
	var row api.LifecycleRow
	var model uiModel
	for key, v := range map[string]any{"pool/p1": &pool, "worker/" + id: &row, "model/tiny": &model} {
		if err := json.Unmarshal(snap[key], v); err != nil {
			t.Fatalf("%s: %v in %s", key, err, snap[key])
		}
	}
	if pool.Status != "healthy" || len(pool.Devices) != 1 || !pool.Devices[0].Usable || pool.Devices[0].FreeBytes != 4<<30 {
		t.Errorf("pool: %+v", pool)
	}
	if row.Status != "STARTING" || row.PoolID != "p1" {
		t.Errorf("row: %+v", row)
	}
	if model.Name != "small" || strings.Join(model.Aliases, ",") != "chat,gpt-4o-mini" || !model.Configured ||
		model.Workers["STARTING"] != 1 || strings.Join(model.RunningOn, ",") != "p1" {
		t.Errorf("model: %+v", model)
	}
	var big uiModel
	if err := json.Unmarshal(snap["model/large"], &big); err != nil || big.Name != "big" || big.Workers != nil {
		t.Errorf("a configured model without workers: %+v (%v)", big, err)
	}

	s := x.uiStream(t)
	first := <-s.msgs
	if !first.Full || first.Set["worker/"+id] == nil || first.Set["pool/p1"] == nil || first.Set["queen"] == nil {
		t.Fatalf("first message: %+v", first)
	}
	x.event(api.WorkerEvent{PoolID: "p1", WorkerID: "worker-1", LifecycleID: id, From: "starting", To: "ready", Reason: "ready",
		Worker: worker("worker-1", id, "ready")})
	m := s.until("worker/"+id, hasStatus("RUNNING"))
	// The rates ("stats"), the heartbeats' times ("beats") and the
	// queen's summary change with the clock and may ride along in the
	// same push; the rest is the change.
	changed := 0
	for k := range m.Set {
		if k != "stats" && k != "queen" && k != "beats" {
			changed++
		}
	}
	if m.Full || changed > 3 {
		t.Errorf("the change came as %d items (full %v): %v", changed, m.Full, slices.Collect(maps.Keys(m.Set)))
	}
	x.ok("POST", "/v2/pools/p1/drain", map[string]string{"reason": "dashboard test"}, http.StatusOK, nil)
	m = s.until("pool/p1", hasStatus("draining"))
	if err := json.Unmarshal(m.Set["pool/p1"], &pool); err != nil || pool.Devices[0].Usable || pool.Devices[0].Why != "the pool is draining" {
		t.Errorf("the drained pool's device: %+v (%v)", pool.Devices, err)
	}
}

// The audit log is filtered by actor, action, target and a time window
// (since and until, durations or RFC 3339), on SQLite and PostgreSQL;
// bad values are 400s naming the parameter.
func TestAuditFilters(t *testing.T) {
	eachBackend(t, testAuditFilters)
}

func testAuditFilters(t *testing.T, b backend) {
	x := startOn(t, b)
	x.register("p1")
	id := x.start("tiny", "p1").LifecycleID
	mid := time.Now()
	x.ok("POST", "/v2/pools/p1/drain", map[string]string{"reason": "filters"}, http.StatusOK, nil)

	list := func(q url.Values) []string {
		t.Helper()
		var out api.AuditList
		x.ok("GET", "/api/admin/audit?"+q.Encode(), nil, http.StatusOK, &out)
		var got []string
		for _, e := range out.Entries {
			got = append(got, e.Actor+" "+e.Action+" "+e.Target)
		}
		return got
	}
	cases := []struct {
		q    url.Values
		want string
	}{
		{url.Values{"actor": {"admin"}}, "admin pool.drain p1|admin worker.start " + id},
		{url.Values{"actor": {"admin"}, "action": {"worker.start"}}, "admin worker.start " + id},
		{url.Values{"actor": {"hive:p1"}}, "hive:p1 pool.register p1"},
		{url.Values{"actor": {"nobody"}}, ""},
		{url.Values{"target": {"p1"}, "since": {mid.Format(time.RFC3339Nano)}}, "admin pool.drain p1"},
		{url.Values{"actor": {"admin"}, "until": {mid.Format(time.RFC3339Nano)}}, "admin worker.start " + id},
		{url.Values{"actor": {"admin"}, "until": {"1h"}}, ""},
	}
	for _, c := range cases {
		if got := strings.Join(list(c.q), "|"); got != c.want {
			t.Errorf("%s: %q, want %q", c.q.Encode(), got, c.want)
		}
	}
	for q, want := range map[string]string{"until=yesterday": "until", "since=-1h": "since", "actor=%01": "actor", "who=admin": "unknown query parameter"} {
		if status, body := x.do("GET", "/api/admin/audit?"+q, "", nil); status != http.StatusBadRequest || !strings.Contains(string(body), want) {
			t.Errorf("%s: %d %s", q, status, body)
		}
	}
}

// The dashboard shows a device its hive marks unusable as not usable,
// with the hive's reason.
func TestUIDeviceUnusableByItsHive(t *testing.T) {
	const why = "memory leaked by worker-1 (pid 42)"
	p := registry.Pool{ID: "p1", Status: registry.Healthy, GPUs: []api.GPU{{ID: 0, Kind: "cuda", TotalBytes: 8 << 30, FreeBytes: 8 << 30, Unusable: why}}}
	got := uiPoolOf(p, nil)
	if len(got.Devices) != 1 || got.Devices[0].Usable || got.Devices[0].Why != why {
		t.Errorf("devices: %+v", got.Devices)
	}
}

// A hive's memory_leaked event becomes a worker.memory_leaked audit entry
// with its reason; a leak without a reason, or an unknown kind, is a 400.
func TestMemoryLeakedEventIsAudited(t *testing.T) {
	x := startQueen(t, sqliteDir(t), "")
	x.register("p1")
	const why = "memory leaked by worker-1 (pid 42): the driver still lists it on device 0 with 1.0 GiB"
	ack := x.event(api.WorkerEvent{Kind: api.EventMemoryLeaked, PoolID: "p1", WorkerID: "worker-1", Reason: why,
		Worker: api.Worker{WorkerID: "worker-1", PID: 42, Status: "stopped"}})
	if !ack.Applied {
		t.Errorf("ack %+v", ack)
	}
	var out api.AuditList
	x.ok("GET", "/api/admin/audit?action=worker.memory_leaked", nil, http.StatusOK, &out)
	if len(out.Entries) != 1 || out.Entries[0].Reason != why || out.Entries[0].Target != "worker:worker-1" || out.Entries[0].Actor != "hive:p1" {
		t.Errorf("audit: %+v", out.Entries)
	}
	for _, ev := range []api.WorkerEvent{
		{Kind: api.EventMemoryLeaked, PoolID: "p1", WorkerID: "worker-1"},
		{Kind: "melted", PoolID: "p1", WorkerID: "worker-1", Reason: "x"},
	} {
		if status, body := x.do("POST", "/v2/internal/workers/events", x.cfg.Tokens.Cluster, ev); status != http.StatusBadRequest {
			t.Errorf("event %+v: %d %s, want 400", ev, status, body)
		}
	}
}
