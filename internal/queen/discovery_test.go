package queen

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/apiary-llm/apiary/internal/api"
)

// A caller without a token learns nothing of apiary's own API: every
// method on every path under /v2/ and /api/admin/, routes that exist,
// methods they do not take and paths that do not exist alike, is 401
// (never 405 or 404), when the queen has tokens. With a token, a method a
// path does not take is 405 and a path that does not exist 404.
func TestOwnAPINeedsATokenBeforeItSaysWhatExists(t *testing.T) {
	x := startQueen(t, sqliteDir(t), "", func(c *Config) {
		c.Tokens = Tokens{API: "api-token-0123456789", Admin: "admin-token-0123456789", Cluster: "cluster-token-0123456789"}
	})
	x.register("a")
	paths := []string{"/v2/pools", "/v2/pools/a", "/v2/pools/nope", "/v2/pools/a/heartbeat", "/v2/pools/a/drain", "/v2/pools/register",
		"/v2/internal/workers/events", "/v2/workers/claim", "/v2/nothing", "/v2/", "/api/admin/workers", "/api/admin/workers/wk-0000000000000000",
		"/api/admin/audit", "/api/admin/models/m", "/api/admin/nodes", "/api/admin/shutdown", "/api/admin/nothing", "/api/admin/"}
	methods := []string{"GET", "POST", "PUT", "PATCH", "DELETE"}
	for _, path := range paths {
		for _, method := range methods {
			for _, token := range []string{"", "wrong-token-0123456789", "api-token-0123456789"} {
				status, body := x.do(method, path, token, nil)
				if status != http.StatusUnauthorized {
					t.Errorf("%s %s with token %q: %d %s, want 401", method, path, token, status, body)
				}
			}
		}
	}
	for _, tc := range []struct {
		method, path string
		status       int
	}{
		{"POST", "/v2/pools/a", http.StatusMethodNotAllowed},
		{"PUT", "/v2/pools/a", http.StatusMethodNotAllowed},
		{"PATCH", "/v2/pools/a", http.StatusMethodNotAllowed},
		{"GET", "/v2/nothing", http.StatusNotFound},
		{"GET", "/api/admin/nothing", http.StatusNotFound},
	} {
		if status, body := x.do(tc.method, tc.path, x.cfg.Tokens.Admin, nil); status != tc.status {
			t.Errorf("%s %s with the admin token: %d %s, want %d", tc.method, tc.path, status, body, tc.status)
		}
	}
}

// Two pools cannot share an endpoint: the second registration is 409
// endpoint_in_use naming the pool that has it, while that pool's hive is
// alive. The same hive registering again (its pool id, its endpoint) is
// welcome, and so is a hive at the endpoint of a pool that went offline.
func TestSecondPoolAtAnEndpointIsRefused(t *testing.T) {
	x := startQueen(t, sqliteDir(t), "")
	reg := func(id, endpoint string) (int, []byte) {
		return x.do("POST", "/v2/pools/register", "", api.RegisterPool{PoolID: id, Endpoint: endpoint, NodeID: id, Version: "t",
			GPUs: []api.GPU{{ID: 0, Kind: "cpu", TotalBytes: 8 << 30, FreeBytes: 4 << 30}}})
	}
	if status, body := reg("a", "http://10.0.0.1:9200"); status != http.StatusOK {
		t.Fatalf("first registration: %d %s", status, body)
	}
	status, body := reg("b", "http://10.0.0.1:9200")
	var e api.Error
	_ = json.Unmarshal(body, &e)
	if status != http.StatusConflict || e.Error.Code != "endpoint_in_use" || !strings.Contains(e.Error.Message, `pool "a"`) {
		t.Errorf("a second pool at the endpoint: %d %s, want 409 endpoint_in_use naming pool a", status, body)
	}
	if p, ok := x.q.reg.Get("b"); ok {
		t.Errorf("pool b registered anyway: %+v", p)
	}
	if status, body := reg("a", "http://10.0.0.1:9200"); status != http.StatusOK {
		t.Errorf("the same hive registering again: %d %s", status, body)
	}
	// Pool a goes offline: its endpoint is free.
	if status, body := x.do("POST", "/v2/pools/a/offline", "", nil); status != http.StatusOK && status != http.StatusNoContent {
		t.Fatalf("offline: %d %s", status, body)
	}
	if status, body := reg("b", "http://10.0.0.1:9200"); status != http.StatusOK {
		t.Errorf("a hive at the endpoint of an offline pool: %d %s", status, body)
	}
}
