// Package routing is the queen's inference half: the OpenAI endpoints
// (route.go) check a request and relay it to a serving worker of its model
// (relay.go), which the router (router.go) picks by in-flight count and
// session affinity (affinity.go), queueing the request while no worker has
// a free slot. Requests never start workers: the controller
// (controller.go) turns queued demand into placements (placement.go, with
// the hives' model lists from catalog.go) and asks the control plane to
// start them.
//
// Routing owns no pool and no lifecycle row: it reads them, and changes
// them, only through ControlPlane, which the queen implements.
package routing

import (
	"context"
	"errors"
	"hash/maphash"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/modelconfig"
	"github.com/apiary-llm/apiary/internal/registry"
	"github.com/apiary-llm/apiary/internal/store"
	"github.com/apiary-llm/apiary/internal/transport"
)

// ControlPlane is what routing needs of the queen: the pools, the
// workers that serve, counts of live rows, and the changes routing makes
// (start a worker it placed, fail the row of a worker it lost, stop a
// worker that keeps failing).
// Its methods are safe for concurrent use and hold no lock while they
// return.
type ControlPlane interface {
	// Pool returns the registered pool id.
	Pool(id string) (registry.Pool, bool)
	// Pools returns the registered pools f selects.
	Pools(f registry.Filter) []registry.Pool
	// Candidates returns the workers of model (on pool, when it is not
	// "") that take requests now: ready or busy, with a URI, on a healthy
	// pool, with a RUNNING row, by key (routing's ties go to the first).
	// (A drained pool's workers serve on: drained means no new workers.)
	// The slice may be shared between calls: callers read it, never
	// change it.
	Candidates(model, pool string) []Candidate
	// Running reports whether the worker still has a RUNNING row.
	Running(pool, lifecycleID, workerID string) bool
	// Count counts the live rows of model (on pool, when it is not "");
	// with healthyOnly, only those on pools that serve (healthy or
	// drained).
	Count(model, pool string, healthyOnly bool) Count
	// LiveModels returns the models that have a live (STARTING or
	// RUNNING) row, each once: the models of workers run by hand, which
	// no pool lists, among them.
	LiveModels() []string
	// Row reads one lifecycle row.
	Row(ctx context.Context, lifecycleID string) (store.Row, error)
	// StartWorker writes the row of a worker placed on demand and asks
	// its hive to start it. A hive that refused or did not answer is a
	// *StartRefused: the placement is tried again without that pool.
	StartWorker(ctx context.Context, s Start) (store.Row, error)
	// WorkerLost fails the RUNNING row of a worker that broke a request
	// and does not answer its health check.
	WorkerLost(ctx context.Context, lifecycleID, reason string) error
	// StopWorker stops a worker that keeps failing requests (its strikes
	// reached 3 × StrikeLimit), as an operator's stop does, with the
	// queen as the actor: its row goes DRAINING, then STOPPED or FAILED.
	// A row that ended meanwhile is no error.
	StopWorker(ctx context.Context, lifecycleID, reason string) error
	// EvictWorker stops a worker to make room for another model's: as
	// StopWorker (it drains), audited worker.evicted with reason and
	// meta (the model it makes room for, …). A row that ended meanwhile
	// is no error.
	EvictWorker(ctx context.Context, lifecycleID, reason string, meta map[string]any) error
	// Audit appends an entry to the audit log; a failure is the control
	// plane's to log and count.
	Audit(ctx context.Context, e store.AuditEntry)
	// Replicas returns the models' replica settings (apiary models
	// scale), by model; the map is the caller's.
	Replicas() map[string]Replica
	// LogTail returns the last n lines of the log of a row's worker, as
	// its hive keeps it.
	LogTail(ctx context.Context, lifecycleID string, n int) ([]string, error)
	// PullModel asks a pool's hive to pull a model in the background, as
	// the queen's actor (audited model.pull_started). Its end comes
	// through Service.PullEnded. A model the hive already has is answered
	// as a pull in state pulled.
	PullModel(ctx context.Context, poolID string, req api.PullModelRequest) (api.ModelPull, error)
	// TokenRefused tells the control plane that a worker refused the
	// token it was sent (401): the token is dropped (the worker is not a
	// candidate without one) and asked of its hive again at once.
	TokenRefused(pool, workerID string)
	// AwaitedPools returns the pools the queen restored at its start
	// whose hives it awaits (their lease from the restart runs): what they
	// run is presumed alive, and requests that only they can serve wait.
	AwaitedPools() []string
}

// Count is the live rows of a target.
type Count struct{ Starting, Running int }

// Live is the workers that count against the model's max workers.
func (c Count) Live() int { return c.Starting + c.Running }

// Start is a worker the controller placed.
type Start struct {
	Model  string
	Pool   string
	GPU    int
	GPUs   []int          // a split over several GPUs (GPU first); nil: GPU alone
	Reason string         // for the audit entry of the start
	Meta   map[string]any // the placement and the demand, for the audit entry
}

// StartRefused is a start that a pool's hive refused, or did not
// answer: another pool may take it.
type StartRefused struct {
	// Why is in words an API client may read ("its hive does not have
	// the model's file"): it becomes the pool's reason in the placement
	// that leaves it out. Err keeps what the hive said and where, for the
	// log.
	Why string
	Err error
	// NoRoomYet: the hive had no room at that moment (its memory or its
	// --max-loaded): workers just evicted or stopped may not have left
	// its table yet. After an eviction the start is tried again shortly.
	NoRoomYet bool
}

func (e *StartRefused) Error() string { return e.Err.Error() }
func (e *StartRefused) Unwrap() error { return e.Err }

// Service is the routing of one queen. Create it with New; serve its
// routes (Routes) once Run is under way.
type Service struct {
	cfg Config
	// prefixSeed keys the hashes of requests' text (prefix.go).
	prefixSeed maphash.Seed
	cp         ControlPlane
	log        *slog.Logger
	router     *router
	aff        *affinity
	catalog    *catalog
	pulls      *pulls
	ctl        *controller
	m          *routeMetrics
	up         *http.Client // to workers
	// upBatch is the Batch API's connections to workers, apart from
	// up's: a preempted batch request's connection is closed (its
	// answer cut off), and batch requests would otherwise take every
	// idle connection an interactive request left, so that the next one
	// dials anew (0.5 ms of its time to first token on a busy node).
	upBatch  *http.Transport
	suspects chan suspect
	// strikeWake wakes the strike watcher (buffered 1).
	strikeWake chan struct{}

	// models is the queen's model config (SetModels); nil: none.
	models atomic.Pointer[modelconfig.File]

	loopsMu sync.Mutex
	loops   map[string]CrashLoop // guarded by loopsMu; the models in a crash loop, as the controller last published them

	evictions evictionLog
	// placeMu makes each placement decision and eviction plan one step
	// with the reservation it makes in ledger: two decisions never count
	// the same room, nor take the same worker.
	placeMu sync.Mutex
	ledger  *ledger
	busy    busyLog
	// changes fires at each Poke: an eviction waiting for its room looks
	// again at once when a worker's event lands.
	changes broadcast
}

// broadcast wakes every waiter at once, each time it fires.
type broadcast struct {
	mu sync.Mutex
	ch chan struct{} // guarded by mu; closed by fire
}

// wait returns a channel that fire closes.
func (b *broadcast) wait() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ch == nil {
		b.ch = make(chan struct{})
	}
	return b.ch
}

func (b *broadcast) fire() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ch != nil {
		close(b.ch)
		b.ch = nil
	}
}

// New checks cfg (after defaults) and builds the routing over cp.
func New(cfg Config, cp ControlPlane) (*Service, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Models == nil {
		return nil, errors.New("Config.Models is required (the hives' model lists)")
	}
	return newService(cfg, cp), nil
}

func newService(cfg Config, cp ControlPlane) *Service {
	s := &Service{
		cfg:        cfg,
		cp:         cp,
		log:        cfg.Logger.With("component", "router"),
		aff:        newAffinity(cfg.AffinityTTL, maxSessions),
		catalog:    newCatalog(cfg.Models, min(cfg.HiveTimeout, catalogTimeout), cfg.Logger.With("component", "catalog")),
		pulls:      newPulls(),
		suspects:   make(chan suspect, 64),
		strikeWake: make(chan struct{}, 1),
		up:         transport.NewClient(upstreamTransport(), 0),
		upBatch:    upstreamTransport(),
		ledger:     newLedger(),
	}
	s.m = newRouteMetrics(cfg.Metrics, s.aff.size)
	s.ctl = newController(s)
	s.prefixSeed = maphash.MakeSeed()
	s.router = newRouter(cfg, s.log, s.candidates, s.aff, s.m, s.ctl.signal)
	s.router.slots = s.slotsOf
	return s
}

// upstreamTransport is the relay's transport to workers: apiary's client
// TLS, many idle connections per worker, no compression (a gzip reader
// would hold tokens back).
func upstreamTransport() *http.Transport {
	t := transport.NewTransport()
	t.MaxIdleConns = 1024
	t.MaxIdleConnsPerHost = 256
	t.DisableCompression = true
	return t
}

// Run runs the background work of routing until ctx ends: the affinity
// sweep, the catalog refresh, the controller, the checks of workers that
// broke a connection, the strike watcher.
func (s *Service) Run(ctx context.Context) {
	var g errgroup.Group
	g.Go(func() error { s.aff.run(ctx); return nil })
	g.Go(func() error {
		s.catalog.run(ctx, s.servable, s.cp.Pool, s.cfg.ModelsRefresh)
		return nil
	})
	g.Go(func() error { s.ctl.run(ctx); return nil })
	g.Go(func() error { s.checkSuspects(ctx); return nil })
	g.Go(func() error { s.watchStrikes(ctx); return nil })
	_ = g.Wait()
	s.up.CloseIdleConnections()
	s.upBatch.CloseIdleConnections()
}

// Poke tells routing that workers or pools changed: waiting requests may
// have a worker now, and the controller looks at the demand again.
func (s *Service) Poke() {
	s.router.poke()
	s.ctl.signal()
	s.changes.fire()
}

// Registered tells routing that a hive (re)registered: its model list is
// read again, and the controller looks at the replicas (the pool may take
// one).
func (s *Service) Registered(poolID, endpoint string) {
	s.catalog.registered(poolID, endpoint)
	s.pulls.forgetPool(poolID)
	s.ctl.signal()
}

// ModelsChanged tells routing that a pool's hive has new models (a pull
// ended): its list is read again now, keeping the last one until then.
func (s *Service) ModelsChanged(poolID string) {
	s.catalog.stale(poolID)
	s.ctl.signal()
}

// PoolModels returns the models of every pool whose hive answers (healthy
// or draining), by pool id, reading the lists that are older than
// catalogRetry first.
func (s *Service) PoolModels(ctx context.Context) []api.PoolModels {
	pools := answering(s.cp.Pools(registry.Filter{}))
	s.catalog.collect(context.WithoutCancel(ctx), pools, false, func(pm *poolModels) bool { return time.Since(pm.readAt) >= catalogRetry })
	snap := s.catalog.snapshot()
	out := make([]api.PoolModels, 0, len(pools))
	for _, p := range pools {
		pm := api.PoolModels{PoolID: p.ID, Models: []api.Model{}}
		for _, m := range snap[p.ID] {
			pm.Models = append(pm.Models, m)
		}
		slices.SortFunc(pm.Models, func(a, b api.Model) int { return strings.Compare(a.Ref, b.Ref) })
		out = append(out, pm)
	}
	slices.SortFunc(out, func(a, b api.PoolModels) int { return strings.Compare(a.PoolID, b.PoolID) })
	return out
}

// Close refuses new inference and answers the waiting requests.
func (s *Service) Close() { s.router.close() }

// candidates is the router's source: the workers of t's model that take
// requests now.
func (s *Service) candidates(t target) []Candidate { return s.cp.Candidates(t.model, t.pool) }

// pools returns the registered pools f selects as placement sees them:
// with the workers the queen placed or is evicting that their lists do
// not show yet (but except, the caller's own reservation).
func (s *Service) pools(f registry.Filter, except *reservation) []registry.Pool {
	return s.ledger.view(s.cp.Pools(f), except, time.Now())
}

// counts counts the live rows of t (on healthy pools only, or all).
func (s *Service) counts(t target, healthyOnly bool) Count {
	return s.cp.Count(t.model, t.pool, healthyOnly)
}

// Route checks a request for model (on pool, when it is not "") as an
// OpenAI request is checked, then takes a lease on a worker for it and
// gives it back, without sending anything: what every request costs
// before it reaches a worker. Benchmarks measure routing with it.
func (s *Service) Route(ctx context.Context, model, pool string) error {
	model = s.resolve(model).ref
	if err := s.knownModel(ctx, model, pool); err != nil {
		return err
	}
	l, err := s.router.acquire(ctx, routeReq{model: model, pool: pool})
	if err != nil {
		return err
	}
	s.router.release(l, false)
	return nil
}
