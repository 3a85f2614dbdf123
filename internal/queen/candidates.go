package queen

import (
	"cmp"
	"slices"
	"strings"
	"sync"

	"github.com/apiary-llm/apiary/internal/lifecycle"
	"github.com/apiary-llm/apiary/internal/registry"
	"github.com/apiary-llm/apiary/internal/routing"
)

// Candidates returns the workers of model (on pool, when it names one)
// that take requests now. A worker qualifies when its pool is healthy
// (not draining, unhealthy or offline), its hive reports it ready or busy
// (not starting, degraded or draining) with a URI, and its lifecycle row
// is RUNNING (a worker without a live row is being stopped). Workers run
// by hand (pool HandRunPool) qualify with a RUNNING row whose claim this
// queen took. A model's list is kept between requests until the
// registry, the rows or the tokens it came from change (candidateCache);
// the slice is shared and read only.
func (c controlPlane) Candidates(model, pool string) []routing.Candidate {
	q := c.q
	if pool != "" {
		out := q.poolCandidates(model, pool)
		if pool == HandRunPool {
			out = append(out, q.handRunCandidates(model)...)
			sortCandidates(out)
		}
		return out
	}
	gen := q.candidateGen(model)
	out, ok := q.cands.list(model, gen)
	if !ok {
		out = q.poolCandidates(model, "")
		q.cands.putList(model, gen, out)
	}
	if hand := q.handRunCandidates(model); len(hand) > 0 {
		out = append(slices.Clip(out), hand...) // a copy: out is shared
		sortCandidates(out)
	}
	return out
}

// sortCandidates puts cands in the order routing.ControlPlane.Candidates
// gives them: by key.
func sortCandidates(cands []routing.Candidate) {
	slices.SortFunc(cands, func(a, b routing.Candidate) int {
		return cmp.Or(strings.Compare(a.Key.Pool, b.Key.Pool), strings.Compare(a.Key.Worker, b.Key.Worker))
	})
}

// poolCandidates is Candidates without the cache and without the workers
// run by hand.
func (q *Queen) poolCandidates(model, pool string) []routing.Candidate {
	var pools []registry.Pool
	if pool == "" {
		// Only the pools with a worker of the model are copied out.
		pools = q.reg.Query(registry.Filter{Statuses: []registry.Status{registry.Healthy}, Model: model})
	} else if p, ok := q.reg.Get(pool); ok && p.Status == registry.Healthy {
		pools = []registry.Pool{p}
	}
	type found struct {
		pool string
		w    int
	}
	var ws []found
	for _, p := range pools {
		for i, w := range p.Workers {
			if w.ModelRef != model || w.URI == "" {
				continue
			}
			if st := lifecycle.State(w.Status); st != lifecycle.Ready && st != lifecycle.Busy {
				continue
			}
			ws = append(ws, found{p.ID, i})
		}
	}
	if len(ws) == 0 {
		return nil
	}
	byID := make(map[string]*registry.Pool, len(pools))
	for i := range pools {
		byID[pools[i].ID] = &pools[i]
	}
	// One lock of the rows and one of the tokens for them all.
	out := make([]routing.Candidate, 0, len(ws))
	q.rows.mu.RLock()
	for _, f := range ws {
		w := byID[f.pool].Workers[f.w]
		if id, ok := q.rows.runningRowLocked(f.pool, w.LifecycleID, w.WorkerID); ok {
			out = append(out, routing.Candidate{Key: routing.WorkerKey{Pool: f.pool, Worker: w.WorkerID}, LifecycleID: id, URI: w.URI, Reported: w.InFlight})
		}
	}
	q.rows.mu.RUnlock()
	q.tokens.mu.Lock()
	for i := range out {
		out[i].Token = q.tokens.byPool[out[i].Key.Pool][out[i].Key.Worker]
	}
	q.tokens.mu.Unlock()
	sortCandidates(out)
	return out
}

// Count counts the live rows of model (on pool, when it names one); with
// healthyOnly, only those on healthy pools: workers on drained or silent
// pools take no requests. The rows of workers run by hand count as on a
// healthy pool: a row waiting for its claim is a worker starting. Every
// request asks (is the model served?): a model's counts are kept like its
// candidates.
func (c controlPlane) Count(model, pool string, healthyOnly bool) routing.Count {
	q := c.q
	key := countKey{model, pool, healthyOnly}
	gen := q.candidateGen(model)
	if n, ok := q.cands.count(key, gen); ok {
		return n
	}
	var keep func(string) bool
	if healthyOnly {
		keep = func(id string) bool {
			if id == HandRunPool {
				return true
			}
			p, ok := q.reg.Get(id)
			return ok && p.Status == registry.Healthy
		}
	}
	n := q.rows.targetCounts(model, pool, keep)
	q.cands.putCount(key, gen, n)
	return n
}

// candidateGen is the generation of everything a model's candidates and
// counts are made of.
func (q *Queen) candidateGen(model string) candidateGen {
	return candidateGen{reg: q.reg.Generation(model), rows: q.rows.gen.Load(), tokens: q.tokens.gen.Load()}
}

type candidateGen struct {
	reg          registry.Generation
	rows, tokens uint64
}

// maxCachedTargets bounds the entries of each of candidateCache's maps
// (requests name models, and pools): when full, it starts again empty.
const maxCachedTargets = 4096

type countKey struct {
	model, pool string
	healthyOnly bool
}

// candidateCache keeps what routing asks for on every request, the
// candidates of a model and its counts, with the generation they were
// made at: an entry answers while the generation is unchanged, so a
// request to a model served by a thousand pools reads no pool.
type candidateCache struct {
	mu     sync.RWMutex
	lists  map[string]cachedList    // guarded by mu; by model
	counts map[countKey]cachedCount // guarded by mu
}

type cachedList struct {
	gen  candidateGen
	list []routing.Candidate
}

type cachedCount struct {
	gen candidateGen
	n   routing.Count
}

func newCandidateCache() *candidateCache {
	return &candidateCache{lists: map[string]cachedList{}, counts: map[countKey]cachedCount{}}
}

func (c *candidateCache) list(model string, gen candidateGen) ([]routing.Candidate, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	e, ok := c.lists[model]
	return e.list, ok && e.gen == gen
}

func (c *candidateCache) putList(model string, gen candidateGen, list []routing.Candidate) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.lists) >= maxCachedTargets {
		clear(c.lists)
	}
	c.lists[model] = cachedList{gen, list}
}

func (c *candidateCache) count(key countKey, gen candidateGen) (routing.Count, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	e, ok := c.counts[key]
	return e.n, ok && e.gen == gen
}

func (c *candidateCache) putCount(key countKey, gen candidateGen, n routing.Count) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.counts) >= maxCachedTargets {
		clear(c.counts)
	}
	c.counts[key] = cachedCount{gen, n}
}
