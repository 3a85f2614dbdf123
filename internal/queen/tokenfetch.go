package queen

import (
	"context"
	"sync"
	"time"

	"github.com/apiary-llm/apiary/internal/registry"
)

// Worker tokens live in the queen's memory only (workerTokens). A queen
// that restarted knows its pools, rows and workers from the store but no
// token; its relays would be refused 401 until each hive's next
// heartbeat. So it asks each hive for its workers' tokens at once: at
// start for every pool with live workers, and whenever a worker that
// could serve has none (a hive that re-registered, a beat that was lost).
// A worker with no token is not routed to meanwhile.

// tokenFetchEvery bounds the fetches of one pool's tokens.
const tokenFetchEvery = time.Second

// maxTokenFetches bounds the pools whose last fetch is remembered.
const maxTokenFetches = 10000

// tokenFetches keeps one fetch per pool at a time, one a second at most.
type tokenFetches struct {
	mu      sync.Mutex
	last    map[string]time.Time // guarded by mu; when each pool's last fetch began
	running map[string]bool      // guarded by mu
}

// fetchTokens asks pool's hive for its workers' tokens in the background,
// unless a fetch of them runs or began within tokenFetchEvery.
func (q *Queen) fetchTokens(pool string) {
	src, ok := q.hives.(tokenSource)
	if !ok || pool == HandRunPool {
		return
	}
	f := &q.tokenFetch
	now := time.Now()
	f.mu.Lock()
	if f.running[pool] || now.Sub(f.last[pool]) < tokenFetchEvery {
		f.mu.Unlock()
		return
	}
	if f.last == nil {
		f.last, f.running = map[string]time.Time{}, map[string]bool{}
	}
	f.last[pool], f.running[pool] = now, true
	if len(f.last) > maxTokenFetches {
		for id, t := range f.last {
			if now.Sub(t) > time.Minute && !f.running[id] {
				delete(f.last, id)
			}
		}
	}
	f.mu.Unlock()
	go func() {
		defer func() {
			f.mu.Lock()
			delete(f.running, pool)
			f.mu.Unlock()
		}()
		q.fetchTokensNow(src, pool)
	}()
}

// fetchTokensNow asks pool's hive for its workers' tokens and keeps those
// of the workers the registry has for the pool that the queen lacks.
func (q *Queen) fetchTokensNow(src tokenSource, pool string) {
	p, ok := q.reg.Get(pool)
	if !ok || p.Status == registry.Offline || p.Endpoint == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), q.cfg.HiveTimeout)
	defer cancel()
	start := time.Now()
	answer, err := src.WorkerTokens(ctx, p.Endpoint)
	if err != nil {
		q.log.Warn("cannot ask a hive for its workers' tokens; waiting for its heartbeat", "pool_id", pool, "endpoint", p.Endpoint, "err", err)
		return
	}
	tokens := answer.WorkerTokens
	// A pool the queen restored at its start is unhealthy until its hive
	// is heard from: the holder answering is that (registry.Answered).
	if back, err := q.reg.Answered(ctx, pool, answer.Instance); err != nil {
		q.log.Warn("cannot record that a hive answered", "pool_id", pool, "err", err)
	} else if back {
		q.routing.Poke()
	}
	known := make(map[string]bool, len(p.Workers))
	for _, w := range p.Workers {
		known[w.WorkerID] = true
	}
	keep := make(map[string]string, len(tokens))
	for id, tok := range tokens {
		if known[id] && checkWorkerToken(tok) == nil {
			keep[id] = tok
		}
	}
	if n := q.tokens.fill(pool, keep); n > 0 {
		q.log.Info("worker tokens fetched from the hive", "pool_id", pool, "tokens", n, "duration_ms", time.Since(start).Milliseconds())
		q.routing.Poke()
	}
}

// fetchAllTokens asks every pool with live workers for its tokens: a
// queen that just loaded its store knows none. The hives of the other
// pools it restored are asked too: one that answers has its pool back
// before its next heartbeat.
func (q *Queen) fetchAllTokens() {
	for _, p := range q.reg.Query(registry.Filter{}) {
		if p.Status == registry.Offline {
			continue
		}
		if len(p.Workers) > 0 {
			q.tokens.unknownPool(p.ID)
		}
		q.fetchTokens(p.ID)
	}
}
