package routing

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/registry"
)

// listHive is a hive's model list, by endpoint: what GET /v2/models
// answers; an endpoint without one does not answer.
type listHive struct {
	mu     sync.Mutex
	models map[string][]api.Model
}

func (h *listHive) Models(_ context.Context, endpoint string) ([]api.Model, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	list, ok := h.models[endpoint]
	if !ok {
		return nil, fmt.Errorf("GET %s/v2/models: connection refused", endpoint)
	}
	return append([]api.Model(nil), list...), nil
}

// The catalog reads a hive's list again when a model is asked for that it
// lacks, at most once per catalogRetry.
func TestCatalogEnsure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := &listHive{models: map[string][]api.Model{"http://a": {{Ref: "tiny"}}}}
		c := newCatalog(src, time.Second, slog.New(slog.DiscardHandler))
		pools := []registry.Pool{{ID: "a", Endpoint: "http://a", Status: registry.Healthy}}
		if !c.ensure(t.Context(), pools, "tiny") {
			t.Fatal("tiny not found")
		}
		src.mu.Lock()
		src.models["http://a"] = append(src.models["http://a"], api.Model{Ref: "new"})
		src.mu.Unlock()
		if c.ensure(t.Context(), pools, "new") {
			t.Fatal("read again within catalogRetry")
		}
		time.Sleep(catalogRetry)
		if !c.ensure(t.Context(), pools, "new") {
			t.Fatal("a model added to the hive is not found")
		}
		// A hive that stops answering keeps its last list.
		src.mu.Lock()
		delete(src.models, "http://a")
		src.mu.Unlock()
		c.refresh(t.Context(), pools)
		if _, ok := c.lookup(pools, "tiny"); !ok {
			t.Error("a failed read lost the list")
		}
		// A pool that is gone is forgotten.
		c.refresh(t.Context(), nil)
		if len(c.snapshot()) != 0 {
			t.Errorf("catalog %v after its pool went", c.snapshot())
		}
	})
}

// gatedHive answers its first read only once gate is closed.
type gatedHive struct {
	listHive
	first   sync.Once
	started chan struct{}
	gate    chan struct{}
}

func (h *gatedHive) Models(ctx context.Context, endpoint string) ([]api.Model, error) {
	h.first.Do(func() {
		close(h.started)
		<-h.gate
	})
	return h.listHive.Models(ctx, endpoint)
}

// A pool that registers while a request's read of its list is under way
// gets a new, unread entry; the request reads it and finds the model
// rather than answering that no pool has it.
func TestCatalogEnsureAcrossARegistration(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := &gatedHive{listHive: listHive{models: map[string][]api.Model{"http://a": {{Ref: "tiny"}}}},
			started: make(chan struct{}), gate: make(chan struct{})}
		c := newCatalog(src, time.Second, slog.New(slog.DiscardHandler))
		pools := []registry.Pool{{ID: "a", Endpoint: "http://a", Status: registry.Healthy}}
		found := make(chan bool)
		go func() { found <- c.ensure(t.Context(), pools, "tiny") }()
		<-src.started
		c.registered("a", "http://a")
		close(src.gate)
		if !<-found {
			t.Error("the model was not found after its pool registered during the read")
		}
	})
}

// Routing's sub-loggers (router, catalog, controller) each write one
// component key, their own, also when the queen's logger carries one.
func TestLogLinesHaveOneComponent(t *testing.T) {
	var buf bytes.Buffer
	s, err := New(Config{Models: &listHive{}, Logger: slog.New(slog.NewJSONHandler(&buf, nil))}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for name, l := range map[string]*slog.Logger{"router": s.router.log, "catalog": s.catalog.log, "controller": s.ctl.log} {
		buf.Reset()
		l.Info("probe")
		if n := strings.Count(buf.String(), `"component":`); n != 1 || !strings.Contains(buf.String(), `"component":"`+name+`"`) {
			t.Errorf("%s logs %d component keys: %s", name, n, buf.String())
		}
	}
}

// A registration or a stale list reads that pool's list at once, without
// copying every pool (the periodic refresh does that, once an interval).
func TestCatalogRunReadsOnlyDuePools(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := &listHive{models: map[string][]api.Model{"http://a": {{Ref: "tiny"}}, "http://b": {{Ref: "small"}}}}
		c := newCatalog(src, time.Second, slog.New(slog.DiscardHandler))
		var mu sync.Mutex
		reg := map[string]registry.Pool{"a": {ID: "a", Endpoint: "http://a", Status: registry.Healthy}}
		all := 0
		pools := func() []registry.Pool {
			mu.Lock()
			defer mu.Unlock()
			all++
			var out []registry.Pool
			for _, p := range reg {
				out = append(out, p)
			}
			return out
		}
		pool := func(id string) (registry.Pool, bool) {
			mu.Lock()
			defer mu.Unlock()
			p, ok := reg[id]
			return p, ok
		}
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go c.run(ctx, pools, pool, time.Hour)
		synctest.Wait()
		if _, ok := c.snapshot()["a"]["tiny"]; !ok {
			t.Fatalf("first refresh: catalog %v", c.snapshot())
		}
		mu.Lock()
		reg["b"] = registry.Pool{ID: "b", Endpoint: "http://b", Status: registry.Healthy}
		reg["u"] = registry.Pool{ID: "u", Endpoint: "http://u", Status: registry.Unhealthy}
		mu.Unlock()
		c.registered("b", "http://b")
		c.registered("u", "http://u")
		c.registered("gone", "http://gone")
		synctest.Wait()
		if _, ok := c.snapshot()["b"]["small"]; !ok {
			t.Errorf("registered pool not read: catalog %v", c.snapshot())
		}
		src.mu.Lock()
		src.models["http://a"] = append(src.models["http://a"], api.Model{Ref: "new"})
		src.mu.Unlock()
		c.stale("a")
		synctest.Wait()
		if _, ok := c.snapshot()["a"]["new"]; !ok {
			t.Errorf("stale list not read again: catalog %v", c.snapshot())
		}
		mu.Lock()
		calls := all
		mu.Unlock()
		if calls != 1 {
			t.Errorf("every pool copied %d times, want once (the first refresh)", calls)
		}
		c.mu.Lock()
		if len(c.due) != 0 {
			t.Errorf("pools still due: %v", c.due)
		}
		c.mu.Unlock()
	})
}
