// Package queen is apiary's orchestrator daemon: its control plane. It
// keeps the pool registry (hives register and heartbeat; leases decide
// liveness), owns the worker lifecycle rows (the only writer), writes an
// audit entry with every change, reconciles what hives report with its
// rows, and serves the admin and cluster APIs over them.
//
// Ownership: the registry owns pools (internal/registry); rowBook owns the
// rows; both decide in memory and write the store after, in order.
// Decisions are pure (reconcile); effects on hives go through HiveClient,
// and the background ones run on the queen's task workers.
//
// Inference is internal/routing, which sees the queen only through
// controlPlane (controlplane.go): pools, candidates, counts, starting a
// worker it placed, failing the row of a worker it lost. The hives the
// queen starts (SSH nodes, the local hive) are its fleet (fleet.go).
package queen

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/batch"
	"github.com/apiary-llm/apiary/internal/fleet"
	"github.com/apiary-llm/apiary/internal/lifecycle"
	"github.com/apiary-llm/apiary/internal/registry"
	"github.com/apiary-llm/apiary/internal/routing"
	"github.com/apiary-llm/apiary/internal/store"
	"github.com/apiary-llm/apiary/internal/transport"
)

// taskWorkers run background hive calls (stops of unknown workers).
const (
	taskWorkers = 4
	taskQueue   = 1024
)

// Queen is a running orchestrator. Create it with New, run it with Run.
type Queen struct {
	// refusedAt is when a refused hive call from each address was last
	// logged (hiveRefused).
	refusedMu sync.Mutex
	refusedAt map[string]time.Time // guarded by refusedMu
	cfg       Config
	log       *slog.Logger
	hives     HiveClient
	// hivesHTTP serves the hive calls hives cannot make (a HiveClient
	// of the tests lacks HiveLogs, HivePulls or routing.HiveModels):
	// one client, fenced and closed at shutdown like hives.
	hivesHTTP *httpHiveClient
	metrics   *metrics

	// Set by Run before Ready is closed; never changed after.
	st   *store.Store
	reg  *registry.Registry
	rows *rowBook
	// settings are the models' settings (apiary models scale).
	settings *modelSettings
	// models is the model config (Config.ModelsFile); set by New.
	models *modelConfig
	addr   net.Addr

	tasks chan func(context.Context)
	fleet *fleet.Fleet // the hives this queen started; set by Run before serving
	// routing is the inference half (internal/routing); set by Run
	// before serving.
	routing *routing.Service
	// batch is the OpenAI Batch API and its dispatcher; set by Run
	// before serving.
	batch *batch.Service
	// tokens are the workers' own tokens, from their hives, for routing.
	tokens *workerTokens
	// tokenFetch keeps the fetches of tokens from hives (fetchTokens).
	tokenFetch tokenFetches
	// cands keeps each model's candidates and counts for routing.
	cands *candidateCache
	// handRun is what the queen knows of the workers run by hand that
	// claimed rows (claims.go); claimClient calls them.
	handRun     *handRun
	claimClient *http.Client
	// ui is the dashboard's state (ui.go); set by Run before serving.
	ui *ui

	// followers ends the log streams of `apiary workers logs --follow`
	// when the server shuts down (they would hold it up); set by Run
	// before serving.
	followers context.Context

	// steppedDown is set once the queen lost the database's lock: from
	// then on it answers as a standby does (standby.go); see deposed.
	steppedDown atomic.Bool

	ready     chan struct{}
	done      chan struct{}
	runOnce   sync.Once
	closeOnce sync.Once
	stop      context.CancelFunc // guarded by stopMu
	stopMu    sync.Mutex
}

// New checks cfg (after defaults) and prepares a queen. Nothing is opened
// or bound until Run.
func New(cfg Config) (*Queen, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	models, err := loadModelConfig(cfg.ModelsFile)
	if err != nil {
		return nil, err
	}
	return &Queen{
		models:      models,
		cfg:         cfg,
		log:         cfg.Logger.With("component", "queen"),
		hives:       cfg.Hives,
		hivesHTTP:   NewHTTPHiveClient(cfg.Tokens.Cluster, cfg.HiveTimeout).(*httpHiveClient),
		metrics:     newMetrics(),
		refusedAt:   map[string]time.Time{},
		tasks:       make(chan func(context.Context), taskQueue),
		tokens:      newWorkerTokens(),
		cands:       newCandidateCache(),
		handRun:     newHandRun(),
		claimClient: transport.NewClient(nil, 0),
		ready:       make(chan struct{}),
		done:        make(chan struct{}),
	}, nil
}

// Ready is closed once the queen serves.
func (q *Queen) Ready() <-chan struct{} { return q.ready }

// Done is closed once Run has returned.
func (q *Queen) Done() <-chan struct{} { return q.done }

// Addr is the address the queen listens on; valid after Ready.
func (q *Queen) Addr() net.Addr { return q.addr }

// advertised is the URL the queen gives others before it listens: its
// --advertise, else its address as configured.
func (q *Queen) advertised() string {
	if q.cfg.Advertise != "" {
		return q.cfg.Advertise
	}
	return q.cfg.TLS.Scheme() + "://" + q.cfg.Addr
}

// URL is the queen's base URL for others; valid after Ready.
func (q *Queen) URL() string {
	if q.cfg.Advertise != "" {
		return q.cfg.Advertise
	}
	return q.cfg.TLS.Scheme() + "://" + q.addr.String()
}

// Registry is the pool registry; valid after Ready.
func (q *Queen) Registry() *registry.Registry { return q.reg }

// Run opens the store, loads pools and rows, serves until ctx ends or Close
// is called, then shuts down in Close's order. Run may be called once.
func (q *Queen) Run(ctx context.Context) error {
	err := errors.New("Run called twice")
	q.runOnce.Do(func() { err = q.run(ctx) })
	return err
}

func (q *Queen) run(ctx context.Context) error {
	defer close(q.done)
	ctx, cancelCause := context.WithCancelCause(ctx)
	cancel := func() { cancelCause(nil) }
	defer cancel()
	q.stopMu.Lock()
	q.stop = cancel
	q.stopMu.Unlock()

	scfg := store.Config{URL: q.cfg.DatabaseURL, Logger: q.cfg.Logger, LeaseDuration: q.cfg.LeaseDuration, LeaseRenew: q.cfg.LeaseRenew,
		Retention: store.Retention{Audit: max(q.cfg.AuditRetention, 0), Rows: max(q.cfg.RowsRetention, 0)}}
	if q.cfg.DatabaseURL == "" {
		scfg.Path = filepath.Join(q.cfg.DataDir, store.SQLiteFile)
	} else {
		scfg.Holder = q.advertised()
	}
	st, err := store.Open(ctx, scfg)
	tookOver := false
	if errors.Is(err, store.ErrLocked) && q.cfg.Standby {
		st, err = q.standBy(ctx, scfg)
		tookOver = err == nil
	}
	if err != nil {
		return err
	}
	defer st.Close() // step 5
	q.st = st
	if f, ok := q.hives.(fenced); ok {
		f.setFence(st)
	}
	q.hivesHTTP.setFence(st)
	q.rows = newRowBook(st, q.log, q.metrics)
	q.ui = newUI(q.uiSnapshot)
	q.rows.onChange = q.ui.rowChanged
	if err := q.ui.loadEnded(ctx, st); err != nil {
		return err
	}
	reg, err := registry.New(registry.Config{
		Store: registry.SQLStore(st), HeartbeatTimeout: q.cfg.HeartbeatTimeout, UnhealthyGrace: q.cfg.UnhealthyGrace,
		OfflineRetention: q.cfg.OfflineRetention, FlushInterval: q.cfg.FlushInterval,
		OnLost: q.onLost, Logger: q.cfg.Logger,
	})
	if err != nil {
		return err
	}
	q.reg = reg
	if err := q.rows.load(ctx); err != nil {
		return err
	}
	if q.settings, err = loadModelSettings(ctx, st); err != nil {
		return err
	}
	if err := reg.Load(ctx); err != nil {
		return err
	}
	defer reg.Close() // step 3
	q.metrics.pools, q.metrics.st = reg.Counts, st

	ln, err := net.Listen("tcp", q.cfg.Addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", q.cfg.Addr, err)
	}
	q.addr = ln.Addr()
	if ln, err = q.cfg.TLS.Listen(ln); err != nil {
		return err
	}
	if q.routing, err = routing.New(q.routingConfig(), controlPlane{q}); err != nil {
		return err
	}
	q.routing.SetModels(q.models.file())
	// The workers the store knows run on: their tokens come from their
	// hives now, not at each hive's next heartbeat.
	q.fetchAllTokens()
	bcfg := q.cfg.Batch
	bcfg.Store, bcfg.Router, bcfg.Logger = st, q.routing, q.cfg.Logger
	bcfg.Dir = filepath.Join(cmp.Or(q.cfg.DataDir, DefaultDataDir()), "files")
	if q.batch, err = batch.New(bcfg); err != nil {
		return err
	}
	srv := &http.Server{Handler: q.unlessSteppedDown(q.routes()), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute, // idle keep-alive connections are closed: they cost a socket each
		ErrorLog: slog.NewLogLogger(q.log.Handler(), slog.LevelWarn)}
	followers, endFollowers := context.WithCancel(context.Background())
	defer endFollowers()
	q.followers = followers
	srv.RegisterOnShutdown(endFollowers)
	stopOwned := q.startOwned(cancel)

	bg, bgCancel := context.WithCancel(context.WithoutCancel(ctx))
	var g errgroup.Group
	g.Go(func() error {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			cancel()
			return fmt.Errorf("serve: %w", err)
		}
		return nil
	})
	g.Go(func() error { return reg.Run(bg) })
	g.Go(func() error { q.flushRows(bg); return nil })
	g.Go(func() error { q.superviseHandRun(bg); return nil })
	for range taskWorkers {
		g.Go(func() error { q.runTasks(bg); return nil })
	}
	g.Go(func() error { q.routing.Run(bg); return nil })
	g.Go(func() error { q.ui.hub.Run(bg); return nil })
	g.Go(func() error { q.sampleUI(bg); return nil })
	if q.models.path != "" {
		g.Go(func() error { q.watchModels(bg, q.cfg.ModelsPoll); return nil })
	}
	g.Go(func() error {
		if err := q.batch.Run(bg); err != nil {
			q.log.Error("the batch dispatcher stopped", "err", err)
		}
		return nil
	})
	g.Go(func() error {
		// Another queen may take the database once the lock is gone:
		// step down (stop routing and serving, Run returns the cause).
		select {
		case <-st.LockLost():
			q.steppedDown.Store(true)
			q.log.Error("queen stepping down: it no longer holds the database's one-queen lock", "err", st.LockErr(),
				"answers", "as a standby while it stops")
			cancelCause(st.LockErr())
		case <-bg.Done():
		}
		return nil
	})
	q.log.Info("queen serving", "addr", q.addr.String(), "url", q.URL(), "store", string(st.Dialect()),
		"heartbeat_timeout", q.cfg.HeartbeatTimeout, "unhealthy_grace", q.cfg.UnhealthyGrace, "offline_retention", q.cfg.OfflineRetention)
	close(q.ready)
	if tookOver {
		q.log.Info("queen took over the database from standby", "epoch", st.Epoch())
		controlPlane{q}.Audit(ctx, store.AuditEntry{Actor: registry.ActorQueen, Action: "queen.takeover", Target: "queen:" + q.URL(),
			Reason:   fmt.Sprintf("the active queen's lease ended (released, or lapsed); this standby holds the database now (fencing epoch %d)", st.Epoch()),
			Metadata: map[string]any{"epoch": st.Epoch()}})
	}

	<-ctx.Done()
	q.log.Info("queen shutting down")
	// Step 0a: inference stops: queued requests are answered 503, so
	// no demand places workers while everything stops.
	q.routing.Close()
	// Step 0: the hives this queen started cascade and exit while it still
	// serves, so their workers' last events reach the rows.
	stopOwned()
	// Step 1: stop taking requests; let those in flight finish.
	sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
	serr := srv.Shutdown(sctx)
	scancel()
	// Steps 2 and 4: background work ends (task workers drop what is
	// queued); the registry and the rows flush heartbeat data once more.
	bgCancel()
	gerr := g.Wait()
	q.claimClient.CloseIdleConnections()
	if c, ok := q.hives.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
	q.hivesHTTP.CloseIdleConnections()
	if err := errors.Join(serr, gerr); err != nil {
		return err
	}
	if cerr := context.Cause(ctx); !errors.Is(cerr, context.Canceled) {
		return cerr
	}
	return nil
}

// Close asks a running queen to stop and waits until it has. It is
// idempotent; before Run it does nothing.
//
// First of all, inference stops: new requests and those waiting for a
// worker are answered 503 (streams in flight go on). Then, in order:
//  0. stop every hive this queen started (each stops its workers, then
//     exits) and wait for them, still serving; hives an operator started,
//     and workers run by hand (claims.go), are left running,
//  1. stop accepting HTTP requests and finish those in flight (log
//     followers end at once),
//  2. stop the task workers (queued hive calls are dropped; the next
//     heartbeat of each hive would bring them back), the health checks
//     of workers run by hand, and routing's controller, model list
//     reads and affinity sweep,
//  3. stop the registry's lease timers (no status changes after this),
//  4. flush the heartbeat data of pools and rows to the store,
//  5. close the store, which releases the owner lock.
func (q *Queen) Close() error {
	q.closeOnce.Do(func() {
		q.stopMu.Lock()
		stop := q.stop
		q.stopMu.Unlock()
		if stop == nil {
			return
		}
		stop()
		<-q.done
	})
	return nil
}

func (q *Queen) flushRows(ctx context.Context) {
	t := time.NewTicker(q.cfg.FlushInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := q.rows.flush(fctx, true); err != nil {
				q.log.Error("final flush of worker heartbeats failed", "err", err)
			}
			return
		case <-t.C:
			if err := q.rows.flush(ctx, false); err != nil {
				q.metrics.storeErrors.Inc()
				q.log.Error("flush of worker heartbeats failed; will retry", "err", err)
			}
		}
	}
}

func (q *Queen) runTasks(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case task := <-q.tasks:
			task(ctx)
		}
	}
}

// enqueue schedules a background hive call; false when the queue is full.
func (q *Queen) enqueue(task func(context.Context)) bool {
	select {
	case q.tasks <- task:
		return true
	default:
		return false
	}
}

// onLost is the watchdog: the registry calls it when a pool stayed
// unhealthy past the grace or went offline. Every live row of the pool
// becomes FAILED.
func (q *Queen) onLost(poolID, reason string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, id := range q.rows.livePoolRows(poolID) {
		_, _, err := q.rows.apply(ctx, id, rowChange{to: rowFailed, reason: "lost: " + reason, actor: registry.ActorQueen, action: "worker.lost",
			meta: map[string]any{"watchdog": true}})
		if err != nil && !errors.Is(err, ErrRefused) && !errors.Is(err, ErrRowEnded) {
			q.metrics.storeErrors.Inc()
			q.log.Error("watchdog cannot fail lifecycle row", "lifecycle_id", id, "pool_id", poolID, "err", err)
		}
	}
}

// heartbeat renews the pool's lease and reconciles its workers with the
// rows; refused are the entries the queen could not take.
func (q *Queen) heartbeat(ctx context.Context, poolID string, hb api.Heartbeat, refused []api.RefusedWorker, spares *registry.Spares) (registry.Beat, error) {
	beat, err := q.reg.HeartbeatReusing(ctx, poolID, hb, spares)
	if err != nil {
		return registry.Beat{}, err
	}
	q.reconcile(ctx, poolID, beat, hb.Workers, refused)
	return beat, nil
}

// reconcile reads the pool's rows under the rows' lock, decides without
// it (reconcile is pure), records what it saw under the lock again, and
// acts after: row changes go through apply, which checks each again. A
// beat that finds its pool's rows as the last one did, none of them
// missing, holds only the read lock (see rowBook).
func (q *Queen) reconcile(ctx context.Context, poolID string, beat registry.Beat, workers []api.Worker, refused []api.RefusedWorker) {
	now := micro(time.Now()).UnixMicro()
	b := q.rows
	b.mu.RLock()
	rows, made := b.poolRowsLocked(poolID, false)
	missed := false // most beats miss nothing
	for _, r := range rows {
		if _, ok := b.misses[r.ID]; ok {
			missed = true
			break
		}
	}
	b.mu.RUnlock()
	var misses map[string]int
	if !made || missed {
		b.mu.Lock()
		rows, _ = b.poolRowsLocked(poolID, true)
		for _, r := range rows {
			if n, ok := b.misses[r.ID]; ok {
				if misses == nil {
					misses = make(map[string]int, len(rows))
				}
				misses[r.ID] = n
			}
		}
		b.mu.Unlock()
	}
	var seen [8]string
	plan := reconcile(reconcileInput{FullInventory: beat.FullInventory, RegisteredAt: beat.RegisteredAt,
		Workers: workers, Refused: refused, Rows: rows, Misses: misses, Seen: seen[:0]})
	if misses == nil && len(plan.Misses) == 0 {
		b.mu.RLock()
		for _, id := range plan.Seen {
			b.seeLocked(id, now)
		}
		b.mu.RUnlock()
	} else {
		b.mu.Lock()
		for _, id := range plan.Seen {
			b.touchLocked(id, now)
		}
		for id, n := range plan.Misses {
			if _, live := b.active[id]; live { // it may have ended meanwhile
				b.misses[id] = n
			}
		}
		b.mu.Unlock()
	}
	if beat.FullInventory {
		q.log.Info("pool inventory reconciled", "pool_id", poolID, "workers", len(workers), "rows", len(rows),
			"adopted", len(plan.Seen), "lost", len(plan.Lost), "unknown", len(plan.Unknown))
	}

	if len(plan.Sync) == 0 && len(plan.Lost) == 0 && len(plan.Unknown) == 0 {
		return
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	actor := "hive:" + poolID
	for _, s := range plan.Sync {
		w := s.Worker
		_, _, err := b.apply(wctx, s.ID, rowChange{to: s.To, reason: fmt.Sprintf("reconciled: the hive reports %s (%s)", w.Status, w.Reason),
			actor: actor, action: "worker.reconcile", set: func(r *store.Row) { fillFromWorker(r, w) }})
		if err != nil && !errors.Is(err, ErrRefused) && !errors.Is(err, ErrRowEnded) {
			q.metrics.storeErrors.Inc()
			q.log.Error("cannot reconcile lifecycle row", "lifecycle_id", s.ID, "err", err)
		}
	}
	for _, l := range plan.Lost {
		_, _, err := b.apply(wctx, l.ID, rowChange{to: rowFailed, reason: l.Reason, actor: registry.ActorQueen, action: "worker.lost"})
		if err != nil && !errors.Is(err, ErrRefused) && !errors.Is(err, ErrRowEnded) {
			q.metrics.storeErrors.Inc()
			q.log.Error("cannot fail lost lifecycle row", "lifecycle_id", l.ID, "err", err)
		}
	}
	for _, u := range plan.Unknown {
		q.stopUnknown(wctx, poolID, u)
	}
}

// stopUnknown asks the hive to stop a live worker that has no live row,
// once per heartbeat timeout, and audits it.
func (q *Queen) stopUnknown(ctx context.Context, poolID string, u unknownWorker) {
	k := workerKey{poolID, u.Worker.WorkerID}
	if u.Worker.Status == string(lifecycle.Draining) || !q.rows.markStopping(k, time.Now(), q.cfg.HeartbeatTimeout) {
		return
	}
	pool, ok := q.reg.Get(poolID)
	if !ok {
		q.rows.unmarkStopping(k)
		return
	}
	target := poolID + "/" + u.Worker.WorkerID
	err := q.st.Update(ctx, func(tx *store.Tx) error {
		_, err := tx.Append(store.AuditEntry{Actor: registry.ActorQueen, Action: "worker.stop_unknown", Target: target,
			Reason: "live worker without a live lifecycle row: " + u.Why,
			Metadata: map[string]any{"pool_id": poolID, "worker_id": u.Worker.WorkerID, "lifecycle_id": u.Worker.LifecycleID,
				"model_ref": u.Worker.ModelRef, "status": u.Worker.Status}})
		return err
	})
	if err != nil {
		q.rows.unmarkStopping(k)
		q.metrics.storeErrors.Inc()
		q.log.Error("cannot audit stop of unknown worker; not stopping it now", "pool_id", poolID, "worker_id", u.Worker.WorkerID, "err", err)
		return
	}
	q.log.Warn("stopping worker without a live lifecycle row", "pool_id", poolID, "worker_id", u.Worker.WorkerID,
		"lifecycle_id", u.Worker.LifecycleID, "why", u.Why)
	ok = q.enqueue(func(ctx context.Context) {
		ctx, cancel := context.WithTimeout(ctx, q.cfg.HiveTimeout)
		defer cancel()
		if err := q.hives.StopWorker(ctx, pool.Endpoint, u.Worker.WorkerID, api.StopWorkerRequest{}); err != nil && !hiveCode(err, "worker_not_found") && !hiveCode(err, "worker_ended") {
			q.rows.unmarkStopping(k) // the next heartbeat tries again
			q.log.Warn("cannot stop unknown worker; will retry", "pool_id", poolID, "worker_id", u.Worker.WorkerID, "err", err)
			return
		}
		q.metrics.unknownStopped.Inc()
	})
	if !ok {
		q.rows.unmarkStopping(k)
		q.log.Warn("task queue full; unknown worker stop deferred", "pool_id", poolID, "worker_id", u.Worker.WorkerID)
	}
}

// event applies one worker transition pushed by a hive.
func (q *Queen) event(ctx context.Context, ev api.WorkerEvent) (api.EventAck, error) {
	pool, ok := q.reg.Get(ev.PoolID)
	if !ok {
		return api.EventAck{}, fmt.Errorf("%w: %s", registry.ErrNotFound, ev.PoolID)
	}
	if pool.Status == registry.Offline {
		return api.EventAck{}, fmt.Errorf("%w: %s", registry.ErrOffline, ev.PoolID)
	}
	w := ev.Worker
	if w.WorkerID == "" {
		w.WorkerID = ev.WorkerID
	}
	w.Status = ev.To
	q.reg.UpdateWorker(ev.PoolID, w)

	lid := ev.LifecycleID
	if lid == "" {
		lid = w.LifecycleID
	}
	id, ok := q.rows.lookup(ev.PoolID, lid, ev.WorkerID)
	to := lifecycle.State(ev.To)
	if !ok {
		if lid != "" {
			if row, err := q.rows.get(ctx, lid); err == nil && row.PoolID == ev.PoolID {
				// An event for an ended row (e.g. the final "failed" of
				// a worker the watchdog already wrote off).
				q.log.Info("event for an ended lifecycle row ignored", "lifecycle_id", lid, "status", row.Status, "to", ev.To)
				return api.EventAck{Applied: false, Message: fmt.Sprintf("lifecycle row %s is %s", lid, row.Status)}, nil
			}
		}
		if !to.Terminal() {
			why := "no lifecycle row"
			if lid != "" {
				why = fmt.Sprintf("no live lifecycle row %s", lid)
			}
			q.stopUnknown(ctx, ev.PoolID, unknownWorker{Worker: w, Why: why})
		}
		return api.EventAck{Applied: false, Message: "no live lifecycle row for worker " + ev.WorkerID}, nil
	}
	_, changed, err := q.rows.apply(ctx, id, rowChange{to: to.Status(), reason: ev.Reason, actor: "hive:" + ev.PoolID,
		action: "worker." + lowerStatus(to.Status()), fromHive: true, meta: map[string]any{"event_from": ev.From, "event_to": ev.To},
		set: func(r *store.Row) {
			fillFromWorker(r, w)
			if to.Terminal() && r.StoppedAt == nil && !ev.At.IsZero() {
				at := micro(ev.At)
				r.StoppedAt = &at
			}
			if to.Serving() && r.ReadyAt == nil && !ev.At.IsZero() {
				at := micro(ev.At)
				r.ReadyAt = &at
			}
		}})
	switch {
	case errors.Is(err, ErrRefused), errors.Is(err, ErrRowEnded):
		return api.EventAck{Applied: false, Message: err.Error()}, nil
	case err != nil:
		return api.EventAck{}, err
	}
	return api.EventAck{Applied: changed}, nil
}

func lowerStatus(s lifecycle.Status) string {
	switch s {
	case rowStarting:
		return "starting"
	case rowRunning:
		return "running"
	case rowDraining:
		return "draining"
	case rowStopped:
		return "stopped"
	default:
		return "failed"
	}
}

// noPoolHas says whether the hives answered with their model lists
// (placement has just read them) and none has model: a start of it is a
// model not found, not a pool unavailable.
func (q *Queen) noPoolHas(model string) bool {
	cat := q.routing.Catalog()
	for _, models := range cat {
		if _, ok := models[model]; ok {
			return false
		}
	}
	return len(cat) > 0
}
