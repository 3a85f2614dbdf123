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
	gen    atomic.Uint64                // counts the changes (each under mu), for candidateCache
}

func newWorkerTokens() *workerTokens {
	return &workerTokens{byPool: map[string]map[string]string{}}
}

// replace sets a pool's tokens from its heartbeat.
func (t *workerTokens) replace(pool string, tokens map[string]string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if maps.Equal(t.byPool[pool], tokens) {
		return // nearly every heartbeat
	}
	t.gen.Add(1)
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

// forget drops a pool's tokens (removed, offline).
func (t *workerTokens) forget(pool string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.gen.Add(1)
	delete(t.byPool, pool)
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
