// Package registry is the queen's pool registry: the hives
// that registered, what they last reported (devices, workers), and whether
// each is alive.
//
// A pool's liveness is a lease, one timer per pool (the nomad heartbeat
// design): every heartbeat re-arms it for the heartbeat timeout; when it
// fires the pool becomes unhealthy and the timer is re-armed for the
// unhealthy grace, after which the pool's workers are presumed lost
// (Config.OnLost). A deregistered pool is offline and its timer counts the
// offline retention, after which the pool is removed. Nothing polls.
//
// The registry owns the pools: one mutex guards them, every status change
// goes through changeLocked (table check, store write with its audit entry,
// log), and the store is written before memory changes on every request
// path, so a failed request changes nothing. Heartbeats that change no
// status touch memory only; Run flushes them to the store in batches.
package registry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/config"
	"github.com/apiary-llm/apiary/internal/lifecycle"
	"github.com/apiary-llm/apiary/internal/openai"
	"github.com/apiary-llm/apiary/internal/store"
)

// Sentinel errors.
var (
	ErrNotFound = openai.Sentinel(http.StatusNotFound, "pool_not_found", "pool not found")
	ErrOffline  = openai.Sentinel(http.StatusGone, "pool_offline", "pool is offline")
	ErrClosed   = openai.Sentinel(http.StatusServiceUnavailable, "shutting_down", "closed")
)

// Defaults from the contract's timing table.
const (
	DefaultHeartbeatTimeout = 30 * time.Second
	DefaultOfflineRetention = 5 * time.Minute
	DefaultFlushInterval    = 5 * time.Second
)

// ActorQueen is the audit actor of the changes the registry decides itself
// (lease expiry, removal).
const ActorQueen = "queen"

// Config is what a Registry needs.
type Config struct {
	Store            Store
	HeartbeatTimeout time.Duration // no beat for this long: unhealthy
	UnhealthyGrace   time.Duration // unhealthy this long: workers lost (default HeartbeatTimeout)
	OfflineRetention time.Duration // offline this long: removed
	FlushInterval    time.Duration // heartbeat data reaches the store this often
	// OnLost is called, outside the registry's lock, when a pool's workers
	// must be presumed gone: the pool stayed unhealthy past the grace, or
	// it went offline.
	OnLost func(poolID, reason string)
	Logger *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.HeartbeatTimeout == 0 {
		c.HeartbeatTimeout = DefaultHeartbeatTimeout
	}
	if c.UnhealthyGrace == 0 {
		c.UnhealthyGrace = c.HeartbeatTimeout
	}
	if c.OfflineRetention == 0 {
		c.OfflineRetention = DefaultOfflineRetention
	}
	if c.FlushInterval == 0 {
		c.FlushInterval = DefaultFlushInterval
	}
	if c.OnLost == nil {
		c.OnLost = func(string, string) {}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate reports what is wrong with c (after defaults), by field.
func (c Config) Validate() error {
	var p config.Problems
	if c.Store == nil {
		p.Add("Store", "is required")
	}
	for _, d := range []struct {
		field string
		v     time.Duration
	}{{"HeartbeatTimeout", c.HeartbeatTimeout}, {"UnhealthyGrace", c.UnhealthyGrace}, {"OfflineRetention", c.OfflineRetention},
		{"FlushInterval", c.FlushInterval}} {
		if d.v <= 0 {
			p.Add(d.field, "must be positive, got %s", d.v)
		}
	}
	return p.Err()
}

// Pool is a snapshot of one pool. Its slices are never changed after the
// snapshot is handed out.
type Pool struct {
	ID              string
	Endpoint        string
	NodeID          string
	Version         string
	Status          Status
	Drained         bool
	RegisteredAt    time.Time
	StatusChangedAt time.Time
	LastHeartbeatAt time.Time
	GPUs            []api.GPU
	Workers         []api.Worker
	// MaxLoaded is the hive's --max-loaded as it last registered (0: no
	// limit, or not registered since the queen started: it is not
	// stored, and the hive refuses a start past it either way).
	MaxLoaded int
	// Instance is the hive process that holds the pool, as it last
	// registered ("" for a hive that names none). It is stored, so that a
	// restarted queen still tells the holder from another hive with the
	// pool's id.
	Instance string
}

// entry is a pool with its lease. Every field is guarded by Registry.mu;
// the lease fields (marked) may also change under mu's read lock with
// beat held, by renew: whoever reads them under the read lock holds beat.
type entry struct {
	Pool // LastHeartbeatAt, GPUs and Workers are lease fields
	// beat guards the lease fields for those who hold mu's read lock
	// only. The heartbeats of ten thousand pools a second renew their
	// leases under it, not under mu (see renew).
	beat           sync.Mutex
	timer          *time.Timer
	deadline       time.Time // lease field; the timer's job is due at deadline
	lostPending    bool      // lease field; unhealthy and OnLost not called yet
	awaitInventory bool      // lease field; the next heartbeat is the first since (re)registration or queen start
	current        bool      // lease field; GPUs and Workers are the last full heartbeat's: an unchanged beat may renew them
	beatDirty      bool      // lease field; devices or workers not in the store yet
	savedBeatAt    time.Time // lease field; the LastHeartbeatAt the store holds (as this registry last wrote it)
	owner          *Spares   // lease field; the heartbeat stream whose beat brought GPUs and Workers (nil: another way)
	lent           bool      // lease field; GPUs or Workers were handed out since they came: they may be read outside the locks
	// restored is set for a pool that was live when the queen loaded it
	// and whose hive has not been heard from since (see Load): it is
	// unhealthy, yet held by its hive until heldUntil, the lease the
	// restart gave it.
	restored    bool
	heldUntil   time.Time
	statusDirty bool     // a status write failed; Flush retries it
	models      []string // the models of its live workers: its keys in Registry.byModel
}

// Registry is the set of pools. Create it with New, fill it with Load, keep
// its store up to date with Run, stop its timers with Close.
type Registry struct {
	cfg Config
	log *slog.Logger

	// wmu serializes the changes that write the store (changeLocked's
	// callers) and is held across their writes, so that they reach the
	// store in the order they were decided; mu guards the memory and is
	// released during those writes, so that queries (routing, on every
	// request) and heartbeats never wait for a slow or stalled store. Lock
	// order: wmu, then mu.
	wmu   sync.Mutex
	mu    sync.RWMutex
	pools map[string]*entry // guarded by mu
	order []*entry          // guarded by mu; the pools by id, for queries
	// byModel is the pools with a live worker of each model, by id
	// (guarded by mu): a query for a model's pools, which routing runs on every
	// request, reads those instead of every pool. Bounded by the pools
	// times the models of each.
	byModel map[string][]*entry // by id
	// modelGen counts, per model of byModel, the heartbeats under the
	// read lock (renew) that changed a worker of a pool serving it (the
	// map is guarded by mu, the counters are atomic); gen counts every
	// change under mu (a model's counter is dropped with its last pool,
	// which moves gen).
	modelGen     map[string]*atomic.Uint64
	gen          atomic.Uint64
	pendingAudit []store.AuditEntry // guarded by mu; entries whose write failed
	closed       bool               // guarded by mu

	hooks sync.WaitGroup // OnLost calls in flight
}

// New checks cfg and returns an empty registry.
func New(cfg Config) (*Registry, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Registry{cfg: cfg, log: cfg.Logger.With("component", "registry"), pools: map[string]*entry{},
		byModel: map[string][]*entry{}, modelGen: map[string]*atomic.Uint64{}}, nil
}

// Load reads the pools of the store. A pool that was live (healthy or
// draining) is restored unhealthy: the queen has not heard from its hive
// since it started, and a pool whose hive stopped with the queen must not
// be shown healthy or routed to. It comes back with its hive's first
// heartbeat (or Answered), and stays held by the hive that held it (its
// stored instance) for a full heartbeat timeout, the lease a restarted
// queen gives each hive: another hive with its pool id is refused
// meanwhile. Its workers are presumed lost after the timeout and the
// unhealthy grace, as a live pool's would be. An unhealthy pool gets a
// fresh grace. The first heartbeat of every loaded pool counts as its
// full inventory.
func (r *Registry) Load(ctx context.Context) error {
	recs, err := r.cfg.Store.LoadPools(ctx)
	if err != nil {
		return fmt.Errorf("load pools: %w", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	restored := 0
	for _, rec := range recs {
		e := &entry{Pool: fromRecord(rec), awaitInventory: true}
		r.addLocked(e)
		switch e.Status {
		case Offline:
			r.armLocked(e, e.StatusChangedAt.Add(r.cfg.OfflineRetention).Sub(now))
		case Unhealthy:
			e.lostPending = true
			r.armLocked(e, r.cfg.UnhealthyGrace)
		default:
			r.restoreLocked(e, now)
			restored++
		}
	}
	r.log.Info("loaded pools", "pools", len(recs), "awaiting_their_hives", restored)
	return nil
}

// addLocked adds a new pool to the map, the id order and the model index.
func (r *Registry) addLocked(e *entry) {
	r.pools[e.ID] = e
	i, _ := slices.BinarySearchFunc(r.order, e.ID, byID)
	r.order = slices.Insert(r.order, i, e)
	r.indexLocked(e)
}

// removeLocked forgets a pool.
func (r *Registry) removeLocked(e *entry) {
	r.gen.Add(1)
	delete(r.pools, e.ID)
	if i, ok := slices.BinarySearchFunc(r.order, e.ID, byID); ok {
		r.order = slices.Delete(r.order, i, i+1)
	}
	r.setModelsLocked(e, nil)
}

// indexLocked brings byModel in line with e's workers; every change of
// e.Workers is followed by it. A heartbeat that reports the models it
// reported before (nearly all of them) changes nothing and allocates
// nothing.
func (r *Registry) indexLocked(e *entry) {
	r.gen.Add(1)
	if !sameModels(e.models, e.Workers) {
		r.setModelsLocked(e, liveModels(e.Workers))
	}
}

func (r *Registry) setModelsLocked(e *entry, models []string) {
	for _, m := range e.models {
		pools := r.byModel[m]
		if i, ok := slices.BinarySearchFunc(pools, e.ID, byID); ok {
			pools = slices.Delete(pools, i, i+1)
		}
		if len(pools) == 0 {
			delete(r.byModel, m)
			delete(r.modelGen, m) // gen moved, so a new counter from 0 repeats no Generation
			continue
		}
		r.byModel[m] = pools
	}
	e.models = models
	for _, m := range models {
		pools, ok := r.byModel[m]
		if !ok {
			r.modelGen[m] = new(atomic.Uint64)
		}
		if i, found := slices.BinarySearchFunc(pools, e.ID, byID); !found {
			r.byModel[m] = slices.Insert(pools, i, e)
		}
	}
}

func byID(x *entry, id string) int { return strings.Compare(x.ID, id) }

// armLocked (re)starts e's timer to fire after d. The caller holds mu, or
// its read lock and e.beat.
func (r *Registry) armLocked(e *entry, d time.Duration) {
	d = max(d, 0)
	e.deadline = time.Now().Add(d)
	if e.timer == nil {
		e.timer = time.AfterFunc(d, func() { r.fire(e) })
		return
	}
	e.timer.Reset(d)
}

// change is one status change to persist and apply.
type change struct {
	actor, action, reason string
	meta                  map[string]any
}

// changeLocked is the one place a pool's registration or status changes:
// it checks the table, writes next with its audit entry, and only then
// puts next in memory. With force (the registry's own timers) memory
// changes even when the store write fails, and the write is retried by
// Flush: a silent pool must not be routed to because a disk was full.
//
// The caller holds wmu and mu; mu is released during the store write
// (and held again when changeLocked returns). What heartbeats and events
// changed meanwhile (last heartbeat, devices, workers) is kept unless the
// change itself sets it.
func (r *Registry) changeLocked(ctx context.Context, e *entry, next Pool, c change, force bool) error {
	from := Status("")
	if e != nil {
		from = e.Status
		if err := checkTransition(from, next.Status); err != nil {
			r.log.Error("refused pool status change", "pool_id", next.ID, "from", from, "to", next.Status, "reason", c.reason)
			return err
		}
	}
	if from != next.Status {
		next.StatusChangedAt = time.Now()
	}
	meta := map[string]any{"to": string(next.Status)}
	if from != "" {
		meta["from"] = string(from)
	}
	for k, v := range c.meta {
		meta[k] = v
	}
	audit := store.AuditEntry{TS: time.Now(), Actor: c.actor, Action: c.action, Target: next.ID, Reason: c.reason, Metadata: meta}
	var pre Pool
	if e != nil {
		pre = e.lend() // compared after the write, mu released meanwhile
	}
	rec := toRecord(next)
	r.mu.Unlock()
	err := r.cfg.Store.SavePool(ctx, rec, audit)
	r.mu.Lock()
	if err != nil && !force {
		return fmt.Errorf("save pool %s: %w", next.ID, err)
	}
	if e == nil {
		e = &entry{Pool: Pool{ID: next.ID}}
		r.addLocked(e)
	} else {
		keepNewer(&next, pre, e.Pool)
	}
	e.Pool = next
	e.lent = true // next's arrays are the caller's, or were lent as pre's
	r.indexLocked(e)
	if err != nil {
		e.statusDirty = true
		r.pendingAudit = append(r.pendingAudit, audit)
		r.log.Error("cannot save pool status; will retry", "pool_id", next.ID, "status", next.Status, "err", err)
	}
	if from != next.Status {
		r.log.Info("pool status changed", "pool_id", next.ID, "from", from, "to", next.Status, "reason", c.reason, "actor", c.actor)
	}
	return nil
}

// keepNewer keeps in next what heartbeats and events changed in memory
// (cur) since the change was decided (pre), where the change itself left
// it as it was.
func keepNewer(next *Pool, pre, cur Pool) {
	if next.LastHeartbeatAt.Equal(pre.LastHeartbeatAt) {
		next.LastHeartbeatAt = cur.LastHeartbeatAt
	}
	if reflect.DeepEqual(next.GPUs, pre.GPUs) {
		next.GPUs = cur.GPUs
	}
	if reflect.DeepEqual(next.Workers, pre.Workers) {
		next.Workers = cur.Workers
	}
}

// lockWrite takes wmu and mu, for a change that writes the store.
func (r *Registry) lockWrite() func() {
	r.wmu.Lock()
	r.mu.Lock()
	return func() { r.mu.Unlock(); r.wmu.Unlock() }
}

// Register records a hive's registration (an upsert): new and offline
// pools become healthy, an unhealthy one comes back (draining if it was
// drained), and its lease starts. The next heartbeat is its full inventory.
//
// A pool that another hive holds while it is alive (healthy or draining:
// its lease runs) is refused with a *HeldError; the same hive registering
// again (its instance, or its endpoint after a restart) is not. A pool
// whose holder stopped beating (unhealthy, offline) is taken over.
func (r *Registry) Register(ctx context.Context, reg api.RegisterPool, actor string) (Pool, error) {
	defer r.lockWrite()()
	if r.closed {
		return Pool{}, ErrClosed
	}
	now := time.Now()
	e := r.pools[reg.PoolID]
	next := Pool{ID: reg.PoolID, Status: Healthy, RegisteredAt: now, StatusChangedAt: now}
	reason := "registered"
	meta := map[string]any{"endpoint": reg.Endpoint, "version": reg.Version, "node_id": reg.NodeID}
	if other := r.endpointHolderLocked(reg, now); other != nil {
		err := &EndpointError{Endpoint: reg.Endpoint, Holder: other.lend()}
		r.log.Warn("registration refused: another live pool has the endpoint", "pool_id", reg.PoolID,
			"endpoint", reg.Endpoint, "node_id", reg.NodeID, "holder_pool_id", other.ID, "holder_node_id", other.NodeID)
		return Pool{}, err
	}
	if e != nil {
		if e.heldLocked(now) && !sameHive(e.Pool, reg) {
			err := &HeldError{PoolID: reg.PoolID, Holder: e.lend(), Registering: true}
			r.log.Warn("registration refused: another live hive holds the pool id", "pool_id", reg.PoolID,
				"endpoint", reg.Endpoint, "node_id", reg.NodeID, "holder_endpoint", e.Endpoint, "holder_node_id", e.NodeID)
			return Pool{}, err
		}
		next = e.lend()
		if next.Status == Offline {
			next.Drained = false
		}
		next.Status = live(next.Drained)
		next.Workers = nil // unknown until the inventory heartbeat
		reason = "registered again"
		if !sameHive(e.Pool, reg) {
			reason = fmt.Sprintf("taken over by another hive (the one at %s stopped beating %s ago)", e.Endpoint,
				now.Sub(e.LastHeartbeatAt).Round(time.Millisecond))
			meta["previous_endpoint"], meta["previous_node_id"] = e.Endpoint, e.NodeID
		}
	}
	next.Endpoint, next.NodeID, next.Version, next.Instance = reg.Endpoint, reg.NodeID, reg.Version, reg.Instance
	next.RegisteredAt, next.LastHeartbeatAt, next.GPUs, next.MaxLoaded = now, now, reg.GPUs, reg.MaxLoaded
	err := r.changeLocked(ctx, e, next, change{actor: actor, action: "pool.register", reason: reason, meta: meta}, false)
	if err != nil {
		return Pool{}, err
	}
	e = r.pools[reg.PoolID]
	e.awaitInventory, e.lostPending, e.beatDirty, e.current, e.restored = true, false, false, false, false
	r.armLocked(e, r.cfg.HeartbeatTimeout)
	return e.lend(), nil
}

// Beat is what the queen learns from a heartbeat beyond the pool itself.
type Beat struct {
	Status Status
	// FullInventory is true for the first heartbeat since the pool
	// registered or the queen loaded it: its workers are everything the
	// hive runs, and rows it lacks are gone.
	FullInventory bool
	RegisteredAt  time.Time
	// Workers are the pool's workers after the heartbeat: for an
	// unchanged beat, those of the last full one.
	Workers []api.Worker
	// FullWanted answers an unchanged beat the registry could not take
	// (it holds no full heartbeat of the pool since it registered, came
	// back or the queen started): nothing was renewed.
	FullWanted bool
	// Changed is true for a full beat whose devices or workers differ from
	// those the registry held, and for the first one since the pool
	// registered or came back. A full beat that repeats the last one
	// renews the lease as an unchanged beat does: the registry keeps what
	// it holds (nothing for the next flush to write).
	Changed bool
}

// Spares are the devices and workers arrays a heartbeat stream decodes
// its next beat into, so that a fleet whose hives report moving figures
// every second does not make the queen collect two arrays a beat. A
// stream passes the same Spares to every beat (HeartbeatReusing); the
// registry puts into it the arrays that nothing holds any more: the
// beat's own when it keeps none of them, or, when it keeps them, those
// they replace if that stream's previous beat brought them and they
// were never handed out since (a snapshot, a store write, a status
// change, another caller's Beat). The stream zeroes them before it
// decodes into them.
type Spares struct {
	GPUs    []api.GPU
	Workers []api.Worker
}

// keep puts a beat's arrays into s (when s is a stream's): the registry
// keeps none of them.
func (s *Spares) keep(hb api.Heartbeat) {
	if s != nil {
		s.GPUs, s.Workers = hb.GPUs, hb.Workers
	}
}

// lend is e's pool for use outside the locks (a snapshot, a store write,
// a change being decided): its arrays never go back to a stream as
// spares. The caller holds mu, or mu's read lock and e.beat.
func (e *entry) lend() Pool {
	e.lent = true
	return e.Pool
}

// take makes a beat's devices and workers e's; from is the stream's
// spares (nil for a beat that came another way), given the arrays they
// replace when they are free (see Spares).
func (e *entry) take(gpus []api.GPU, workers []api.Worker, from *Spares) {
	if from != nil && e.owner == from && !e.lent {
		from.GPUs, from.Workers = e.GPUs, e.Workers
	}
	e.GPUs, e.Workers, e.owner, e.lent = gpus, workers, from, false
}

// beatOf is the Beat that answers a heartbeat of e: its Workers are
// e's, lent unless the caller is the stream that brought them (which
// is done with them before its next beat).
func (e *entry) beatOf(from *Spares, changed bool) Beat {
	if from == nil || e.owner != from {
		e.lent = true
	}
	b := Beat{Status: e.Status, FullInventory: e.awaitInventory, RegisteredAt: e.RegisteredAt, Workers: e.Workers, Changed: changed}
	e.awaitInventory = false
	return b
}

// inventoryOf is what a heartbeat leaves e holding: an unchanged beat, or
// a full one equal to the last, keeps e's devices and workers (the
// decoded ones go); any other full beat brings its own, a change, which
// the store must have at the next flush (dirty) unless only figures that
// move on their own moved (inventoryMoved). The first full beat since
// the pool registered or came back is always a change.
func (e *entry) inventoryOf(hb api.Heartbeat) (gpus []api.GPU, workers []api.Worker, changed, dirty bool) {
	if hb.Unchanged {
		return e.GPUs, e.Workers, false, false
	}
	c := inventoryChanged
	if e.current {
		c = compareInventory(e.GPUs, e.Workers, hb.GPUs, hb.Workers)
	}
	if c == inventorySame {
		return e.GPUs, e.Workers, false, false
	}
	return hb.GPUs, hb.Workers, true, c == inventoryChanged
}

// Heartbeat renews the pool's lease and records its devices and workers.
// An unhealthy pool comes back. ErrNotFound and ErrOffline tell the hive to
// register again. An unchanged beat renews the devices and workers of the
// pool's last full heartbeat, or answers FullWanted (and renews nothing)
// when the registry holds none since the pool registered or came back.
func (r *Registry) Heartbeat(ctx context.Context, id string, hb api.Heartbeat) (Beat, error) {
	return r.HeartbeatReusing(ctx, id, hb, nil)
}

// HeartbeatReusing is Heartbeat for a heartbeat stream that decodes each
// beat into the arrays the one before left it (see Spares): spares is
// the stream's, the same for each of its beats, emptied by the caller
// before each; the arrays nothing holds after this beat are put into it.
func (r *Registry) HeartbeatReusing(ctx context.Context, id string, hb api.Heartbeat, spares *Spares) (Beat, error) {
	if b, ok := r.renew(id, hb, spares); ok {
		return b, nil
	}
	r.mu.Lock()
	if e := r.pools[id]; e != nil && e.Status == Unhealthy && !hb.Unchanged {
		// It comes back: a change that writes the store.
		r.mu.Unlock()
		defer r.lockWrite()()
	} else {
		defer r.mu.Unlock()
	}
	if r.closed {
		return Beat{}, ErrClosed
	}
	e := r.pools[id]
	switch {
	case e == nil:
		return Beat{}, fmt.Errorf("%w: %s", ErrNotFound, id)
	case e.Status == Offline:
		return Beat{}, fmt.Errorf("%w: %s", ErrOffline, id)
	case hb.Unchanged && !e.current:
		spares.keep(hb)
		return Beat{Status: e.Status, FullWanted: true}, nil
	}
	now := time.Now()
	changed := false
	if e.Status == Unhealthy {
		gpus, workers := hb.GPUs, hb.Workers
		if hb.Unchanged {
			gpus, workers = e.GPUs, e.Workers
			spares.keep(hb)
		}
		changed = !hb.Unchanged
		next := e.lend()
		next.Status = live(e.Drained)
		next.LastHeartbeatAt, next.GPUs, next.Workers = now, gpus, workers
		reason := fmt.Sprintf("heartbeat resumed after %s", now.Sub(e.LastHeartbeatAt).Round(time.Millisecond))
		if e.restored {
			reason = fmt.Sprintf("its hive's first heartbeat since the queen restarted (%s after the one before)",
				now.Sub(e.LastHeartbeatAt).Round(time.Millisecond))
		}
		err := r.changeLocked(ctx, e, next, change{actor: "hive:" + id, action: "pool." + string(next.Status), reason: reason}, false)
		if err != nil {
			return Beat{}, err
		}
		e.restored = false
	} else {
		gpus, workers, c, dirty := e.inventoryOf(hb)
		if changed = c; changed {
			e.take(gpus, workers, spares)
		} else {
			spares.keep(hb)
		}
		e.LastHeartbeatAt = now
		r.indexLocked(e)
		e.beatDirty = e.beatDirty || dirty
	}
	e.lostPending, e.current = false, true
	r.armLocked(e, r.cfg.HeartbeatTimeout)
	return e.beatOf(spares, changed), nil
}

// renew is Heartbeat for a beat that changes no status and no model
// index, nearly all of them: under mu's read lock, with only the pool's
// beat lock held exclusively, so that the beats of different pools never
// wait for each other, nor for a query. ok is false for any other beat,
// which Heartbeat takes under mu.
func (r *Registry) renew(id string, hb api.Heartbeat, spares *Spares) (b Beat, ok bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	e := r.pools[id]
	if r.closed || e == nil || e.Status != Healthy && e.Status != Draining {
		return Beat{}, false
	}
	if !hb.Unchanged && !sameModels(e.models, hb.Workers) {
		return Beat{}, false // byModel changes
	}
	e.beat.Lock()
	defer e.beat.Unlock()
	if hb.Unchanged && !e.current {
		spares.keep(hb)
		return Beat{Status: e.Status, FullWanted: true}, true
	}
	gpus, workers, changed, dirty := e.inventoryOf(hb)
	if changed {
		if !sameRouting(e.Workers, workers) {
			for _, m := range e.models {
				r.modelGen[m].Add(1)
			}
		}
		e.take(gpus, workers, spares)
	} else {
		spares.keep(hb)
	}
	e.LastHeartbeatAt = time.Now()
	e.beatDirty = e.beatDirty || dirty
	e.lostPending, e.current = false, true
	r.armLocked(e, r.cfg.HeartbeatTimeout)
	return e.beatOf(spares, changed), true
}

// Drain marks the pool drained: it gets no new work. Draining a drained
// pool changes nothing.
func (r *Registry) Drain(ctx context.Context, id, actor, reason string) (Pool, error) {
	return r.setDrained(ctx, id, actor, reason, true)
}

// Undrain takes a drained pool back: it gets new workers again. It is
// healthy at once when it was draining, and stays unhealthy until its
// heartbeats return when it was unhealthy. A pool not drained is left as
// it is.
func (r *Registry) Undrain(ctx context.Context, id, actor, reason string) (Pool, error) {
	return r.setDrained(ctx, id, actor, reason, false)
}

// setDrained drains or undrains a pool that is not offline.
func (r *Registry) setDrained(ctx context.Context, id, actor, reason string, drained bool) (Pool, error) {
	verb, action := "drained", "pool.drain"
	if !drained {
		verb, action = "undrained; its hive registers it again", "pool.undrain"
	}
	defer r.lockWrite()()
	if r.closed {
		return Pool{}, ErrClosed
	}
	e := r.pools[id]
	switch {
	case e == nil:
		return Pool{}, fmt.Errorf("%w: %s", ErrNotFound, id)
	case e.Status == Offline:
		return Pool{}, fmt.Errorf("%w: %s cannot be %s", ErrOffline, id, verb)
	case e.Drained == drained:
		return e.lend(), nil
	}
	next := e.lend()
	next.Drained = drained
	switch {
	case drained && next.Status == Healthy:
		next.Status = Draining
	case !drained && next.Status == Draining:
		next.Status = Healthy
	}
	if err := r.changeLocked(ctx, e, next, change{actor: actor, action: action, reason: reason}, false); err != nil {
		return Pool{}, err
	}
	return e.lend(), nil
}

// Deregister takes the pool offline: its workers are presumed gone, and it
// is removed after the offline retention unless its hive registers again.
func (r *Registry) Deregister(ctx context.Context, id, actor, reason string) (Pool, error) {
	return r.deregister(ctx, id, actor, reason, true)
}

// Vacate takes a pool offline as Deregister does, but its workers are not
// lost: they outlive its hive (Kubernetes Pods), and the next hive of the
// pool, which may now register, reconciles them with its first
// heartbeat.
func (r *Registry) Vacate(ctx context.Context, id, actor, reason string) (Pool, error) {
	return r.deregister(ctx, id, actor, reason, false)
}

func (r *Registry) deregister(ctx context.Context, id, actor, reason string, lose bool) (Pool, error) {
	r.wmu.Lock()
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		r.wmu.Unlock()
		return Pool{}, ErrClosed
	}
	e := r.pools[id]
	switch {
	case e == nil:
		r.mu.Unlock()
		r.wmu.Unlock()
		return Pool{}, fmt.Errorf("%w: %s", ErrNotFound, id)
	case e.Status == Offline:
		p := e.lend()
		r.mu.Unlock()
		r.wmu.Unlock()
		return p, nil
	}
	next := e.lend()
	next.Status, next.Drained, next.Workers = Offline, false, nil
	if err := r.changeLocked(ctx, e, next, change{actor: actor, action: "pool.offline", reason: reason}, false); err != nil {
		r.mu.Unlock()
		r.wmu.Unlock()
		return Pool{}, err
	}
	e.lostPending, e.awaitInventory, e.restored = false, false, false
	r.armLocked(e, r.cfg.OfflineRetention)
	p := e.lend()
	if !lose {
		r.mu.Unlock()
		r.wmu.Unlock()
		return p, nil
	}
	r.hooks.Add(1)
	r.mu.Unlock()
	r.wmu.Unlock()
	defer r.hooks.Done()
	r.cfg.OnLost(id, "pool deregistered: "+reason)
	return p, nil
}

// MarkUnhealthy makes a live (healthy or draining) pool unhealthy at once,
// as its lease expiring would, for a reason found on the way: its hive did
// not take a connection the queen opened. Placement and routing stop
// choosing it now rather than after the heartbeat timeout, with every
// request meanwhile failing against it. As after a lease expiry the change
// is audited (pool.unhealthy, actor queen, with reason), the pool's
// workers are presumed lost after the unhealthy grace, and its hive's
// next full heartbeat brings it back. A pool that is not live is left as
// it is (false).
func (r *Registry) MarkUnhealthy(ctx context.Context, id, reason string) (bool, error) {
	defer r.lockWrite()()
	if r.closed {
		return false, ErrClosed
	}
	e := r.pools[id]
	switch {
	case e == nil:
		return false, fmt.Errorf("%w: %s", ErrNotFound, id)
	case e.Status != Healthy && e.Status != Draining:
		return false, nil
	}
	next := e.lend()
	next.Status = Unhealthy
	// As the lease timer's change: memory changes even when the store
	// write fails (Flush retries it): a pool that does not answer must
	// not be routed to because a disk was full.
	_ = r.changeLocked(ctx, e, next, change{actor: ActorQueen, action: "pool.unhealthy", reason: reason}, true)
	e.lostPending, e.current = true, false // it comes back with a full heartbeat
	r.armLocked(e, r.cfg.UnhealthyGrace)
	return true, nil
}

// fire runs e's timer job: lease expiry, end of the unhealthy grace, or end
// of the offline retention. A timer that was re-armed after it fired finds
// its deadline in the future and does nothing.
func (r *Registry) fire(e *entry) {
	r.wmu.Lock()
	r.mu.Lock()
	if r.closed || r.pools[e.ID] != e || time.Now().Before(e.deadline) {
		r.mu.Unlock()
		r.wmu.Unlock()
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var lost string
	switch e.Status {
	case Healthy, Draining:
		silent := time.Since(e.LastHeartbeatAt).Round(time.Millisecond)
		next := e.lend()
		next.Status = Unhealthy
		_ = r.changeLocked(ctx, e, next, change{actor: ActorQueen, action: "pool.unhealthy",
			reason: fmt.Sprintf("no heartbeat for %s (timeout %s)", silent, r.cfg.HeartbeatTimeout)}, true)
		e.lostPending, e.current = true, false // it comes back with a full heartbeat
		r.armLocked(e, r.cfg.UnhealthyGrace)
	case Unhealthy:
		if e.lostPending {
			e.lostPending = false
			lost = fmt.Sprintf("pool unhealthy for %s (no heartbeat for %s)", time.Since(e.StatusChangedAt).Round(time.Millisecond),
				time.Since(e.LastHeartbeatAt).Round(time.Millisecond))
			// Still silent after the offline retention: offline, and
			// removed after another (an unhealthy pool is not kept
			// forever).
			r.armLocked(e, r.cfg.OfflineRetention)
			break
		}
		next := e.lend()
		next.Status, next.Drained, next.Workers = Offline, false, nil
		_ = r.changeLocked(ctx, e, next, change{actor: ActorQueen, action: "pool.offline",
			reason: fmt.Sprintf("no heartbeat for %s", time.Since(e.LastHeartbeatAt).Round(time.Millisecond))}, true)
		r.armLocked(e, r.cfg.OfflineRetention)
	case Offline:
		audit := store.AuditEntry{TS: time.Now(), Actor: ActorQueen, Action: "pool.remove", Target: e.ID,
			Reason: fmt.Sprintf("offline for %s (retention %s)", time.Since(e.StatusChangedAt).Round(time.Millisecond), r.cfg.OfflineRetention)}
		r.mu.Unlock() // no lock across the store write; wmu keeps the order
		err := r.cfg.Store.RemovePool(ctx, e.ID, audit)
		r.mu.Lock()
		if err != nil {
			r.log.Error("cannot remove offline pool; will retry", "pool_id", e.ID, "err", err)
			r.armLocked(e, r.cfg.FlushInterval)
			break
		}
		e.timer.Stop()
		r.removeLocked(e)
		r.log.Info("removed offline pool", "pool_id", e.ID, "reason", audit.Reason)
	}
	if lost == "" {
		r.mu.Unlock()
		r.wmu.Unlock()
		return
	}
	r.hooks.Add(1)
	r.mu.Unlock()
	r.wmu.Unlock()
	defer r.hooks.Done()
	r.log.Warn("pool lost: its workers are presumed gone", "pool_id", e.ID, "reason", lost)
	r.cfg.OnLost(e.ID, lost)
}

// MaxWorkersPerPool bounds the workers one pool may report (a heartbeat
// with more is refused); events never grow a pool's list beyond it.
const MaxWorkersPerPool = 4096

// UpdateWorker records a worker's state from a hive event at once (the next
// heartbeat would bring it too): placement and routing see a worker ready
// or gone without waiting a heartbeat interval.
func (r *Registry) UpdateWorker(poolID string, w api.Worker) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.pools[poolID]
	if e == nil || e.Status == Offline {
		return
	}
	gone := lifecycle.State(w.Status).Terminal()
	workers := make([]api.Worker, 0, len(e.Workers)+1)
	found := false
	for _, x := range e.Workers {
		if x.WorkerID == w.WorkerID {
			found = true
			if gone {
				continue
			}
			x = w
		}
		workers = append(workers, x)
	}
	if !found && !gone && len(workers) < MaxWorkersPerPool {
		workers = append(workers, w) // beyond the bound, the next heartbeat tells
	}
	e.Workers = workers // a new slice: snapshots handed out keep theirs
	r.indexLocked(e)
	e.beatDirty = true
}

// BeatTimeSave is how stale the store's last_heartbeat_at of a pool whose
// devices and workers did not change may get while the queen runs: such a
// pool's row is written when its time is that old, not at every flush (a
// fleet at rest would otherwise rewrite every pool's row each flush). The
// queen's API answers from memory; the final flush writes every time.
const BeatTimeSave = time.Minute

// Flush writes every heartbeat datum not yet in the store (the time of
// every pool included), and retries status writes and audit entries that
// failed.
func (r *Registry) Flush(ctx context.Context) error { return r.flush(ctx, true) }

// flush writes the pools whose devices or workers changed, and those whose
// stored heartbeat time is BeatTimeSave old (every time one when all).
func (r *Registry) flush(ctx context.Context, all bool) error {
	if err := r.flushStatuses(ctx); err != nil {
		return err
	}
	// The pools are read under the read lock, as heartbeats renew them:
	// a flush of ten thousand pools holds up no heartbeat.
	r.mu.RLock()
	var dirty []Pool // snapshots; encoded after the lock is released
	var retried []string
	for id, e := range r.pools {
		e.beat.Lock()
		late := e.LastHeartbeatAt.Sub(e.savedBeatAt)
		if e.beatDirty || late >= BeatTimeSave || (all && late > 0) {
			dirty = append(dirty, e.lend())
			retried = append(retried, id)
			e.beatDirty = false
		}
		e.beat.Unlock()
	}
	r.mu.RUnlock()
	r.mu.Lock()
	audit := r.pendingAudit
	r.pendingAudit = nil
	r.mu.Unlock()
	if len(dirty) == 0 && len(audit) == 0 {
		return nil
	}
	beats := make([]store.Pool, 0, len(dirty))
	for _, p := range dirty {
		beats = append(beats, toRecord(p))
	}
	if err := r.cfg.Store.SaveBeats(ctx, beats, audit); err != nil {
		r.mu.Lock()
		for _, id := range retried {
			if e := r.pools[id]; e != nil {
				e.beatDirty = true
			}
		}
		r.pendingAudit = append(audit, r.pendingAudit...)
		r.mu.Unlock()
		return fmt.Errorf("save heartbeats: %w", err)
	}
	r.mu.RLock()
	for _, p := range dirty {
		if e := r.pools[p.ID]; e != nil {
			e.beat.Lock()
			if p.LastHeartbeatAt.After(e.savedBeatAt) {
				e.savedBeatAt = p.LastHeartbeatAt
			}
			e.beat.Unlock()
		}
	}
	r.mu.RUnlock()
	return nil
}

// flushStatuses retries the status writes that failed (a timer's change
// is in memory already), in the order of the other status changes (wmu),
// without holding mu across the writes.
func (r *Registry) flushStatuses(ctx context.Context) error {
	r.wmu.Lock()
	defer r.wmu.Unlock()
	r.mu.Lock()
	var pending []Pool
	for _, e := range r.pools {
		if e.statusDirty {
			pending = append(pending, e.lend())
		}
	}
	r.mu.Unlock()
	for _, p := range pending {
		if err := r.cfg.Store.SavePool(ctx, toRecord(p)); err != nil {
			return fmt.Errorf("save pool %s: %w", p.ID, err)
		}
		r.mu.Lock()
		if e := r.pools[p.ID]; e != nil {
			e.statusDirty = false
		}
		r.mu.Unlock()
	}
	return nil
}

// Run flushes heartbeat data every flush interval until ctx ends, then
// once more.
func (r *Registry) Run(ctx context.Context) error {
	t := time.NewTicker(r.cfg.FlushInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			if err := r.Flush(fctx); err != nil {
				r.log.Error("final flush failed", "err", err)
			}
			return nil
		case <-t.C:
			if err := r.flush(ctx, false); err != nil {
				r.log.Error("flush failed", "err", err)
			}
		}
	}
}

// Close stops every timer and waits for OnLost calls in flight. Later calls
// answer ErrClosed. It is idempotent.
//
// Order:
//  1. mark closed (a timer that fires now does nothing),
//  2. stop every pool's timer,
//  3. wait for OnLost calls that already started.
func (r *Registry) Close() {
	r.mu.Lock()
	r.closed = true
	for _, e := range r.pools {
		if e.timer != nil {
			e.timer.Stop()
		}
	}
	r.mu.Unlock()
	r.hooks.Wait()
}

func toRecord(p Pool) store.Pool {
	gpus, _ := json.Marshal(nonNil(p.GPUs))
	workers, _ := json.Marshal(nonNil(p.Workers))
	rec := store.Pool{ID: p.ID, Endpoint: p.Endpoint, NodeID: p.NodeID, Version: p.Version, Status: string(p.Status),
		Drained: p.Drained, RegisteredAt: p.RegisteredAt, StatusChangedAt: p.StatusChangedAt, GPUs: gpus, Workers: workers,
		Instance: p.Instance}
	if !p.LastHeartbeatAt.IsZero() {
		t := p.LastHeartbeatAt
		rec.LastHeartbeatAt = &t
	}
	return rec
}

func fromRecord(rec store.Pool) Pool {
	p := Pool{ID: rec.ID, Endpoint: rec.Endpoint, NodeID: rec.NodeID, Version: rec.Version, Status: Status(rec.Status),
		Drained: rec.Drained, RegisteredAt: rec.RegisteredAt, StatusChangedAt: rec.StatusChangedAt, Instance: rec.Instance}
	if rec.LastHeartbeatAt != nil {
		p.LastHeartbeatAt = *rec.LastHeartbeatAt
	}
	_ = json.Unmarshal(rec.GPUs, &p.GPUs)
	_ = json.Unmarshal(rec.Workers, &p.Workers)
	if _, err := ParseStatus(rec.Status); err != nil {
		p.Status = Unhealthy // an unknown status from a newer binary: route nothing to it until it beats
	}
	return p
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

func isNotFound(err error) bool { return errors.Is(err, store.ErrNotFound) }
