package queen

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/openai"
)

// A request pinned to a pool (X-Apiary-Pool, apiary infer --node) is
// served only there: with a worker of its model on another pool, the
// controller places one on the pinned pool (the other pools' reason in
// the audit says so). A pool that is unknown, not healthy, or without the
// model is answered at once.
func TestRoutePinnedToAPool(t *testing.T) {
	x, mh := routeQueen(t, map[string][]api.Model{
		"http://hive-a": {tinyModel},
		"http://hive-b": {tinyModel},
		"http://hive-c": {{Ref: "other", SizeBytes: 1}},
		"http://hive-d": {tinyModel},
	})
	for _, id := range []string{"a", "b", "c", "d"} {
		x.registerAt(id, "http://hive-"+id)
		x.logs.wait(t, 0, "hive model list read", map[string]string{"pool_id": id})
	}
	x.ok("POST", "/v2/pools/d/drain", api.PoolAction{Reason: "maintenance"}, http.StatusOK, nil)
	onA := newFakeWorker(t, tokens(2))
	aID := x.readyWorker("a", onA.URL)
	for range len(mh.started) {
		<-mh.started
	}

	// Unpinned: a's worker serves it, nothing is placed.
	resp := x.post(t.Context(), "/v1/completions", streamBody)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get(api.WorkerHeader) != aID {
		t.Fatalf("unpinned request: %d from %q, want a's worker %s", resp.StatusCode, resp.Header.Get(api.WorkerHeader), aID)
	}

	// Pinned to b: a worker is placed on b and serves it.
	onB := newFakeWorker(t, tokens(2))
	resp, req := x.servedByPlacement(mh, "b", onB.URL, api.PoolHeader, "b")
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get(api.WorkerHeader) != req.LifecycleID || onB.count() != 1 || onA.count() != 1 {
		t.Fatalf("pinned request: %d from %q (a served %d, b %d): %s", resp.StatusCode, resp.Header.Get(api.WorkerHeader), onA.count(), onB.count(), body)
	}
	var audit api.AuditList
	x.ok("GET", "/api/admin/audit?target="+req.LifecycleID+"&action=worker.start", nil, http.StatusOK, &audit)
	if len(audit.Entries) != 1 {
		t.Fatalf("start audit %+v", audit)
	}
	placement, _ := audit.Entries[0].Metadata["placement"].(map[string]any)
	rejected, _ := placement["rejected"].(map[string]any)
	if rejected["a"] != "the request is pinned to pool b" || !strings.Contains(audit.Entries[0].Reason, "tiny on pool b") {
		t.Errorf("start audit entry %+v", audit.Entries[0])
	}
	// Pinned to a: a's worker, though b's has fewer requests.
	resp = x.post(t.Context(), "/v1/completions", streamBody, api.PoolHeader, "a")
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.Header.Get(api.WorkerHeader) != aID {
		t.Errorf("request pinned to a went to %q", resp.Header.Get(api.WorkerHeader))
	}

	for _, tc := range []struct {
		pool, code string
		status     int
		says       string
	}{
		{"nope", "pool_not_found", http.StatusNotFound, `no pool \"nope\" is registered`},
		{"c", "model_not_found", http.StatusNotFound, `pool c does not have model \"tiny\"`},
		{"d", "pool_unavailable", http.StatusServiceUnavailable, "pool d is draining"},
		{strings.Repeat("n", 300), openai.CodeInvalidValue, http.StatusBadRequest, "must be a pool id"},
	} {
		resp := x.post(t.Context(), "/v1/completions", `{"model":"tiny","prompt":"hi"}`, api.PoolHeader, tc.pool)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if status := resp.StatusCode; status != tc.status || errorCode(t, body) != tc.code || !bytes.Contains(body, []byte(tc.says)) {
			t.Errorf("pinned to %q: %d %s, want %d %s saying %q", tc.pool, resp.StatusCode, body, tc.status, tc.code, tc.says)
		}
	}
	select {
	case r := <-mh.started:
		t.Errorf("a worker was placed for a refused request: %+v", r)
	default:
	}

	// GET /v1/models with the header: what that pool can serve.
	for pool, want := range map[string]string{"c": "other", "a": "tiny", "nope": "pool_not_found"} {
		req, _ := http.NewRequest(http.MethodGet, x.url+"/v1/models", nil)
		req.Header.Set(api.PoolHeader, pool)
		resp, err := x.hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var list openai.ModelList
		if pool == "nope" {
			if resp.StatusCode != http.StatusNotFound || errorCode(t, body) != want {
				t.Errorf("models of pool nope: %d %s", resp.StatusCode, body)
			}
		} else if json.Unmarshal(body, &list) != nil || len(list.Data) != 1 || list.Data[0].ID != want {
			t.Errorf("models of pool %s: %d %s, want only %s", pool, resp.StatusCode, body, want)
		}
	}
}

// Regression: every heartbeat wakes the demand controller, which used to
// scan every pool each time (a queen with 2,000 pools took more than a
// core). While no request waits, a wake-up does nothing at all; a waiting
// request makes it weigh the demand.
func TestControllerIdleWhileNothingWaits(t *testing.T) {
	x, mh := routeQueen(t, map[string][]api.Model{"http://hive-a": {tinyModel}, "http://hive-b": {tinyModel}})
	x.registerAt("a", "http://hive-a")
	x.registerAt("b", "http://hive-b")
	// Both pools' model lists known: the placement below must not find
	// a's unread and go to b.
	for _, pool := range []string{"a", "b"} {
		x.logs.wait(t, 0, "hive model list read", map[string]string{"pool_id": pool})
	}
	for range 20 {
		x.beat("a")
		x.beat("b")
	}
	if got := metricLine(x, "apiary_queen_controller_rounds_total"); got != "0" {
		t.Fatalf("controller rounds after heartbeats with nothing waiting: %q, want 0", got)
	}
	fw := newFakeWorker(t, tokens(1))
	resp, _ := x.servedByPlacement(mh, "a", fw.URL)
	resp.Body.Close()
	if got := metricLine(x, "apiary_queen_controller_rounds_total"); got == "0" || got == "" {
		t.Errorf("controller rounds with a request waiting: %q, want at least 1", got)
	}
}
