package queen

import (
	"context"
	"net/http"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/apiary-llm/apiary/internal/lifecycle"
	"github.com/apiary-llm/apiary/internal/registry"
	"github.com/apiary-llm/apiary/internal/transport"
)

// routing is the queen's inference half (issue 5): the router and its
// session affinity, the model catalog, the controller that places workers
// on demand, the HTTP client to workers, and the check of workers that
// broke a connection. Queen.run builds it before serving and runs it with
// the other background work.
type routing struct {
	router   *router
	aff      *affinity
	catalog  *catalog
	ctl      *controller
	m        *routeMetrics
	up       *http.Client  // to workers
	tokens   *workerTokens // the workers' own tokens, from their hives
	suspects chan suspect
}

func (q *Queen) newRouting() *routing {
	cfg := q.cfg.Routing
	src, ok := q.hives.(HiveModels)
	if !ok {
		src = NewHTTPHiveClient(q.cfg.Tokens.Cluster, q.cfg.HiveTimeout).(HiveModels)
	}
	rt := &routing{
		aff:      newAffinity(cfg.AffinityTTL, maxSessions),
		catalog:  newCatalog(src, min(q.cfg.HiveTimeout, 5*time.Second), q.cfg.Logger.With("component", "catalog")),
		suspects: make(chan suspect, 64),
		up:       transport.NewClient(upstreamTransport(), 0),
		tokens:   newWorkerTokens(),
	}
	rt.m = newRouteMetrics(q.metrics.reg, rt.aff.size)
	rt.ctl = newController(q)
	rt.router = newRouter(cfg, q.cfg.Logger.With("component", "router"), q.candidates, rt.aff, rt.m, rt.ctl.signal)
	return rt
}

// upstreamTransport is the relay's transport to workers: apiary's client
// TLS, many idle connections per worker, no compression (a gzip reader
// would hold tokens back), and a bound on the wait for a worker's answer
// to begin.
func upstreamTransport() *http.Transport {
	t := transport.NewTransport()
	t.MaxIdleConns = 1024
	t.MaxIdleConnsPerHost = 256
	t.DisableCompression = true
	return t
}

// run runs the background work of routing until ctx ends: the affinity
// sweep, the catalog refresh, the controller, the suspect checks.
func (rt *routing) run(ctx context.Context, q *Queen) {
	var g errgroup.Group
	g.Go(func() error { rt.aff.run(ctx); return nil })
	g.Go(func() error {
		rt.catalog.run(ctx, q.servable, q.cfg.Routing.ModelsRefresh)
		return nil
	})
	g.Go(func() error { rt.ctl.run(ctx); return nil })
	g.Go(func() error { q.checkSuspects(ctx); return nil })
	_ = g.Wait()
	rt.up.CloseIdleConnections()
}

// poke tells routing that workers or pools changed: waiting requests may
// have a worker now, and the controller looks at the demand again.
func (rt *routing) poke() {
	rt.router.poke()
	rt.ctl.signal()
}

// candidates is the router's source: the workers of t's model (on t's
// pool, when it names one) that take requests now. A worker qualifies
// when its pool is healthy (not
// draining, unhealthy or offline), its hive reports it ready or busy (not
// starting, degraded or draining) with a URI, and its lifecycle row is
// RUNNING (a worker without a live row is being stopped).
func (q *Queen) candidates(t target) []candidate {
	var pools []registry.Pool
	if t.pool == "" {
		// Only the pools with a worker of the model are copied out.
		pools = q.reg.Query(registry.Filter{Statuses: []registry.Status{registry.Healthy}, Model: t.model})
	} else if p, ok := q.reg.Get(t.pool); ok && p.Status == registry.Healthy {
		pools = []registry.Pool{p}
	}
	var out []candidate
	for _, p := range pools {
		for _, w := range p.Workers {
			if w.ModelRef != t.model || w.URI == "" {
				continue
			}
			if st := lifecycle.State(w.Status); st != lifecycle.Ready && st != lifecycle.Busy {
				continue
			}
			id, ok := q.rows.runningRow(p.ID, w.LifecycleID, w.WorkerID)
			if !ok {
				continue
			}
			out = append(out, candidate{key: workerKey{p.ID, w.WorkerID}, lifecycleID: id, uri: w.URI, reported: w.InFlight,
				token: q.routing.tokens.get(p.ID, w.WorkerID)})
		}
	}
	return out
}

// runningRow returns the id of the RUNNING row of a hive's worker.
func (b *rowBook) runningRow(pool, lifecycleID, workerID string) (string, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if r, ok := b.active[lifecycleID]; ok && lifecycleID != "" && r.PoolID == pool {
		return r.ID, r.Status == rowRunning
	}
	id, ok := b.byWorker[workerKey{pool, workerID}]
	if !ok || workerID == "" {
		return "", false
	}
	return id, b.active[id].Status == rowRunning
}

// modelCount counts the live rows of one model.
type modelCount struct{ starting, running int }

// live is the workers that count against the model's max workers.
func (c modelCount) live() int { return c.starting + c.running }

// targetCounts counts the live rows of t's model, on t's pool when it
// names one; with keep given, only the rows on pools it keeps.
func (b *rowBook) targetCounts(t target, keep func(pool string) bool) modelCount {
	b.mu.Lock()
	var pools []string
	var status []lifecycle.Status
	for _, r := range b.active {
		if r.ModelRef == t.model && (t.pool == "" || r.PoolID == t.pool) {
			pools, status = append(pools, r.PoolID), append(status, r.Status)
		}
	}
	b.mu.Unlock() // keep may take the registry's lock: not under this one
	var c modelCount
	for i, p := range pools {
		switch {
		case keep != nil && !keep(p):
		case status[i] == rowStarting:
			c.starting++
		case status[i] == rowRunning:
			c.running++
		}
	}
	return c
}

// close refuses new inference and answers the waiting requests.
func (rt *routing) close() { rt.router.close() }
