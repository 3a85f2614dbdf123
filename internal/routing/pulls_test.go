package routing

import (
	"strings"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/registry"
)

// planPull picks the pool placement would pick if the pools had the
// file: the most free memory among the healthy, allowed pools whose list
// is known, leaving out those in a pull's backoff; it waits for a pull
// that runs on a pool the request may use.
func TestPlanPull(t *testing.T) {
	const gib = 1 << 30
	pool := func(id string, st registry.Status, free uint64) registry.Pool {
		return registry.Pool{ID: id, Status: st, GPUs: []api.GPU{{ID: 0, FreeBytes: free}}}
	}
	pools := []registry.Pool{pool("a", registry.Healthy, 4*gib), pool("b", registry.Healthy, 6*gib), pool("c", registry.Unhealthy, 60*gib),
		pool("d", registry.Healthy, 50*gib), pool("e", registry.Healthy, 1*gib)}
	other := map[string]api.Model{"tiny": {Ref: "tiny", SizeBytes: 1}}
	// d's list is not known; e has the model, too big for its device.
	models := map[string]map[string]api.Model{"a": other, "b": other, "c": other, "e": {"big": {Ref: "big", SizeBytes: 2 * gib}}}
	for _, tc := range []struct {
		name    string
		req     PlaceRequest
		running []string
		backoff map[string]string
		want    string // the pool to pull on, "wait POOL", or "error: …" (a substring)
	}{
		{name: "most free memory", want: "b"},
		{name: "model's pools", req: PlaceRequest{Pools: []string{"a", "e"}}, want: "a"},
		{name: "pinned", req: PlaceRequest{Pool: "a"}, want: "a"},
		{name: "backoff", backoff: map[string]string{"b": "pulling big failed: gone"}, want: "a"},
		{name: "all in backoff", req: PlaceRequest{Pools: []string{"b"}}, backoff: map[string]string{"b": "pulling big failed: gone"}, want: "error: b: pulling big failed: gone"},
		{name: "a pull runs", running: []string{"a"}, want: "wait a"},
		{name: "a pull runs elsewhere", req: PlaceRequest{Pool: "b"}, running: []string{"a"}, want: "b"},
		{name: "a pull runs on an unhealthy pool", running: []string{"c"}, want: "b"},
		{name: "no room anywhere", req: PlaceRequest{Pools: []string{"e"}}, want: "error: e: no device has room for big"},
		// d registered a moment ago: its list is coming.
		{name: "only a pool whose list is not known", req: PlaceRequest{Pool: "d"}, want: "wait d"},
		{name: "no room, a list not known", req: PlaceRequest{Pools: []string{"d", "e"}}, want: "wait d"},
		{name: "a list not known, in backoff", req: PlaceRequest{Pool: "d"}, backoff: map[string]string{"d": "pulling big failed: gone"}, want: "error: d: pulling big failed: gone"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := tc.req
			req.Model, req.Models = "big", models
			d := planPull(MostFreeMemory{}, pools, req, tc.running, tc.backoff)
			var got string
			switch {
			case d.Err != nil:
				got = "error: " + d.Err.Error()
			case d.Wait:
				got = "wait " + d.Pool.ID
			default:
				got = d.Pool.ID
			}
			if got != tc.want && !(strings.HasPrefix(tc.want, "error: ") && strings.Contains(got, strings.TrimPrefix(tc.want, "error: "))) {
				t.Errorf("planPull = %q, want %q", got, tc.want)
			}
		})
	}
}

// One pull per pool and model at a time; a failed one backs off, and a
// late word of its start does not bring it back.
func TestPullsOnePerPoolAndModel(t *testing.T) {
	p := newPulls()
	now := time.Now()
	if !p.reserve("a", "big", "queen", "why", "hf://o/r:Q4_K_M", now) || p.reserve("a", "big", "queen", "why", "hf://o/r:Q4_K_M", now) {
		t.Fatal("reserve: want the first, not the second")
	}
	p.ended(api.ModelPull{ID: "p1", PoolID: "a", Ref: "hf://o/r:Q4_K_M", Model: "big", State: api.PullFailed, Error: "gone"}, "", now)
	p.started("a", api.ModelPull{ID: "p1", Model: "big", State: api.PullRunning}, "queen", "why")
	running, backoff := p.forModel("big", now)
	// The backoff's reason is among a placement's reasons, which API
	// clients read: the source and the hive's error are for the log.
	if len(running) != 0 || !strings.Contains(backoff["a"], "pulling big on pool a failed; not pulled there again before") {
		t.Errorf("after a failure: running %v, backoff %v", running, backoff)
	}
	if f := p.takeFailed(); len(f) != 1 || f[0].pool != "a" || !strings.Contains(f[0].why, "pulling big from hf://o/r:Q4_K_M on pool a failed: gone") ||
		f[0].public != "pulling big on pool a failed" {
		t.Errorf("failures handed to the controller: %+v", f)
	}
	if _, backoff := p.forModel("big", now.Add(pullBackoff(1))); len(backoff) != 0 {
		t.Errorf("backoff after %s: %v", pullBackoff(1), backoff)
	}
}
