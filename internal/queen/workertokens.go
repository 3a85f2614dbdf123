package queen

import (
	"maps"
	"sync"
	"sync/atomic"

	"github.com/apiary-llm/apiary/internal/api"
)

// workerTokens keeps the bearer token of every live worker that its hive
// reported, for the requests the queen relays to it. They live in memory
// only: never stored, listed or logged; a restarted queen learns them
// again from the next heartbeat. Bounded by the pools' reports: a
// heartbeat replaces its pool's set (at most maxWorkers), an event that
// ends a worker removes its token.
type workerTokens struct {
	mu     sync.Mutex
	byPool map[string]map[string]string // guarded by mu
	// unknown holds the pools whose tokens the queen does not hold yet:
	// loaded from the store at start, or one of whose workers refused its
	// token. Their workers without a token are not routed to until the
	// hive's list (fill) or a full heartbeat (replace) comes.
	unknown map[string]bool // guarded by mu
	gen     atomic.Uint64   // counts the changes (each under mu), for candidateCache
}

func newWorkerTokens() *workerTokens {
	return &workerTokens{byPool: map[string]map[string]string{}, unknown: map[string]bool{}}
}

// unknownPool marks pool's tokens as not held (see workerTokens.unknown).
func (t *workerTokens) unknownPool(pool string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.unknown[pool] && len(t.unknown) < maxTokenFetches {
		t.unknown[pool] = true
		t.gen.Add(1)
	}
}

// knownLocked says whether a worker of pool without a token may be routed
// to (its hive sent its tokens since the queen started; it gave none).
func (t *workerTokens) knownLocked(pool string) bool { return !t.unknown[pool] }

// replace sets a pool's tokens from its heartbeat.
func (t *workerTokens) replace(pool string, tokens map[string]string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if maps.Equal(t.byPool[pool], tokens) && !t.unknown[pool] {
		return // nearly every heartbeat
	}
	t.gen.Add(1)
	delete(t.unknown, pool)
	if len(tokens) == 0 {
		delete(t.byPool, pool)
		return
	}
	t.byPool[pool] = maps.Clone(tokens)
}

// event applies one worker's event: its token while it lives, none after.
func (t *workerTokens) event(ev api.WorkerEvent, ended bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.gen.Add(1)
	m := t.byPool[ev.PoolID]
	switch {
	case ended || ev.WorkerToken == "":
		delete(m, ev.WorkerID)
	case m == nil:
		t.byPool[ev.PoolID] = map[string]string{ev.WorkerID: ev.WorkerToken}
	case len(m) < maxWorkers:
		m[ev.WorkerID] = ev.WorkerToken
	}
}

// fill adds the tokens of a pool's workers that it lacks (from the hive's
// own list, asked for at once); it reports how many it added.
func (t *workerTokens) fill(pool string, tokens map[string]string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	m := t.byPool[pool]
	n := 0
	if t.unknown[pool] {
		delete(t.unknown, pool)
		t.gen.Add(1)
	}
	for id, tok := range tokens {
		if _, ok := m[id]; ok || len(m) >= maxWorkers {
			continue
		}
		if m == nil {
			m = map[string]string{}
			t.byPool[pool] = m
		}
		m[id] = tok
		n++
	}
	if n > 0 {
		t.gen.Add(1)
	}
	return n
}

// drop forgets one worker's token (the worker refused it).
func (t *workerTokens) drop(pool, workerID string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.byPool[pool][workerID]; ok {
		delete(t.byPool[pool], workerID)
		t.gen.Add(1)
	}
}

// forget drops a pool's tokens (removed, offline).
func (t *workerTokens) forget(pool string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.gen.Add(1)
	delete(t.byPool, pool)
	delete(t.unknown, pool)
}

func checkWorkerToken(tok string) error {
	if len(tok) == 0 || len(tok) > 256 {
		return api.BadRequest("a worker token must be 1-256 bytes")
	}
	for i := 0; i < len(tok); i++ {
		if tok[i] <= ' ' || tok[i] > '~' {
			return api.BadRequest("a worker token must be printable ASCII without spaces")
		}
	}
	return nil
}
