package queen

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
)

// pullHive is the fake hive with model lists that also takes pulls: each
// pull asked is recorded and answered as running; the test ends it.
type pullHive struct {
	*modelHive
	asked chan api.PullModelRequest // every pull asked, with its endpoint in Reason

	mu    sync.Mutex
	pulls int // guarded by mu
}

func (h *pullHive) PullModel(_ context.Context, endpoint string, req api.PullModelRequest) (api.ModelPull, error) {
	h.mu.Lock()
	h.pulls++
	n := h.pulls
	h.mu.Unlock()
	req.Reason = endpoint
	h.asked <- req
	return api.ModelPull{ID: "pull-" + string(rune('0'+n)), Ref: req.Ref, Model: req.Name, State: api.PullRunning, TotalBytes: -1}, nil
}

// ModelPulls answers the first pull as half written.
func (h *pullHive) ModelPulls(context.Context, string) ([]api.ModelPull, error) {
	return []api.ModelPull{{ID: "pull-1", Ref: "hf://org/big-GGUF:Q4_K_M", Model: "big", State: api.PullRunning, WrittenBytes: 50, TotalBytes: 100}}, nil
}

func (h *pullHive) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.pulls
}

// pullQueen runs an in-process queen with the model config config and
// pools a (4 GiB free) and b (6 GiB free) that have tiny only.
func pullQueen(t *testing.T, config string) (*tq, *pullHive) {
	path := filepath.Join(t.TempDir(), "models.yaml")
	writeConfig(t, path, config)
	var ph *pullHive
	hives := map[string][]api.Model{"http://hive-a": {tinyModel}, "http://hive-b": {tinyModel}}
	x, _ := routeQueen(t, hives, func(c *Config) {
		c.ModelsFile = path
		ph = &pullHive{modelHive: c.Hives.(*modelHive), asked: make(chan api.PullModelRequest, 16)}
		c.Hives = ph
	})
	for id, free := range map[string]uint64{"a": 4 << 30, "b": 6 << 30} {
		x.ok("POST", "/v2/pools/register", api.RegisterPool{PoolID: id, Endpoint: "http://hive-" + id, NodeID: id, Version: "t",
			GPUs: []api.GPU{{ID: 0, Kind: "cpu", TotalBytes: 8 << 30, FreeBytes: free}}}, http.StatusOK, nil)
	}
	return x, ph
}

func (h *pullHive) next(t *testing.T) api.PullModelRequest {
	t.Helper()
	select {
	case req := <-h.asked:
		return req
	case <-time.After(waitLimit):
		t.Fatal("no pull asked of a hive")
		return api.PullModelRequest{}
	}
}

// pullAnswer is a request's status and body.
type pullAnswer struct {
	status int
	body   string
}

func (x *tq) ask(body string) <-chan pullAnswer {
	out := make(chan pullAnswer, 1)
	go func() {
		resp := x.post(context.Background(), "/v1/completions", body)
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		out <- pullAnswer{resp.StatusCode, string(data)}
	}()
	return out
}

func await(t *testing.T, c <-chan pullAnswer) pullAnswer {
	t.Helper()
	select {
	case a := <-c:
		return a
	case <-time.After(waitLimit):
		t.Fatal("no answer")
		return pullAnswer{}
	}
}

// A request for a configured model with a source that no pool has makes
// the queen pull it, once, on the pool placement would choose (the most
// free memory); the requests wait, and once the hive reports the pull
// and lists the model a worker is placed there and serves them.
func TestConfiguredModelPulledOnThePlacementsPool(t *testing.T) {
	x, ph := pullQueen(t, "models:\n  big:\n    source: hf://org/big-GGUF:Q4_K_M\n    aliases: [gpt-big]\n")
	first, second := x.ask(`{"model":"gpt-big","prompt":"hi"}`), x.ask(`{"model":"big","prompt":"hi"}`)
	req := ph.next(t)
	if req.Reason != "http://hive-b" || req.Ref != "hf://org/big-GGUF:Q4_K_M" || req.Name != "big" {
		t.Fatalf("pull asked %+v, want big from its source on hive-b", req)
	}
	x.logs.wait(t, 0, "model pull started", map[string]string{"pool_id": "b", "model_ref": "big", "actor": "queen"})
	pulls := x.q.routing.Pulls()
	if len(pulls) != 1 || pulls[0].PoolID != "b" || pulls[0].Model != "big" || pulls[0].Actor != "queen" {
		t.Errorf("pulls followed: %+v", pulls)
	}
	var pl api.PoolList
	x.ok("GET", "/v2/pools", nil, http.StatusOK, &pl)
	for _, p := range pl.Pools {
		var got []string
		for _, mp := range p.Pulls {
			got = append(got, fmt.Sprintf("%s %s %d/%d", mp.Model, mp.State, mp.WrittenBytes, mp.TotalBytes))
		}
		if want := map[string]string{"a": "", "b": "big pulling 50/100"}[p.PoolID]; strings.Join(got, ",") != want {
			t.Errorf("pool %s lists pulls %v, want %q", p.PoolID, got, want)
		}
	}

	ph.mu.Lock()
	ph.models["http://hive-b"] = []api.Model{tinyModel, {Ref: "big", SizeBytes: 2 << 20}}
	ph.mu.Unlock()
	x.ok("POST", "/v2/internal/models/pulls", api.ModelPull{ID: "pull-1", PoolID: "b", Ref: req.Ref, Model: "big", State: api.PullDone}, http.StatusNoContent, nil)
	start := <-ph.started
	x.logs.wait(t, 0, "worker placed on demand", map[string]string{"lifecycle_id": start.LifecycleID})
	row := x.row(start.LifecycleID)
	if row.PoolID != "b" || start.ModelRef != "big" {
		t.Fatalf("placed %s on %s, want big on b", start.ModelRef, row.PoolID)
	}
	fw := newFakeWorker(t, tokens(1))
	now := time.Now().UTC()
	if ack := x.event(api.WorkerEvent{PoolID: "b", WorkerID: row.WorkerID, LifecycleID: start.LifecycleID, From: "starting", To: "ready", Reason: "test", At: now,
		Worker: api.Worker{WorkerID: row.WorkerID, LifecycleID: start.LifecycleID, ModelRef: "big", URI: fw.URL, Status: "ready", PID: 1, StartedAt: now}}); !ack.Applied {
		t.Fatalf("ready event not applied: %+v", ack)
	}
	for _, c := range []<-chan pullAnswer{first, second} {
		if a := await(t, c); a.status != http.StatusOK {
			t.Errorf("a request that waited for the pull: %d %s", a.status, a.body)
		}
	}
	if n := ph.count(); n != 1 {
		t.Errorf("%d pulls asked, want 1", n)
	}
	if p := x.q.routing.Pulls(); len(p) != 0 {
		t.Errorf("pulls followed after the end: %+v", p)
	}
}

// A pull that fails fails the requests that waited for it at once, with
// its reason; a new request within the pull's backoff is refused with
// that reason too, and the model is not pulled again on that pool.
func TestFailedPullFailsItsWaitersAndBacksOff(t *testing.T) {
	x, ph := pullQueen(t, "models:\n  big:\n    source: hf://org/big-GGUF:Q4_K_M\n    pools: [a]\n")
	waiting := x.ask(`{"model":"big","prompt":"hi"}`)
	req := ph.next(t)
	if req.Reason != "http://hive-a" {
		t.Fatalf("pulled on %s, want hive-a (the model's only pool)", req.Reason)
	}
	x.ok("POST", "/v2/internal/models/pulls", api.ModelPull{ID: "pull-1", PoolID: "a", Ref: req.Ref, Model: "big", State: api.PullFailed,
		Error: "org/big-GGUF has no GGUF file of quantization Q4_K_M"}, http.StatusNoContent, nil)
	// A pull that failed on the hive is told to API clients in words (the
	// hive's error may name its files); the queen's log has the whole.
	const why = "pulling big on pool a failed"
	const detail = "pulling big from hf://org/big-GGUF:Q4_K_M on pool a failed: org/big-GGUF has no GGUF file of quantization Q4_K_M"
	a := await(t, waiting)
	if a.status != http.StatusServiceUnavailable || !strings.Contains(a.body, why) {
		t.Errorf("the waiting request: %d %s, want 503 with %q", a.status, a.body, why)
	}
	a = await(t, x.ask(`{"model":"big","prompt":"hi"}`))
	if a.status != http.StatusServiceUnavailable || !strings.Contains(a.body, why) {
		t.Errorf("a request within the backoff: %d %s, want 503 with %q", a.status, a.body, why)
	}
	if n := ph.count(); n != 1 {
		t.Errorf("%d pulls asked, want 1 (the failed pool is in its backoff)", n)
	}
	x.logs.wait(t, 0, "a pull of a model that requests waited for failed", map[string]string{"why": detail})
	if p := x.q.routing.Pulls(); len(p) != 0 {
		t.Errorf("pulls followed after the failure: %+v", p)
	}
}

// A configured model without a source that no pool has is refused as
// before: no pull.
func TestConfiguredModelWithoutSourceIsNotPulled(t *testing.T) {
	x, ph := pullQueen(t, "models:\n  big: {}\n")
	a := await(t, x.ask(`{"model":"big","prompt":"hi"}`))
	if a.status != http.StatusNotFound || !strings.Contains(a.body, "no pool has model") {
		t.Errorf("request for a model no pool has: %d %s", a.status, a.body)
	}
	if n := ph.count(); n != 0 {
		t.Errorf("%d pulls asked, want none", n)
	}
}
