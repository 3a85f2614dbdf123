package routing

// Strikes: the relay's failures of a worker, counted. A worker that fails
// StrikeLimit requests in a row is degraded at the queen (no new
// requests), one that fails 3 × StrikeLimit is stopped; a request it
// answers to the end clears its count.

import (
	"context"
	"fmt"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/registry"
	"github.com/apiary-llm/apiary/internal/store"
)

// verdict is what one attempt says of its worker.
type verdict int

const (
	// verdictNone says nothing: the client left, the worker rightly
	// answered a client error (4xx) or that it cannot take the request
	// now (503: loading, draining, queue full), or a lease was handed
	// back unused.
	verdictNone verdict = iota
	// verdictServed: the worker's answer completed.
	verdictServed
	// verdictFailed: the worker failed the request (a 5xx other than
	// 503, an answer that is not one).
	verdictFailed
	// verdictBroken: the worker failed the connection (refused, reset, a
	// stream that broke); it also gets no requests for brokenFor.
	verdictBroken
)

// strikeEvent is what happened to a worker, as strikes count it.
type strikeEvent int

const (
	strikeFailed  strikeEvent = iota + 1 // a relay attempt failed because of the worker, or a degraded worker's health check failed
	strikeServed                         // an answer completed
	strikeHealthy                        // a degraded worker's health check answered ready
)

// strikeState is one worker's strikes.
type strikeState struct {
	Count    int  // failures in a row
	Degraded bool // kept out of routing until a health check or a success
}

// strikeStep is what a strike event made of a worker.
type strikeStep int

const (
	stepNone      strikeStep = iota
	stepDegrade              // it reached the limit: degraded, audited (worker.degraded)
	stepRedegrade            // a failure after a readmission: degraded again, not audited again
	stepReadmit              // a health check answered: back in routing, its count kept
	stepRecovered            // an answer completed after it was degraded: count cleared, audited (worker.recovered)
	stepCleared              // an answer completed: count cleared
	stepStop                 // 3 × limit failures in a row: the queen stops it
)

// decideStrike is the strike policy, pure: from a worker's strikes and
// an event, its new strikes and what to do.
//   - A failure counts. At limit failures in a row the worker is
//     degraded (once per streak: stepDegrade); a failure of a degraded
//     worker, or of one readmitted after a health check, keeps it
//     degraded; at 3 × limit it is stopped (every failure from there on
//     asks again, in case a stop did not take).
//   - A health check that answers readmits a degraded worker with its
//     count kept: the next failure degrades it again.
//   - An answer that completed clears the count.
func decideStrike(st strikeState, ev strikeEvent, limit int) (strikeState, strikeStep) {
	switch ev {
	case strikeServed:
		switch {
		case st.Count >= limit:
			return strikeState{}, stepRecovered
		case st.Count > 0:
			return strikeState{}, stepCleared
		}
		return strikeState{}, stepNone
	case strikeHealthy:
		if !st.Degraded {
			return st, stepNone
		}
		return strikeState{Count: st.Count}, stepReadmit
	case strikeFailed:
		n := st.Count + 1
		switch {
		case n >= 3*limit:
			return strikeState{Count: n, Degraded: true}, stepStop
		case n == limit && !st.Degraded:
			return strikeState{Count: n, Degraded: true}, stepDegrade
		case n > limit && !st.Degraded:
			return strikeState{Count: n, Degraded: true}, stepRedegrade
		}
		return strikeState{Count: n, Degraded: st.Degraded}, stepNone
	}
	return st, stepNone
}

// strikeRecheck is how long a degraded worker is out of routing before
// its health is checked.
const strikeRecheck = time.Second

// strikeSweepEvery is how often the workers with strikes are looked up:
// an entry goes once its row is no longer RUNNING.
const strikeSweepEvery = 10 * time.Second

// maxStrikeErrors bounds the failures a worker's entry keeps for its
// audit entry.
const maxStrikeErrors = 5

// striker is one worker's strikes in the router.
type striker struct {
	key      WorkerKey
	uri      string
	state    strikeState
	errs     []string  // the last failures, oldest first; at most maxStrikeErrors
	since    time.Time // when it was last degraded
	checking bool      // its health check is under way
	// Effects decided under the router's lock, for the strike watcher.
	auditDegraded  []string // the failures, when the degrade is to be audited
	auditRecovered bool
	stop           string // why, when the worker is to be stopped
}

// strikeLocked applies ev to the worker c and returns the step; cause is
// the failure (strikeFailed).
func (r *router) strikeLocked(c Candidate, ev strikeEvent, cause error, now time.Time) strikeStep {
	e := r.strikes[c.LifecycleID]
	if e == nil {
		if ev != strikeFailed {
			return stepNone // nothing to clear (the common case)
		}
		e = &striker{key: c.Key, uri: c.URI}
		r.strikes[c.LifecycleID] = e
	}
	next, step := decideStrike(e.state, ev, r.cfg.StrikeLimit)
	if ev == strikeFailed {
		r.m.strikes.WithLabelValues(c.LifecycleID).Inc()
		if len(e.errs) == maxStrikeErrors {
			e.errs = append(e.errs[:0], e.errs[1:]...)
		}
		e.errs = append(e.errs, api.Printable(cause.Error(), 300))
	}
	if next.Count == 0 {
		e.errs = nil
	}
	if next.Degraded != e.state.Degraded {
		if next.Degraded {
			r.degraded++
			e.since = now
		} else {
			r.degraded--
		}
		r.m.degraded.Set(float64(r.degraded))
	}
	e.state = next
	switch step {
	case stepDegrade:
		e.auditDegraded = append([]string(nil), e.errs...)
		r.aff.forget(c.Key)
	case stepRecovered:
		e.auditRecovered = true
	case stepStop:
		e.stop = fmt.Sprintf("stopped by the queen: %d failures in a row (3 × --strike-limit %d); last: %s",
			next.Count, r.cfg.StrikeLimit, e.errs[len(e.errs)-1])
	}
	return step
}

// removeStrikesLocked forgets the worker id's strikes (its row ended).
func (r *router) removeStrikesLocked(id string) {
	e, ok := r.strikes[id]
	if !ok {
		return
	}
	if e.state.Degraded {
		r.degraded--
		r.m.degraded.Set(float64(r.degraded))
	}
	delete(r.strikes, id)
	r.m.strikes.DeleteLabelValues(id)
}

// Strikes is how routing sees a worker: its relay failures in a row and
// whether the queen keeps it out of routing; ok is false when it has no
// failures.
func (s *Service) Strikes(lifecycleID string) (api.WorkerStrikes, bool) {
	r := s.router
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.strikes[lifecycleID]
	if !ok || e.state.Count == 0 {
		return api.WorkerStrikes{}, false
	}
	ws := api.WorkerStrikes{Failures: e.state.Count, Degraded: e.state.Degraded, Limit: r.cfg.StrikeLimit}
	if len(e.errs) > 0 {
		ws.LastError = e.errs[len(e.errs)-1]
	}
	return ws, true
}

// wakeStrikes tells the strike watcher that a worker's strikes changed;
// it never blocks.
func (s *Service) wakeStrikes() {
	select {
	case s.strikeWake <- struct{}{}:
	default:
	}
}

// strikeWork is what the strike watcher does in one round, taken from
// the router under its lock.
type strikeWork struct {
	id    string
	cand  Candidate
	state strikeState
	// effects
	auditDegraded  []string
	auditRecovered bool
	stop           string
	check          bool // health check due
}

// takeStrikeWork takes the pending effects and the health checks due;
// next is when the next check is due (0: none).
func (r *router) takeStrikeWork(now time.Time) (work []strikeWork, next time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for id, e := range r.strikes {
		w := strikeWork{id: id, cand: Candidate{Key: e.key, LifecycleID: id, URI: e.uri}, state: e.state,
			auditDegraded: e.auditDegraded, auditRecovered: e.auditRecovered, stop: e.stop}
		e.auditDegraded, e.auditRecovered, e.stop = nil, false, ""
		if e.state.Degraded && !e.checking {
			if due := e.since.Add(strikeRecheck); !now.Before(due) {
				w.check, e.checking = true, true
			} else if d := due.Sub(now); next == 0 || d < next {
				next = d
			}
		}
		work = append(work, w)
	}
	return work, next
}

// watchStrikes carries out what strikes decide, until ctx ends: the
// audit entries (worker.degraded, worker.recovered), the stops (through
// the control plane), the health checks of degraded workers (one that
// answers is readmitted, one that does not is a strike), and the sweep
// of workers whose rows are no longer RUNNING. It sleeps while no worker
// has strikes.
func (s *Service) watchStrikes(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.strikeWake:
		case <-timer.C:
		}
		if next := s.strikeRound(ctx); next > 0 {
			timer.Reset(next)
		}
	}
}

// strikeRound does one round of watchStrikes and returns when to look
// again (0: only when woken).
func (s *Service) strikeRound(ctx context.Context) time.Duration {
	r := s.router
	work, next := r.takeStrikeWork(time.Now())
	actx := context.WithoutCancel(ctx)
	kept := 0
	for _, w := range work {
		if ctx.Err() != nil {
			return 0
		}
		c := w.cand
		if len(w.auditDegraded) > 0 {
			reason := fmt.Sprintf("degraded by the queen: %d relay failures in a row (--strike-limit); no new requests until its health check answers or a request in flight succeeds",
				len(w.auditDegraded))
			s.cp.Audit(actx, store.AuditEntry{Actor: registry.ActorQueen, Action: "worker.degraded", Target: w.id, Reason: reason,
				Metadata: map[string]any{"pool_id": c.Key.Pool, "worker_id": c.Key.Worker, "strike_limit": s.cfg.StrikeLimit, "failures": w.auditDegraded}})
			s.log.Warn("worker degraded by the queen", "lifecycle_id", w.id, "pool_id", c.Key.Pool, "failures", s.cfg.StrikeLimit,
				"last_error", w.auditDegraded[len(w.auditDegraded)-1])
		}
		if w.auditRecovered {
			s.cp.Audit(actx, store.AuditEntry{Actor: registry.ActorQueen, Action: "worker.recovered", Target: w.id,
				Reason:   "recovered: a request succeeded after the worker was degraded; its strikes are cleared",
				Metadata: map[string]any{"pool_id": c.Key.Pool, "worker_id": c.Key.Worker}})
			s.log.Info("degraded worker recovered", "lifecycle_id", w.id, "pool_id", c.Key.Pool)
		}
		if w.stop != "" {
			s.m.strikeStops.Inc()
			s.log.Warn("stopping a worker that keeps failing", "lifecycle_id", w.id, "pool_id", c.Key.Pool, "reason", w.stop)
			sctx, cancel := context.WithTimeout(actx, s.cfg.HiveTimeout)
			err := s.cp.StopWorker(sctx, w.id, w.stop)
			cancel()
			if err != nil {
				// It stays degraded; its next failure asks again.
				s.log.Error("cannot stop a worker that keeps failing", "lifecycle_id", w.id, "err", err)
			}
		}
		if !s.cp.Running(c.Key.Pool, w.id, c.Key.Worker) {
			r.mu.Lock()
			r.removeStrikesLocked(w.id)
			r.mu.Unlock()
			s.log.Debug("strikes forgotten: the row is no longer RUNNING", "lifecycle_id", w.id)
			continue
		}
		kept++
		if w.check {
			s.checkDegraded(ctx, w)
		}
	}
	switch {
	case next > 0:
		return next
	case kept > 0:
		return strikeSweepEvery
	}
	return 0
}

// checkDegraded checks the health of a degraded worker: one that answers
// is readmitted (its count kept), one that does not is a strike. Its next
// check is strikeRecheck later.
func (s *Service) checkDegraded(ctx context.Context, w strikeWork) {
	r := s.router
	hctx, cancel := context.WithTimeout(ctx, time.Second)
	herr := probeHealth(hctx, s.up, w.cand.URI)
	cancel()
	if ctx.Err() != nil {
		return
	}
	ev, cause := strikeHealthy, error(nil)
	if herr != nil {
		ev, cause = strikeFailed, fmt.Errorf("worker %s: health check of a degraded worker: %w", w.id, herr)
	}
	now := time.Now()
	r.mu.Lock()
	step := r.strikeLocked(w.cand, ev, cause, now)
	if e := r.strikes[w.id]; e != nil {
		e.checking, e.since = false, now
	}
	r.mu.Unlock()
	if step == stepReadmit {
		s.log.Info("degraded worker readmitted: its health check answered", "lifecycle_id", w.id, "failures", w.state.Count)
		r.poke() // requests waiting may have it now
	}
	s.wakeStrikes() // the step's effects, and its next check
}
