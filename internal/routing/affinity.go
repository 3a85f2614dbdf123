package routing

import (
	"context"
	"sync"
	"time"
)

// affinity pins sessions (X-Session-Id, per model) to the worker that
// served them, so that a conversation keeps its worker (and its KV cache)
// while the worker lives. A pin expires ttl after the session's last
// request; expired pins are swept in the background by run, and a pin to
// a worker that is gone is simply not honoured (the next request is a
// miss and pins anew).
type affinity struct {
	ttl   time.Duration
	limit int

	mu   sync.Mutex
	pins map[string]pin // guarded by mu; by sessionKey
}

type pin struct {
	worker  WorkerKey
	expires time.Time
}

func newAffinity(ttl time.Duration, limit int) *affinity {
	return &affinity{ttl: ttl, limit: limit, pins: map[string]pin{}}
}

// get returns the session's worker while its pin lives.
func (a *affinity) get(model, session string, now time.Time) (WorkerKey, bool) {
	k := sessionKey(model, session)
	a.mu.Lock()
	defer a.mu.Unlock()
	p, ok := a.pins[k]
	if !ok {
		return WorkerKey{}, false
	}
	if !now.Before(p.expires) {
		delete(a.pins, k)
		return WorkerKey{}, false
	}
	return p.worker, true
}

// set pins the session to w for ttl from now. New sessions beyond the
// limit are not pinned.
func (a *affinity) set(model, session string, w WorkerKey, now time.Time) {
	k := sessionKey(model, session)
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.pins[k]; !ok && len(a.pins) >= a.limit {
		return
	}
	a.pins[k] = pin{worker: w, expires: now.Add(a.ttl)}
}

// forget drops every pin to w.
func (a *affinity) forget(w WorkerKey) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for k, p := range a.pins {
		if p.worker == w {
			delete(a.pins, k)
		}
	}
}

// sweep drops the expired pins and returns how many are left.
func (a *affinity) sweep(now time.Time) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	for k, p := range a.pins {
		if !now.Before(p.expires) {
			delete(a.pins, k)
		}
	}
	return len(a.pins)
}

// size is the number of pins, expired or not.
func (a *affinity) size() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.pins)
}

// sweepEvery is how often run sweeps: a quarter of the TTL, within
// [10ms, 1m], so that no pin outlives its TTL by more than a quarter.
func (a *affinity) sweepEvery() time.Duration {
	return min(max(a.ttl/4, 10*time.Millisecond), time.Minute)
}

// run sweeps expired pins until ctx ends.
func (a *affinity) run(ctx context.Context) {
	t := time.NewTicker(a.sweepEvery())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			a.sweep(now)
		}
	}
}
