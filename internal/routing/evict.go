package routing

// Swap on demand: when no device anywhere has room for a model a request
// waits for, the controller stops the fewest least recently used idle
// workers of other models on one device to make room, waits until the
// hive reports the memory back, and places the worker there. The request
// waits meanwhile, as for any worker that is coming.

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/lifecycle"
	"github.com/apiary-llm/apiary/internal/registry"
)

// victim is a worker eviction may stop.
type victim struct {
	key         WorkerKey
	lifecycleID string
	model       string
	gpu         int            // its device (of a split worker, the first)
	on          map[int]uint64 // what it holds on each of its devices
	last        time.Time      // its last request through this queen (zero: none)
	wait        bool           // busy or young: only a patient plan takes it
}

// bytes is what v holds on all its devices.
func (v victim) bytes() uint64 {
	var n uint64
	for _, b := range v.on {
		n += b
	}
	return n
}

// eviction is a device and the workers to stop there (and, for a pool at
// its --max-loaded, on its other devices).
type eviction struct {
	pool    string
	gpu     int
	gpus    []int // of a split: every GPU it frees (gpu is the first)
	victims []victim
}

// ThrashEvictions is how many eviction rounds on one device within a
// minute turn Config.MinResidency on for it.
const ThrashEvictions = 2

// planEviction finds, among the pools model may run on, the device where
// stopping the fewest workers of other models makes room for one of
// model: every worker there that the config's groups keep apart from it,
// then the least recently used ones until need bytes are free, then, on
// a pool at its --max-loaded, the least recently used of its other
// devices' until one more fits. Ties go to the device whose newest victim
// was used longest ago. A worker may be taken when it is ready with no
// request in flight (the hive's count and the queen's) and none waiting
// for its model, its model is not pinned, it is not one its model's
// replica minimum keeps, and it is not protected by MinResidency on a
// device that thrashes. With patient, workers that are only busy or
// young count as well: would room come once they are done? A worker
// already stopping counts as gone. ok is false when no device can be
// freed; ok with no victims: room comes from workers already stopping.
// A patient plan waits for starting workers too.
func (s *Service) planEviction(model, pool string, need uint64, patient bool) (eviction, bool) {
	allowed := s.allowedPools(model)
	cat := s.catalog.snapshot()
	replicas := s.cp.Replicas()
	apart := s.apartFrom(model)
	now := time.Now()
	spare := map[string]int{} // workers of a model eviction may take, by model
	spareOf := func(m string) int {
		if n, ok := spare[m]; ok {
			return n
		}
		// Workers another eviction took whose stop is not written yet
		// still count as live rows: they are gone already. Workers being
		// placed have no row yet: they are coming.
		n := s.counts(target{model: m}, true).Live() + s.ledger.placingOf(m) - replicas[m].Min - s.ledger.evictedOf(m, s.cp.Running)
		spare[m] = n
		return n
	}
	var best eviction
	var bestNewest time.Time
	found := false
	for _, p := range s.pools(registry.Filter{Statuses: []registry.Status{registry.Healthy}}, nil) {
		if pool != "" && p.ID != pool || allowed != nil && !slices.Contains(allowed, p.ID) {
			continue
		}
		if _, ok := cat[p.ID][model]; !ok {
			continue
		}
		// Every worker of the pool that could be taken, least recently
		// used first; what leaves soon on its own is counted apart.
		var cands []victim
		takeable := map[string]bool{} // worker id → may be taken
		nLive := 0
		for _, w := range p.Workers {
			if !live(w) {
				continue
			}
			st := lifecycle.State(w.Status)
			if st == lifecycle.Draining {
				continue
			}
			nLive++
			idle := s.evictable(p.ID, w, model, now, false)
			if idle || patient && s.evictable(p.ID, w, model, now, true) {
				_, last := s.router.usage(WorkerKey{Pool: p.ID, Worker: w.WorkerID})
				on := map[int]uint64{}
				for _, id := range w.DeviceIDs() {
					on[id] = heldBy(w, id, cat[p.ID])
				}
				cands = append(cands, victim{key: WorkerKey{Pool: p.ID, Worker: w.WorkerID}, lifecycleID: w.LifecycleID,
					model: w.ModelRef, gpu: w.GPUDevice, on: on, last: last, wait: !idle})
				takeable[w.WorkerID] = true
			}
		}
		// Idle ones first, then the least recently used.
		slices.SortFunc(cands, func(a, b victim) int {
			if a.wait != b.wait {
				if a.wait {
					return 1
				}
				return -1
			}
			return a.last.Compare(b.last)
		})
		placedHere := false
	devices:
		for _, g := range p.GPUs {
			if g.Unusable != "" {
				continue
			}
			taken := map[string]int{}
			chosen := map[WorkerKey]bool{}
			var order []victim
			take := func(v victim) bool {
				if taken[v.model] >= spareOf(v.model) {
					return false // its replica minimum keeps it
				}
				taken[v.model]++
				chosen[v.key] = true
				order = append(order, v)
				return true
			}
			// The workers the groups keep apart must all go.
			for _, w := range p.Workers {
				if _, on := w.On(g.ID); !on || !live(w) || lifecycle.State(w.Status) == lifecycle.Draining || apart == nil || apart(w.ModelRef) == "" {
					continue
				}
				i := slices.IndexFunc(cands, func(v victim) bool { return v.key.Worker == w.WorkerID })
				if !takeable[w.WorkerID] || i < 0 || !take(cands[i]) {
					continue devices
				}
			}
			// What stops comes back (a reservation made for it counts
			// against it).
			free := freeOn(p, g, cat[p.ID], true)
			for _, v := range order {
				free += v.on[g.ID]
			}
			for _, v := range cands {
				if free >= need {
					break
				}
				if _, on := v.on[g.ID]; on && !chosen[v.key] && take(v) {
					free += v.on[g.ID]
				}
			}
			if free < need {
				continue
			}
			for _, v := range cands {
				if p.MaxLoaded <= 0 || nLive-len(order) < p.MaxLoaded {
					break
				}
				if !chosen[v.key] {
					take(v)
				}
			}
			if p.MaxLoaded > 0 && nLive-len(order) >= p.MaxLoaded {
				continue
			}
			if len(order) == 0 && deviceFree(p, g, cat[p.ID]) >= need && (p.MaxLoaded <= 0 || loaded(p) < p.MaxLoaded) {
				continue // neither memory nor --max-loaded stands in the way: placement refused the device for another reason
			}
			var newest time.Time
			for _, v := range order {
				if v.last.After(newest) {
					newest = v.last
				}
			}
			if !found || len(order) < len(best.victims) || len(order) == len(best.victims) && newest.Before(bestNewest) {
				best, bestNewest, found = eviction{pool: p.ID, gpu: g.ID, victims: order}, newest, true
			}
			placedHere = true
		}
		if placedHere || found {
			continue
		}
		// No one device of any pool so far can be freed for it: the
		// fewest GPUs of this pool that can, together (a split).
		if ev, ok := splitEviction(p, cands, cat[p.ID], need, nLive, spareOf); ok {
			best, found = ev, true
		}
	}
	return best, found
}

// splitEviction plans room for a model that no one device can hold, over
// the fewest GPUs of pool p (never the CPU, never across pools, as a
// split placement): the GPUs are taken roomiest first, counting what each
// has free and what its takeable workers (cands, in eviction order) hold
// there, until they hold need together; every takeable worker on them
// goes. spareOf bounds the workers of each model taken (replica minima).
func splitEviction(p registry.Pool, cands []victim, models map[string]api.Model, need uint64, nLive int, spareOf func(string) int) (eviction, bool) {
	type room struct {
		id   int
		free uint64
	}
	var rooms []room
	for _, g := range p.GPUs {
		if g.Unusable != "" || g.Kind == api.DeviceCPU {
			continue
		}
		r := room{id: g.ID, free: freeOn(p, g, models, true)}
		for _, v := range cands {
			r.free += v.on[g.ID]
		}
		rooms = append(rooms, r)
	}
	if len(rooms) < 2 {
		return eviction{}, false
	}
	slices.SortStableFunc(rooms, func(a, b room) int { return cmpDesc(a.free, b.free) })
	for n := 2; n <= len(rooms); n++ {
		chosen := rooms[:n]
		on := func(v victim) bool {
			return slices.ContainsFunc(chosen, func(r room) bool { _, ok := v.on[r.id]; return ok })
		}
		taken := map[string]int{}
		var order []victim
		for _, v := range cands {
			if !on(v) {
				continue
			}
			if taken[v.model] >= spareOf(v.model) {
				continue // its replica minimum keeps it: its room does not come
			}
			taken[v.model]++
			order = append(order, v)
		}
		var free uint64
		for _, r := range chosen {
			g := p.GPUs[slices.IndexFunc(p.GPUs, func(g api.GPU) bool { return g.ID == r.id })]
			free += freeOn(p, g, models, true)
			for _, v := range order {
				free += v.on[r.id]
			}
		}
		if free < need || len(order) == 0 || p.MaxLoaded > 0 && nLive-len(order) >= p.MaxLoaded {
			continue
		}
		gpus := make([]int, n)
		for i, r := range chosen {
			gpus[i] = r.id
		}
		slices.Sort(gpus)
		return eviction{pool: p.ID, gpu: gpus[0], gpus: gpus, victims: order}, true
	}
	return eviction{}, false
}

func cmpDesc(a, b uint64) int {
	switch {
	case a > b:
		return -1
	case a < b:
		return 1
	}
	return 0
}

// evictable says whether worker w of pool may be stopped to make room for
// a worker of model (see planEviction; patient: busy and young ones too).
// The hive's report that w is busy may be older than the queen's count:
// it probes its workers every --health-interval, and says busy until the
// next probe after a stream ended. A report the queen's own last request
// on w ended after (it saw the report before) is explained by requests the
// queen relayed, all ended when it has none in flight now: w is idle. A
// request from elsewhere still running is not cut either: an eviction
// drains the worker.
func (s *Service) evictable(pool string, w api.Worker, model string, now time.Time, patient bool) bool {
	st := lifecycle.State(w.Status)
	if w.ModelRef == model || w.ModelRef == "" || w.LifecycleID == "" || s.pinned(w.ModelRef) {
		return false
	}
	k := WorkerKey{Pool: pool, Worker: w.WorkerID}
	switch {
	case st == lifecycle.Ready, st == lifecycle.Busy:
	case patient && st == lifecycle.Starting:
		return true // a starting one is waited for: it serves what waits for it, then may go
	default:
		return false
	}
	reported := s.busy.note(k, st == lifecycle.Busy || w.InFlight > 0, now)
	if patient {
		return true
	}
	inflight, last := s.router.usage(k)
	if inflight > 0 || !reported.IsZero() && !last.After(reported) || s.router.waiting(w.ModelRef, pool) {
		return false // busy, or its own model's requests wait for it: served first
	}
	return !s.young(pool, w, now)
}

// young says whether the thrash rule protects w now: on a device that
// has had ThrashEvictions eviction rounds within the last minute, it has
// been ready less than its residency (see Config.MinResidency).
func (s *Service) young(pool string, w api.Worker, now time.Time) bool {
	if w.ReadyAt == nil || w.StartedAt.IsZero() {
		return false
	}
	residency := min(max(w.ReadyAt.Sub(w.StartedAt), s.cfg.MinResidency), s.cfg.SwapWait/2)
	if now.Sub(*w.ReadyAt) >= residency {
		return false
	}
	return s.evictions.roundsSince(pool, w.GPUDevice, now.Add(-time.Minute)) >= ThrashEvictions
}

// needOf is the memory a worker of model needs, from the first model list
// that has it (0: none does).
func (s *Service) needOf(model string) uint64 {
	for _, ms := range s.catalog.snapshot() {
		if m, ok := ms[model]; ok && m.SizeBytes > 0 {
			return modelNeed(m)
		}
	}
	return 0
}

// evict makes room for a worker of model (on pool when it is not ""): it
// plans an eviction and takes its victims (the router sends them no more
// requests, no other plan takes them) and reserves the room for model
// (no other placement counts it), in one step under placeMu; then it
// stops the victims (reason "evicted for MODEL", audited worker.evicted,
// counted in apiary_queen_evictions_total) and waits until a placement of
// model on that device would succeed (the memory reported back, the
// workers gone), at most EvictWait. It returns the reservation when the
// room is there; the caller places into it (or releases it).
func (c *controller) evict(ctx context.Context, model, pool string) (*reservation, bool) {
	s := c.s
	need := s.needOf(model)
	if need == 0 {
		return nil, false
	}
	s.placeMu.Lock()
	ev, ok := s.planEviction(model, pool, need, false)
	var res *reservation
	now := time.Now()
	if ok && s.router.claimIdle(ev.victims) {
		res = s.ledger.reserve(model, ev.pool, ev.gpu, now)
		s.ledger.evict(ev.victims, model, now)
	}
	s.placeMu.Unlock()
	if res == nil {
		c.log.Info("no idle workers to evict make room", "for", model, "need", api.FormatBytes(need))
		return nil, false
	}
	reason := "evicted for " + s.nameOf(model) // the name a person gave it
	var done []api.Eviction
	failed := false
	for _, v := range ev.victims {
		if failed {
			s.ledger.unevict(v.key)
			continue
		}
		e := api.Eviction{At: now.UTC(), WorkerID: v.key.Worker, LifecycleID: v.lifecycleID, GPUDevice: v.gpu, Model: v.model, For: model}
		meta := map[string]any{"for": s.nameOf(model), "for_ref": model, "model": s.nameOf(v.model), "model_ref": v.model, "pool_id": ev.pool, "gpu_device": v.gpu, "bytes": v.bytes()}
		if !v.last.IsZero() {
			t := v.last.UTC()
			e.LastUsedAt, meta["last_used_at"] = &t, t
		}
		if err := s.cp.EvictWorker(ctx, v.lifecycleID, reason, meta); err != nil {
			c.log.Warn("eviction could not stop a worker", "lifecycle_id", v.lifecycleID, "model_ref", v.model, "for", model, "err", err)
			s.ledger.unevict(v.key)
			failed = true
			continue
		}
		done = append(done, e)
		s.m.evictions.WithLabelValues(v.model, model).Inc()
		c.log.Info("worker evicted", "lifecycle_id", v.lifecycleID, "model_ref", v.model, "for", model, "pool_id", ev.pool,
			"gpu_device", v.gpu, "bytes", api.FormatBytes(v.bytes()), "last_used", v.last)
	}
	s.router.unclaim(ev.victims) // their rows are DRAINING: no candidates
	if len(done) > 0 {
		s.evictions.add(ev.pool, ev.gpu, now, done)
		for _, g := range ev.gpus[min(1, len(ev.gpus)):] {
			s.evictions.add(ev.pool, g, now, nil) // a round on each device of a split
		}
	}
	if failed {
		s.ledger.release(res)
		return nil, false
	}
	gpu := ev.gpu
	req := PlaceRequest{Model: model, Pool: ev.pool, GPU: &gpu, Pools: s.allowedPools(model), Engine: s.engineOf(model), Apart: s.apartFrom(model)}
	if len(ev.gpus) > 0 {
		req.GPU = nil // a split: the placement chooses the GPUs the room came back on
	}
	deadline := time.Now().Add(s.cfg.EvictWait)
	for {
		changed := s.changes.wait() // before the look: an event after it wakes the next wait
		req.Models = s.catalog.snapshot()
		if _, err := s.cfg.Placer.Place(s.pools(registry.Filter{}, res), req); err == nil {
			return res, true
		} else if time.Now().After(deadline) {
			c.log.Warn("evicted workers' room not back in time", "for", model, "pool_id", ev.pool, "gpu_device", ev.gpu, "wait", s.cfg.EvictWait, "err", err)
			s.ledger.release(res)
			return nil, false
		}
		select {
		case <-ctx.Done():
			s.ledger.release(res)
			return nil, false
		case <-changed:
		case <-time.After(evictPoll):
		}
	}
}

// claimIdle takes the victims of an eviction off routing, if each still
// has no request of the queen's in flight and none waiting for its model
// (checked under the router's lock, so that no request is routed to them
// in between); it reports whether it took them.
func (r *router) claimIdle(vs []victim) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, v := range vs {
		if n := r.inflight[v.key]; n != nil && *n > 0 || r.waitingLocked(target{v.model, ""}) || r.waitingLocked(target{v.model, v.key.Pool}) {
			return false
		}
	}
	for _, v := range vs {
		r.evicting[v.key] = true
	}
	return true
}

// unclaim gives the victims of an eviction back to routing: their stops
// are written (their rows are no longer RUNNING), or failed.
func (r *router) unclaim(vs []victim) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, v := range vs {
		delete(r.evicting, v.key)
	}
}

// swapWaitsLocked says whether worker k is idle while requests wait for a
// model other than its own (model): an eviction may make room for them.
func (r *router) swapWaitsLocked(k WorkerKey, model string) bool {
	if n := r.inflight[k]; n != nil && *n > 0 {
		return false
	}
	for t := range r.queues {
		if t.model != model {
			return true
		}
	}
	return false
}

// evictPoll is how often eviction looks for the room without an event
// (a GPU's memory comes back with a heartbeat).
const evictPoll = 50 * time.Millisecond

// evictionLog is what the queen remembers of its evictions: the rounds on
// each device within the last minute (for MinResidency), and each pool's
// latest evicted workers (for its listing).
type evictionLog struct {
	mu     sync.Mutex
	rounds map[deviceKey][]time.Time // by device, oldest first, the last minute's
	recent map[string][]api.Eviction // by pool, newest first, MaxEvictionsShown at most
}

type deviceKey struct {
	pool string
	gpu  int
}

// add records one eviction round on a device: the workers it stopped.
func (l *evictionLog) add(pool string, gpu int, at time.Time, evs []api.Eviction) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.rounds == nil {
		l.rounds, l.recent = map[deviceKey][]time.Time{}, map[string][]api.Eviction{}
	}
	k := deviceKey{pool, gpu}
	kept := l.rounds[k][:0]
	for _, t := range l.rounds[k] {
		if at.Sub(t) < time.Minute {
			kept = append(kept, t)
		}
	}
	l.rounds[k] = append(kept, at)
	for k, ts := range l.rounds {
		if len(ts) > 0 && at.Sub(ts[len(ts)-1]) >= time.Minute {
			delete(l.rounds, k) // a device not swapped for a minute
		}
	}
	rec := append(slices.Clone(evs), l.recent[pool]...)
	l.recent[pool] = rec[:min(len(rec), api.MaxEvictionsShown)]
}

// roundsSince counts the eviction rounds on a device since since.
func (l *evictionLog) roundsSince(pool string, gpu int, since time.Time) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, t := range l.rounds[deviceKey{pool, gpu}] {
		if t.After(since) {
			n++
		}
	}
	return n
}

// Evictions returns pool's latest evicted workers, newest first.
func (s *Service) Evictions(pool string) []api.Eviction {
	s.evictions.mu.Lock()
	defer s.evictions.mu.Unlock()
	return slices.Clone(s.evictions.recent[pool])
}

// LastUsed is when the worker last finished a request through this
// queen (zero: never since it started).
func (s *Service) LastUsed(pool, worker string) time.Time {
	_, last := s.router.usage(WorkerKey{Pool: pool, Worker: worker})
	return last
}
