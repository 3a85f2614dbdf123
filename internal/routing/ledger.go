package routing

// What the queen has decided about a pool's workers and not yet seen in
// the pool's worker list. The list comes from the hive (its events and
// heartbeats): a worker the controller placed a moment ago is not in it
// yet, and one it is evicting still shows ready there. Placement and
// eviction look at the pools through the ledger (view), so that two
// decisions a moment apart do not both count the same memory or
// --max-loaded place, nor take the same worker.

import (
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/lifecycle"
	"github.com/apiary-llm/apiary/internal/registry"
)

// ledgerTTL bounds how long an entry waits to be seen in its pool's
// worker list: a hive's event or heartbeat brings it within seconds; an
// entry older than this (an event lost, a hive gone) is dropped, and the
// pool's list is trusted again.
const ledgerTTL = 2 * time.Minute

// reservation is a worker the controller placed (or made room for by an
// eviction) that its pool does not list yet: its model's estimate and a
// --max-loaded place are counted on its device from the decision until
// the pool lists the worker, or the placement gives up (release).
type reservation struct {
	id    uint64
	model string
	pool  string
	gpu   int
	// gpus and shares are a split's GPUs and the model's share on each
	// (Decision.GPUs, Decision.Shares); nil: gpu alone.
	gpus        []int
	shares      []uint64
	lifecycleID string // its row, once written; "" before
	at          time.Time
}

// evicting is a worker an eviction took: from the plan until its pool
// lists it draining or gone, placement sees it draining (its room is
// coming back, for the model it was taken for) and no other plan takes
// it.
type evicting struct {
	lifecycleID string
	model       string // the worker's
	forModel    string // the model it makes room for
	at          time.Time
}

// ledger holds the reservations and evictions; bounded by the placements
// under way (one per target at a time, see decideScale) and the workers
// they evict, and by ledgerTTL.
type ledger struct {
	mu     sync.Mutex
	starts map[uint64]*reservation // guarded by mu; by id
	stops  map[WorkerKey]evicting  // guarded by mu
	nextID uint64                  // guarded by mu
	// acted is when the queen last placed or evicted on each pool
	// (guarded by mu; one entry a pool).
	acted map[string]time.Time
}

func newLedger() *ledger {
	return &ledger{starts: map[uint64]*reservation{}, stops: map[WorkerKey]evicting{}, acted: map[string]time.Time{}}
}

// actedSince says whether the queen placed or evicted on pool after t
// (the pool's last heartbeat): its list may not show it yet, and room
// the list lacks may be on its way.
func (l *ledger) actedSince(pool string, t time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.acted[pool].After(t)
}

// noteLocked records that the queen acted on pool at now.
func (l *ledger) noteLocked(pool string, now time.Time) {
	if now.After(l.acted[pool]) {
		l.acted[pool] = now
	}
}

// reserve counts a worker of model on device gpu of pool from now on.
func (l *ledger) reserve(model, pool string, gpu int, now time.Time) *reservation {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.nextID++
	r := &reservation{id: l.nextID, model: model, pool: pool, gpu: gpu, at: now}
	l.starts[r.id] = r
	l.noteLocked(pool, now)
	return r
}

// move puts r on device gpu of pool (the placement chose another one
// than the eviction made room on).
func (l *ledger) move(r *reservation, pool string, gpu int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r.pool, r.gpu = pool, gpu
}

// split puts r over gpus with shares on each (a split placement), or
// on its gpu alone when gpus is nil.
func (l *ledger) split(r *reservation, gpus []int, shares []uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r.gpus, r.shares = gpus, shares
}

// started records r's row: the pool lists the worker under it soon.
func (l *ledger) started(r *reservation, lifecycleID string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r.lifecycleID = lifecycleID
}

// release drops r (the placement gave up, or failed); nil is a no-op.
func (l *ledger) release(r *reservation) {
	if r == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.starts, r.id)
	l.noteLocked(r.pool, time.Now())
}

// evict records the victims of an eviction for model forModel.
func (l *ledger) evict(vs []victim, forModel string, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, v := range vs {
		l.stops[v.key] = evicting{lifecycleID: v.lifecycleID, model: v.model, forModel: forModel, at: now}
		l.noteLocked(v.key.Pool, now)
	}
}

// unevict forgets a victim whose stop failed: it serves on.
func (l *ledger) unevict(k WorkerKey) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.stops, k)
}

// evicted says whether an eviction took k's worker.
func (l *ledger) evicted(k WorkerKey) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.stops[k]
	return ok
}

// stopping says whether an eviction's victim on pool has not left its
// pool's list yet: room there is on its way.
func (l *ledger) stopping(pool string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for k := range l.stops {
		if k.Pool == pool {
			return true
		}
	}
	return false
}

// evictedOf counts the victims of model whose rows count forward (running
// says whether a row still does: its stop has not been written yet).
func (l *ledger) evictedOf(model string, running func(pool, lifecycleID, worker string) bool) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for k, e := range l.stops {
		if e.model == model && running(k.Pool, e.lifecycleID, k.Worker) {
			n++
		}
	}
	return n
}

// placingOf counts the reservations of model whose row is not written
// yet: workers coming that no row counts.
func (l *ledger) placingOf(model string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, r := range l.starts {
		if r.model == model && r.lifecycleID == "" {
			n++
		}
	}
	return n
}

// view returns pools as placement must see them: each reservation the
// pool does not list yet (but except) added as a starting worker, each
// victim the pool still lists as serving shown draining. Entries their
// pool lists as they should be, and entries older than ledgerTTL, are
// dropped. The pools' worker lists are copied where they change.
func (l *ledger) view(pools []registry.Pool, except *reservation, now time.Time) []registry.Pool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.starts) == 0 && len(l.stops) == 0 {
		return pools
	}
	for id, r := range l.starts {
		if now.Sub(r.at) > ledgerTTL {
			delete(l.starts, id)
		}
	}
	for k, e := range l.stops {
		if now.Sub(e.at) > ledgerTTL {
			delete(l.stops, k)
		}
	}
	out := pools
	copied := false
	for i := range pools {
		p := &pools[i]
		workers := p.Workers
		changed := false
		edit := func() {
			if !changed {
				workers, changed = slices.Clone(p.Workers), true
			}
		}
		for k := range l.stops {
			if k.Pool != p.ID {
				continue
			}
			j := slices.IndexFunc(workers, func(w api.Worker) bool { return w.WorkerID == k.Worker })
			if j < 0 || !serving(workers[j]) {
				delete(l.stops, k) // the pool lists it stopping or gone
				continue
			}
			edit()
			workers[j].Status = string(lifecycle.Draining)
		}
		for id, r := range l.starts {
			if r.pool != p.ID {
				continue
			}
			if r.lifecycleID != "" && slices.ContainsFunc(p.Workers, func(w api.Worker) bool { return w.LifecycleID == r.lifecycleID }) {
				delete(l.starts, id) // the pool lists it
				continue
			}
			if r == except {
				continue
			}
			edit()
			workers = append(workers, r.worker())
		}
		if !changed {
			continue
		}
		if !copied {
			out, copied = slices.Clone(pools), true
		}
		out[i].Workers = workers
	}
	return out
}

// worker is r as a pool's worker list would show it: starting, holding
// its model's estimate (deviceFree), under an id no hive gives (a patient
// eviction plan may count it as a worker to wait for; none stops it).
func (r *reservation) worker() api.Worker {
	id := r.lifecycleID
	if id == "" {
		id = fmt.Sprintf("placing-%d", r.id)
	}
	w := api.Worker{WorkerID: fmt.Sprintf("placing-%d", r.id), LifecycleID: id, ModelRef: r.model, GPUDevice: r.gpu,
		Status: string(lifecycle.Starting), StartedAt: r.at}
	for i, g := range r.gpus {
		w.Devices = append(w.Devices, api.WorkerDevice{ID: g, VRAMBytes: r.shares[i]})
	}
	return w
}

// serving says whether a pool lists w as a worker that still serves (or
// is about to): not stopping, not ended.
func serving(w api.Worker) bool {
	st := lifecycle.State(w.Status)
	return live(w) && st != lifecycle.Draining
}

// busyLog remembers when placement first saw each worker reported busy by
// its hive (status busy, or requests in flight): a report older than the
// queen's own last request on the worker is explained by requests the
// queen relayed, all ended since when the queen has none in flight (see
// Service.evictable). Bounded: an entry goes when the worker is seen not
// busy, and entries older than an hour go when maxBusySeen is reached.
type busyLog struct {
	mu   sync.Mutex
	seen map[WorkerKey]time.Time // guarded by mu
}

// maxBusySeen bounds busyLog (a fleet's workers, not requests).
const maxBusySeen = 1 << 14

// note records what the hive reports of k now and returns since when it
// has been seen busy (zero: not busy).
func (b *busyLog) note(k WorkerKey, busy bool, now time.Time) time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !busy {
		delete(b.seen, k)
		return time.Time{}
	}
	if t, ok := b.seen[k]; ok {
		return t
	}
	if b.seen == nil {
		b.seen = map[WorkerKey]time.Time{}
	}
	if len(b.seen) >= maxBusySeen {
		for k, t := range b.seen {
			if now.Sub(t) > time.Hour {
				delete(b.seen, k)
			}
		}
	}
	b.seen[k] = now
	return now
}
