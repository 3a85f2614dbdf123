package queen

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
)

// downHive is the queen's real HTTP hive client, with the model lists a
// hive gave before it died (the catalog's, as after a hive's SIGKILL).
type downHive struct{ HiveClient }

func (downHive) Models(context.Context, string) ([]api.Model, error) {
	return []api.Model{tinyModel}, nil
}

// deadEndpoint is an address where nothing listens: a connection to it
// is refused.
func deadEndpoint(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return "http://" + addr
}

// After a hive's SIGKILL, its pool stayed healthy until its lease ran
// out: each request made a new FAILED row against it, and API clients
// read the queen's internals ("POST http://127.0.0.1:19580/v2/workers/start:
// … connect: connection refused"). Now a start whose hive does not take
// the connection makes the pool unhealthy at once (audited, with the
// error), placement stops choosing it, the client learns the pool and not
// its address, and the hive's next heartbeat brings the pool back.
func TestStartOnADeadHiveMarksItsPoolUnhealthy(t *testing.T) {
	x := startQueen(t, sqliteDir(t), "", func(c *Config) { c.Hives = downHive{NewHTTPHiveClient("", time.Second)} })
	dead := deadEndpoint(t)
	x.registerAt("node-1", dead)

	req := map[string]any{"model": "tiny", "prompt": "Hello", "max_tokens": 1}
	for i := range 2 {
		code, body := x.do("POST", "/v1/completions", "", req)
		if code/100 == 2 || strings.Contains(string(body), "127.0.0.1") || strings.Contains(string(body), "connection refused") {
			t.Errorf("request %d: %d %s; want a refusal without the hive's address", i, code, body)
		}
		t.Logf("request %d: %d %s", i, code, body)
	}
	p := x.pool("node-1")
	if p.Status != "unhealthy" {
		t.Fatalf("pool after a start its hive did not answer: %+v", p)
	}
	if rows := x.storeRows(); len(rows) != 1 || rows[0].Status != rowFailed || !strings.Contains(rows[0].Reason, "did not answer") ||
		!strings.Contains(rows[0].Reason, "connection refused") {
		t.Errorf("rows after two requests: %+v; want one FAILED row, with the error", rows)
	}
	var audit api.AuditList
	x.ok("GET", "/api/admin/audit?target=node-1&limit=1", nil, http.StatusOK, &audit)
	if e := audit.Entries; len(e) != 1 || e[0].Action != "pool.unhealthy" || e[0].Actor != "queen" ||
		!strings.Contains(e[0].Reason, "its hive did not answer a start") || !strings.Contains(e[0].Reason, dead) ||
		!strings.Contains(e[0].Reason, "connection refused") {
		t.Errorf("audit of the pool: %+v", e)
	}
	x.logs.wait(t, 0, "hive did not answer a start; pool marked unhealthy", map[string]string{"pool_id": "node-1"})

	// An operator's start on a pool whose hive is dead answers the same.
	x.registerAt("node-2", deadEndpoint(t))
	code, body := x.do("POST", "/api/admin/workers", "", api.AdminWorkerRequest{Action: "start", Model: "tiny", PoolID: "node-2", Reason: "test"})
	if code != http.StatusBadGateway || !strings.Contains(string(body), `"code":"hive_unreachable"`) ||
		!strings.Contains(string(body), "pool node-2 did not answer (marked unhealthy); lifecycle row wk-") ||
		strings.Contains(string(body), "127.0.0.1") {
		t.Errorf("an operator's start on a dead hive: %d %s", code, body)
	}
	if p := x.pool("node-2"); p.Status != "unhealthy" {
		t.Errorf("pool node-2 after its start: %s", p.Status)
	}

	// The hive's heartbeat (it came back) makes its pool healthy again.
	x.beat("node-1")
	if p := x.pool("node-1"); p.Status != "healthy" {
		t.Errorf("pool after its hive's heartbeat: %s", p.Status)
	}
}
