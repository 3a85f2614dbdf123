package queen

import (
	"cmp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
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
	out, ok := q.cands.list(model, gen, time.Now())
	if !ok {
		out = q.poolCandidates(model, "")
		q.cands.putList(model, gen, out, time.Now())
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
	var out []routing.Candidate
	if pool == "" {
		out = make([]routing.Candidate, 0, q.reg.ServingCount(model)) // a worker each, mostly
	}
	add := func(id string, status registry.Status, workers []api.Worker) {
		// A drained pool gets no new workers; its running workers serve
		// on (an unhealthy pool's are not trusted).
		if status != registry.Healthy && status != registry.Draining {
			return
		}
		first := len(out)
		for _, w := range workers {
			if w.ModelRef != model || w.URI == "" {
				continue
			}
			if st := lifecycle.State(w.Status); st != lifecycle.Ready && st != lifecycle.Busy {
				continue
			}
			// LifecycleID holds the hive's lifecycle id until the row is
			// looked up below.
			out = append(out, routing.Candidate{Key: routing.WorkerKey{Pool: id, Worker: w.WorkerID}, LifecycleID: w.LifecycleID,
				URI: w.URI, Reported: w.InFlight})
		}
		if len(out)-first > 1 { // the pools come by id; a pool's workers are put in order here
			sortCandidates(out[first:])
		}
	}
	if pool == "" {
		q.reg.ServingPools(model, add)
	} else if p, ok := q.reg.Get(pool); ok {
		add(p.ID, p.Status, p.Workers)
	}
	// One lock of the rows and one of the tokens for them all.
	q.rows.mu.RLock()
	running := out[:0]
	for _, c := range out {
		if id, ok := q.rows.runningRowLocked(c.Key.Pool, c.LifecycleID, c.Key.Worker); ok {
			c.LifecycleID = id
			running = append(running, c)
		}
	}
	out = running
	q.rows.mu.RUnlock()
	// A worker whose token the queen lacks since it started (or since the
	// worker refused it) would refuse the relay (401): it is left out
	// while its hive is asked for it.
	q.tokens.mu.Lock()
	withToken := out[:0]
	var lacking []string
	for _, c := range out {
		if c.Token = q.tokens.byPool[c.Key.Pool][c.Key.Worker]; c.Token != "" || q.tokens.knownLocked(c.Key.Pool) {
			withToken = append(withToken, c)
		} else if !slices.Contains(lacking, c.Key.Pool) {
			lacking = append(lacking, c.Key.Pool)
		}
	}
	out = withToken
	q.tokens.mu.Unlock()
	for _, pool := range lacking {
		q.fetchTokens(pool)
	}
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
			return ok && (p.Status == registry.Healthy || p.Status == registry.Draining)
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
// request to a model served by a thousand pools reads no pool. The load
// each worker's hive reported (Candidate.Reported, the last of routing's
// tie-breaks) moves no generation, since a busy fleet's every heartbeat
// changes it: a list is made again at least every maxAge for it.
type candidateCache struct {
	mu     sync.RWMutex
	maxAge time.Duration            // guarded by mu
	lists  map[string]cachedList    // guarded by mu; by model
	counts map[countKey]cachedCount // guarded by mu
}

type cachedList struct {
	gen  candidateGen
	made time.Time
	list []routing.Candidate
}

type cachedCount struct {
	gen candidateGen
	n   routing.Count
}

// reportedMaxAge is how long a model's candidates are kept with the
// loads their hives reported: a heartbeat interval.
const reportedMaxAge = time.Second

func newCandidateCache() *candidateCache {
	return &candidateCache{maxAge: reportedMaxAge, lists: map[string]cachedList{}, counts: map[countKey]cachedCount{}}
}

// setMaxAge sets how long a list is kept (tests).
func (c *candidateCache) setMaxAge(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.maxAge = d
}

func (c *candidateCache) list(model string, gen candidateGen, now time.Time) ([]routing.Candidate, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	e, ok := c.lists[model]
	return e.list, ok && e.gen == gen && now.Sub(e.made) < c.maxAge
}

func (c *candidateCache) putList(model string, gen candidateGen, list []routing.Candidate, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.lists) >= maxCachedTargets {
		clear(c.lists)
	}
	c.lists[model] = cachedList{gen, now, list}
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
