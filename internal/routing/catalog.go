package routing

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/registry"
)

// HiveModels reads a hive's model list (GET /v2/models): what placement
// may start there. The HTTP HiveClient implements it.
type HiveModels interface {
	Models(ctx context.Context, endpoint string) ([]api.Model, error)
}

// catalogRetry is the least time between two reads of one hive's list on
// demand (a request for an unknown model, a placement): clients sending
// made-up model names must not turn into a stream of hive calls.
const catalogRetry = time.Second

// catalog knows which models each pool's hive has. It is filled by
// reading the hives' lists: every ModelsRefresh, at once when a hive
// registers, and on demand when a model is asked for that no list has.
// One read per pool is under way at a time; whoever needs its answer
// waits for it.
type catalog struct {
	src     HiveModels
	log     *slog.Logger
	timeout time.Duration // of one read

	mu    sync.Mutex
	pools map[string]*poolModels // guarded by mu; by pool id
	due   map[string]bool        // guarded by mu; pools whose list run reads next
	wake  chan struct{}          // a pool is due
}

// poolModels is what one hive last said. Its fields are guarded by
// catalog.mu.
type poolModels struct {
	endpoint string
	models   map[string]api.Model // nil until a read succeeded; never changed, only replaced
	readAt   time.Time            // of the last successful read
	triedAt  time.Time            // of the last attempt
	err      error                // of the last attempt
	reading  chan struct{}        // closed when the read under way ends; nil: none
}

func newCatalog(src HiveModels, timeout time.Duration, log *slog.Logger) *catalog {
	return &catalog{src: src, log: log, timeout: timeout, pools: map[string]*poolModels{}, due: map[string]bool{}, wake: make(chan struct{}, 1)}
}

// registered marks a pool's list as unknown (its hive may have restarted
// with other models) and asks run to read it now.
func (c *catalog) registered(poolID, endpoint string) {
	c.mu.Lock()
	c.pools[poolID] = &poolModels{endpoint: endpoint}
	c.due[poolID] = true
	c.mu.Unlock()
	c.wakeRun()
}

// stale marks a pool's list as due for a read (its last one is kept
// meanwhile) and asks run to read it now.
func (c *catalog) stale(poolID string) {
	c.mu.Lock()
	if pm := c.pools[poolID]; pm != nil {
		pm.readAt, pm.triedAt = time.Time{}, time.Time{}
	}
	c.due[poolID] = true
	c.mu.Unlock()
	c.wakeRun()
}

// wakeRun asks run to read the lists of the pools due now.
func (c *catalog) wakeRun() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// takeDue returns the pools due for a read that exist and answer, and
// empties the set. A due pool that does not answer now is read by the
// next refresh, or on demand.
func (c *catalog) takeDue(pool func(id string) (registry.Pool, bool)) []registry.Pool {
	c.mu.Lock()
	due := c.due
	c.due = map[string]bool{}
	c.mu.Unlock()
	out := make([]registry.Pool, 0, len(due))
	for id := range due {
		if p, ok := pool(id); ok {
			out = append(out, p)
		}
	}
	return answering(out)
}

// snapshot returns the models of every pool whose list is known.
func (c *catalog) snapshot() map[string]map[string]api.Model {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]map[string]api.Model, len(c.pools))
	for id, p := range c.pools {
		if p.models != nil {
			out[id] = p.models
		}
	}
	return out
}

// lookup returns model as one of pools has it.
func (c *catalog) lookup(pools []registry.Pool, model string) (api.Model, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range pools {
		if pm := c.pools[p.ID]; pm != nil {
			if m, ok := pm.models[model]; ok {
				return m, true
			}
		}
	}
	return api.Model{}, false
}

// entryLocked returns p's entry, new when p is new or re-registered at
// another endpoint.
func (c *catalog) entryLocked(p registry.Pool) *poolModels {
	pm := c.pools[p.ID]
	if pm == nil || pm.endpoint != p.Endpoint {
		pm = &poolModels{endpoint: p.Endpoint}
		c.pools[p.ID] = pm
	}
	return pm
}

// read is one pool's list being read.
type read struct {
	pool registry.Pool
	pm   *poolModels
}

// startLocked marks a read of pm as under way.
func (c *catalog) startLocked(p registry.Pool, pm *poolModels, now time.Time) read {
	pm.triedAt = now
	pm.reading = make(chan struct{})
	return read{p, pm}
}

// collect decides, for each pool that want selects, whether to wait for
// its read under way or to start one (at most once per catalogRetry
// unless force), then runs the new reads and waits for all.
func (c *catalog) collect(ctx context.Context, pools []registry.Pool, force bool, want func(*poolModels) bool) {
	now := time.Now()
	var reads []read
	var waits []chan struct{}
	c.mu.Lock()
	for _, p := range pools {
		pm := c.entryLocked(p)
		switch {
		case !want(pm):
		case pm.reading != nil:
			waits = append(waits, pm.reading)
		case force || now.Sub(pm.triedAt) >= catalogRetry:
			r := c.startLocked(p, pm, now)
			reads = append(reads, r)
			waits = append(waits, pm.reading)
		}
	}
	c.mu.Unlock()
	c.run1(ctx, reads)
	for _, w := range waits {
		select {
		case <-w:
		case <-ctx.Done():
			return
		}
	}
}

// ensure makes sure the pools that lack model have had their list read
// lately (reads under way are waited for; new ones start at most once per
// catalogRetry a pool), and reports whether one of pools has model.
func (c *catalog) ensure(ctx context.Context, pools []registry.Pool, model string) bool {
	if _, ok := c.lookup(pools, model); ok {
		return true
	}
	// The read does not end with the request that started it: others
	// may be waiting for it. It is bounded by c.timeout.
	c.collect(context.WithoutCancel(ctx), pools, false, func(pm *poolModels) bool { _, ok := pm.models[model]; return !ok })
	if _, ok := c.lookup(pools, model); ok {
		return true
	}
	// A pool that registered again during that read has a new entry
	// whose list is unknown (the read's answer went to the old one):
	// its list is read, or its read under way waited for.
	c.collect(context.WithoutCancel(ctx), pools, false, func(pm *poolModels) bool { return pm.models == nil })
	_, ok := c.lookup(pools, model)
	return ok
}

// ensureRead makes sure every pool's list has been read once: a hive that
// just registered answers /v1/models before its list came in the
// background.
func (c *catalog) ensureRead(ctx context.Context, pools []registry.Pool) {
	c.collect(context.WithoutCancel(ctx), pools, false, func(pm *poolModels) bool { return pm.models == nil })
}

// refresh reads the list of every pool given that is not unhealthy (its
// hive would not answer; its last list is kept) and forgets the pools not
// given (offline or removed from the registry).
func (c *catalog) refresh(ctx context.Context, pools []registry.Pool) {
	keep := make(map[string]bool, len(pools))
	for _, p := range pools {
		keep[p.ID] = true
	}
	c.mu.Lock()
	for id := range c.pools {
		if !keep[id] {
			delete(c.pools, id)
		}
	}
	c.mu.Unlock()
	c.collect(ctx, answering(pools), true, func(*poolModels) bool { return true })
}

// answering returns the pools whose hive is expected to answer.
func answering(pools []registry.Pool) []registry.Pool {
	out := make([]registry.Pool, 0, len(pools))
	for _, p := range pools {
		if p.Status == registry.Healthy || p.Status == registry.Draining {
			out = append(out, p)
		}
	}
	return out
}

// run1 reads the lists of reads in parallel and stores the answers. A
// failed read keeps the last list (a hive that does not answer now still
// has its files) and is logged when it is news.
func (c *catalog) run1(ctx context.Context, reads []read) {
	if len(reads) == 0 {
		return
	}
	var g errgroup.Group
	g.SetLimit(8)
	for _, r := range reads {
		g.Go(func() error {
			rctx, cancel := context.WithTimeout(ctx, c.timeout)
			defer cancel()
			list, err := c.src.Models(rctx, r.pool.Endpoint)
			c.store(r, list, err)
			return nil
		})
	}
	_ = g.Wait()
}

func (c *catalog) store(r read, list []api.Model, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	pm := r.pm
	defer func() {
		close(pm.reading)
		pm.reading = nil
	}()
	if err != nil {
		if pm.err == nil {
			c.log.Warn("cannot read the hive's model list; keeping the last one", "pool_id", r.pool.ID, "err", err)
		}
		pm.err = err
		return
	}
	models := make(map[string]api.Model, len(list))
	for _, m := range list {
		if api.CheckModel(m.Ref) == nil {
			models[m.Ref] = m
		}
	}
	if pm.models == nil || !maps.EqualFunc(pm.models, models, func(a, b api.Model) bool {
		return a.Ref == b.Ref && a.SizeBytes == b.SizeBytes && slices.Equal(a.Engines, b.Engines)
	}) {
		c.log.Info("hive model list read", "pool_id", r.pool.ID, "models", len(models))
	}
	pm.models, pm.readAt, pm.err = models, time.Now(), nil
}

// run re-reads the lists of the pools (every pool not offline) each
// interval, and at once the list of a pool that registers or whose list
// is stale (only those: a fleet registering after a queen restart must
// not copy every pool at each registration), until ctx ends.
func (c *catalog) run(ctx context.Context, pools func() []registry.Pool, pool func(id string) (registry.Pool, bool), interval time.Duration) {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			c.refresh(ctx, pools())
			t.Reset(interval)
		case <-c.wake:
			c.collect(ctx, c.takeDue(pool), true, func(pm *poolModels) bool { return pm.models == nil || pm.readAt.IsZero() })
		}
	}
}
