package routing

// Swap on demand: when no device anywhere has room for a model a request
// waits for, the controller stops the fewest least recently used idle
// workers of other models on one device to make room, waits until the
// hive reports the memory back, and places the worker there. The request
// waits meanwhile, as for any worker that is coming.

import (
	"context"
	"slices"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/lifecycle"
	"github.com/apiary-llm/apiary/internal/registry"
)

// victim is an idle worker eviction may stop.
type victim struct {
	key         WorkerKey
	lifecycleID string
	model       string
	bytes       uint64
	last        time.Time // its last request through this queen (zero: none)
}

// eviction is a device and the workers to stop there.
type eviction struct {
	pool    string
	gpu     int
	victims []victim
}

// planEviction finds, among the pools model may run on, the device where
// stopping the fewest idle workers of other models (least recently used
// first) frees need bytes; ties go to the device whose newest victim was
// used longest ago. A worker is idle when it is ready with no request in
// flight (the hive's count and the queen's) and none waiting for its
// model; a model's workers up to its replica minimum are kept. With
// busyToo, busy workers count as well: would room come once they are
// done? ok is false when no device can be freed.
func (s *Service) planEviction(model, pool string, need uint64, busyToo bool) (eviction, bool) {
	allowed := s.allowedPools(model)
	cat := s.catalog.snapshot()
	replicas := s.cp.Replicas()
	spare := map[string]int{} // workers of a model eviction may take, by model
	spareOf := func(m string) int {
		if n, ok := spare[m]; ok {
			return n
		}
		n := s.counts(target{model: m}, true).Live() - replicas[m].Min
		spare[m] = n
		return n
	}
	var best eviction
	var bestNewest time.Time
	found := false
	for _, p := range s.cp.Pools(registry.Filter{Statuses: []registry.Status{registry.Healthy}}) {
		if pool != "" && p.ID != pool || allowed != nil && !slices.Contains(allowed, p.ID) {
			continue
		}
		if _, ok := cat[p.ID][model]; !ok {
			continue
		}
		for _, g := range p.GPUs {
			if g.Unusable != "" {
				continue
			}
			var cands []victim
			for _, w := range p.Workers {
				st := lifecycle.State(w.Status)
				if w.GPUDevice != g.ID || w.ModelRef == model || w.ModelRef == "" || w.LifecycleID == "" ||
					st != lifecycle.Ready && !(busyToo && st == lifecycle.Busy) {
					continue
				}
				k := WorkerKey{Pool: p.ID, Worker: w.WorkerID}
				inflight, last := s.router.usage(k)
				if !busyToo && (w.InFlight > 0 || inflight > 0 || s.router.waiting(w.ModelRef, p.ID)) {
					continue // busy, or its own model's requests wait for it: served first
				}
				cands = append(cands, victim{key: k, lifecycleID: w.LifecycleID, model: w.ModelRef, bytes: w.VRAMBytes, last: last})
			}
			slices.SortFunc(cands, func(a, b victim) int { return a.last.Compare(b.last) })
			free := deviceFree(p, g, cat[p.ID])
			taken := map[string]int{}
			var chosen []victim
			for _, v := range cands {
				if free >= need {
					break
				}
				if taken[v.model] >= spareOf(v.model) {
					continue // its replica minimum keeps it
				}
				taken[v.model]++
				chosen = append(chosen, v)
				free += v.bytes
			}
			if free < need || len(chosen) == 0 {
				continue
			}
			newest := chosen[len(chosen)-1].last
			if !found || len(chosen) < len(best.victims) || len(chosen) == len(best.victims) && newest.Before(bestNewest) {
				best, bestNewest, found = eviction{pool: p.ID, gpu: g.ID, victims: chosen}, newest, true
			}
		}
	}
	return best, found
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
// plans an eviction, stops its victims (reason "evicted for MODEL",
// audited as any stop, counted in apiary_queen_evictions_total) and waits
// until the hive reports the device with need bytes free, at most
// EvictWait. It reports whether the room is there.
func (c *controller) evict(ctx context.Context, model, pool string) bool {
	need := c.s.needOf(model)
	if need == 0 {
		return false
	}
	ev, ok := c.s.planEviction(model, pool, need, false)
	if !ok {
		c.log.Info("no idle workers to evict make room", "for", model, "need", api.FormatBytes(need))
		return false
	}
	reason := "evicted for " + model
	for _, v := range ev.victims {
		if err := c.s.cp.StopWorker(ctx, v.lifecycleID, reason); err != nil {
			c.log.Warn("eviction could not stop a worker", "lifecycle_id", v.lifecycleID, "model_ref", v.model, "for", model, "err", err)
			return false
		}
		c.s.m.evictions.WithLabelValues(v.model, model).Inc()
		c.log.Info("worker evicted", "lifecycle_id", v.lifecycleID, "model_ref", v.model, "for", model, "pool_id", ev.pool,
			"gpu_device", ev.gpu, "bytes", api.FormatBytes(v.bytes), "last_used", v.last)
	}
	deadline := time.Now().Add(c.s.cfg.EvictWait)
	for {
		if p, ok := c.s.cp.Pool(ev.pool); ok {
			for _, g := range p.GPUs {
				if g.ID == ev.gpu && deviceFree(p, g, c.s.catalog.snapshot()[ev.pool]) >= need {
					return true
				}
			}
		}
		if time.Now().After(deadline) {
			c.log.Warn("evicted workers' memory not back in time", "for", model, "pool_id", ev.pool, "gpu_device", ev.gpu, "wait", c.s.cfg.EvictWait)
			return false
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(evictPoll):
		}
	}
}

// evictPoll is how often eviction looks for the memory back.
const evictPoll = 50 * time.Millisecond
