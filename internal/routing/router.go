package routing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/apiary-llm/apiary/internal/openai"
)

// Routing errors, each with the OpenAI answer it gets (openai.Coded):
// the OpenAI endpoints answer what one errors.As finds, with the
// outermost error's message.
var (
	ErrModelNotFound = &codedError{openai.CodedError{Status: http.StatusNotFound, Code: openai.CodeModelNotFound, Message: "no pool has the model"}, "model"}
	ErrQueueFull     = &openai.CodedError{Status: http.StatusTooManyRequests, Code: "queue_full", Message: "queue full", Retry: time.Second}
	ErrQueueTimeout  = &openai.CodedError{Status: http.StatusGatewayTimeout, Code: "queue_timeout", Type: openai.TypeServer, Message: "no worker within the queue timeout"}
	ErrNoCapacity    = &openai.CodedError{Status: http.StatusServiceUnavailable, Code: "no_capacity", Message: "no worker can be placed", Retry: 5 * time.Second}
	ErrUpstream      = &openai.CodedError{Status: http.StatusBadGateway, Code: "worker_failed", Type: openai.TypeServer, Message: "worker failed"}
	ErrShuttingDown  = openai.Sentinel(http.StatusServiceUnavailable, "shutting_down", "shutting down")
	ErrNoPool        = openai.Sentinel(http.StatusServiceUnavailable, "no_pool_available", "no healthy pool")
	// ErrPreempted ends a batch request whose slot an interactive request
	// took: it was cancelled, through no fault of its worker.
	ErrPreempted = errors.New("preempted by an interactive request")
	// ErrWithdrawn ends a batch request taken out of its queue before it
	// got a slot (its batch was cancelled or expired).
	ErrWithdrawn = errors.New("withdrawn before it got a slot")
)

// codedError is a sentinel that names the request field at fault.
type codedError struct {
	openai.CodedError
	param string
}

func (e *codedError) ErrorParam() string { return e.param }

// capacityError refuses a request for want of capacity (ErrNoCapacity):
// nothing serves or starts for it and nothing can be placed, with why.
type capacityError struct {
	why        string
	retryAfter time.Duration // when a placement may be tried again; 0: unknown
}

func (e *capacityError) Error() string { return ErrNoCapacity.Error() + ": " + e.why }
func (e *capacityError) Unwrap() error { return ErrNoCapacity }

// RetryAfter is when a placement may be tried again, else ErrNoCapacity's.
func (e *capacityError) RetryAfter() time.Duration {
	if e.retryAfter > 0 {
		return e.retryAfter
	}
	return ErrNoCapacity.Retry
}

// Candidate is a worker that may take a request of its model: serving
// (ready or busy), in a healthy pool, with a RUNNING lifecycle row.
type Candidate struct {
	Key         WorkerKey
	LifecycleID string
	URI         string
	Token       string // the worker's own bearer token
	Reported    int    // in_flight as the hive last reported it
}

// WorkerKey names a worker as its hive does: its pool and the hive's id
// of it.
type WorkerKey struct{ Pool, Worker string }

// pickResult is a routing decision.
type pickResult struct {
	index int // the candidate chosen; -1: none has a free slot
	// pinned: the session's pin names a live worker. With index -1 the
	// request waits for that worker, not for any.
	pinned bool
}

// pick is the routing policy, pure: the session's pinned worker when it
// is among the candidates (waiting for it when it is full), otherwise the
// candidate with the fewest requests in flight from the queen (then the
// fewest the hive reported, then the first: ControlPlane.Candidates lists
// them by key) that has a free slot. inflight[i] counts cands[i]'s
// requests. Excluded candidates (tried already by this request) are
// skipped.
func pick(cands []Candidate, inflight []*int, slots int, pin *WorkerKey, exclude map[WorkerKey]bool) pickResult {
	if pin != nil && !exclude[*pin] {
		for i, c := range cands {
			if c.Key == *pin {
				if *inflight[i] < slots {
					return pickResult{index: i, pinned: true}
				}
				return pickResult{index: -1, pinned: true}
			}
		}
	}
	// Every request scans every candidate (a thousand, with as many pools
	// serving the model): no map is read per candidate unless this
	// request excluded some.
	best, bestN := -1, 0
	for i := range cands {
		n := *inflight[i]
		if n >= slots || len(exclude) > 0 && exclude[cands[i].Key] {
			continue
		}
		if best < 0 || n < bestN || n == bestN && cands[i].Reported < cands[best].Reported {
			best, bestN = i, n
		}
	}
	return pickResult{index: best}
}

// target is what a request asks for: a worker of model, on pool when it
// is pinned to one (X-Apiary-Pool). The router queues requests, and the
// controller counts demand, by target.
type target struct {
	model string
	pool  string // "": any pool
}

func (t target) String() string {
	if t.pool == "" {
		return t.model
	}
	return t.model + " on pool " + t.pool
}

// lease is a slot on a worker held by one request until release.
type lease struct {
	model  string
	cand   Candidate
	pinned bool          // served by the session's pinned worker
	waited time.Duration // in the queue
	hold   *batchHold    // a batch request's lease; nil for an interactive one
	route  *prefixRoute  // how the prefix policy chose; nil when it did not
}

// batchHold is a slot a batch request holds, which an interactive request
// may take (preemptLocked).
type batchHold struct {
	key    WorkerKey
	since  time.Time               // granted; the youngest has generated least
	cancel context.CancelCauseFunc // ends the batch request's upstream request
	// preempted: its slot went to an interactive request; settle does
	// not hand it back again. Guarded by router.mu.
	preempted bool
}

// routeReq is what acquire needs of a request.
type routeReq struct {
	model   string
	pool    string // "": any pool
	session string
	exclude map[WorkerKey]bool // workers this request already failed on
	retry   bool               // a retry goes to the front of the queue
	// batch: a request of a batch job. It takes only a slot no
	// interactive request waits for (its queue is served after theirs),
	// does not count against QueueSize and has no queue timeout: its
	// context bounds the wait.
	batch bool
	// preempt cancels a batch request's context: an interactive request
	// that finds every slot taken may take the slot of the youngest batch
	// request (nil: never preempted).
	preempt context.CancelCauseFunc
	// prefix is the request's text in hashed blocks, for RoutePrefix
	// (nil: routed by load).
	prefix *prefixKey
}

func (r routeReq) target() target { return target{r.model, r.pool} }

// waiter is a request in a target's queue.
type waiter struct {
	req   routeReq
	since time.Time
	ch    chan grant // buffered 1; sent to once, under router.mu
}

type grant struct {
	l   lease
	err error
}

// brokenFor is how long a worker that broke a connection gets no requests
// (its hive's event or the suspect check ends its row well before).
const brokenFor = time.Minute

// router owns the queen's side of request routing: how many requests each
// worker has from the queen, the per-model queues of requests waiting for
// a worker, the workers that broke a connection, and each worker's
// strikes (strikes.go). One mutex guards it;
// every decision is pick's. It never starts workers: a waiting request
// only signals demand, and the controller decides.
type router struct {
	cfg    Config
	log    *slog.Logger
	source func(target) []Candidate // serving workers of a target, now
	aff    *affinity
	m      *routeMetrics
	demand func() // wakes the controller
	// slots is how many requests one worker of a model takes at once
	// (nil: cfg.WorkerSlots).
	slots func(model string) int

	mu sync.Mutex
	// inflight counts the requests the queen has on each worker. A
	// counter stays while the worker is a candidate (it may be 0): views
	// hold them (see countersLocked); prune drops the idle ones.
	inflight map[WorkerKey]*int       // guarded by mu
	views    map[target]candidateView // guarded by mu
	broken   map[WorkerKey]time.Time  // guarded by mu; until when
	// strikes holds the workers that failed a request, by lifecycle id;
	// bounded by the RUNNING rows: the strike watcher removes an entry
	// once its row is not RUNNING.
	strikes  map[string]*striker  // guarded by mu
	degraded int                  // guarded by mu; entries of strikes that are degraded
	queues   map[target][]*waiter // guarded by mu; FIFO by target
	// batches holds the waiting requests of batch jobs, FIFO by target,
	// served only when the target's queue (interactive) is empty; bounded
	// by the batch dispatcher's concurrency.
	batches map[target][]*waiter // guarded by mu
	// holds are the slots batch requests hold, by worker, oldest first;
	// bounded by the batch dispatcher's concurrency.
	holds map[WorkerKey][]*batchHold // guarded by mu
	// lastUsed is when each worker last finished a request of this
	// queen's, for eviction (least recently used first).
	lastUsed map[WorkerKey]time.Time // guarded by mu
	// evicting holds the workers an eviction is stopping, from its plan
	// until the stop is written (claimIdle): no request goes to them.
	evicting map[WorkerKey]bool // guarded by mu
	closed   bool               // guarded by mu
	prefix   *prefixIndex       // its own mutex, taken inside mu
}

func newRouter(cfg Config, log *slog.Logger, source func(target) []Candidate, aff *affinity, m *routeMetrics, demand func()) *router {
	return &router{cfg: cfg, log: log, source: source, aff: aff, m: m, demand: demand,
		inflight: map[WorkerKey]*int{}, views: map[target]candidateView{}, broken: map[WorkerKey]time.Time{}, strikes: map[string]*striker{}, queues: map[target][]*waiter{}, batches: map[target][]*waiter{},
		holds: map[WorkerKey][]*batchHold{}, lastUsed: map[WorkerKey]time.Time{}, evicting: map[WorkerKey]bool{}, prefix: newPrefixIndex()}
}

// acquire returns a lease on a worker of req.model: at once when one has a
// free slot and no request of the model waits, else after waiting in the
// model's queue. It fails with ErrQueueFull, ErrQueueTimeout, the
// controller's ErrNoCapacity, ErrShuttingDown, or ctx's error.
func (r *router) acquire(ctx context.Context, req routeReq) (lease, error) {
	t := req.target()
	cands := r.source(t)
	now := time.Now()
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return lease{}, fmt.Errorf("%w: the queen is stopping", ErrShuttingDown)
	}
	cands = r.usableLocked(cands, now)
	if len(r.queues[t]) == 0 && (!req.batch || len(r.batches[t]) == 0) {
		if l, ok := r.tryLocked(req, cands, now, now); ok {
			r.mu.Unlock()
			return l, nil
		}
	}
	w := &waiter{req: req, since: now, ch: make(chan grant, 1)}
	queues := r.queuesOf(req.batch)
	if q := queues[t]; req.retry {
		queues[t] = append([]*waiter{w}, q...)
	} else {
		queues[t] = append(q, w)
	}
	// Waiters ahead may be pinned to a full worker, or the workers may
	// have changed since they were last looked at: dispatch the queue,
	// this request included.
	r.dispatchLocked(t, cands, now)
	if !req.batch {
		r.preemptLocked(t, cands, now)
	}
	select {
	case g := <-w.ch:
		r.mu.Unlock()
		return g.l, g.err
	default:
	}
	queued := len(queues[t])
	if !req.batch && queued > r.cfg.QueueSize {
		r.removeLocked(w)
		r.mu.Unlock()
		r.m.rejected.WithLabelValues(req.model, "queue_full").Inc()
		return lease{}, fmt.Errorf("%w: %d requests for %s are waiting for a worker; retry later", ErrQueueFull, queued-1, t)
	}
	r.mu.Unlock()
	r.log.Debug("request queued", "model_ref", req.model, "pool_id", req.pool, "queued", queued)
	r.demand()

	var expired <-chan time.Time
	if !req.batch {
		timer := time.NewTimer(r.cfg.QueueTimeout)
		defer timer.Stop()
		expired = timer.C
	}
	var cause error
	select {
	case g := <-w.ch:
		return g.l, g.err
	case <-expired:
		cause = fmt.Errorf("%w: waited %s for a worker of %s", ErrQueueTimeout, r.cfg.QueueTimeout, t)
	case <-ctx.Done():
		cause = context.Cause(ctx)
	}
	r.mu.Lock()
	removed := r.removeLocked(w)
	r.mu.Unlock()
	if !removed {
		// Answered while the wait ended: a timeout takes the answer, a
		// client that left hands the slot back.
		g := <-w.ch
		if ctx.Err() == nil {
			return g.l, g.err
		}
		if g.err == nil {
			r.release(g.l, false)
		}
		return lease{}, cause
	}
	if errors.Is(cause, ErrQueueTimeout) {
		r.m.rejected.WithLabelValues(req.model, "timeout").Inc()
	}
	r.m.queueWait.WithLabelValues(req.model).Observe(time.Since(now).Seconds())
	return lease{}, cause
}

// tryLocked gives req a free slot now if pick finds one.
func (r *router) tryLocked(req routeReq, cands []Candidate, since, now time.Time) (lease, bool) {
	var pin *WorkerKey
	if req.session != "" {
		if k, ok := r.aff.get(req.model, req.session, now); ok {
			pin = &k
		}
	}
	slots := r.cfg.WorkerSlots
	if r.slots != nil {
		slots = r.slots(req.model)
	}
	counts := r.countersLocked(req.target(), cands)
	res, route := r.pickLocked(req, cands, counts, slots, pin)
	if res.index < 0 {
		return lease{}, false
	}
	c := cands[res.index]
	if route != nil {
		route.inflight = *counts[res.index]
	}
	*counts[res.index]++
	if req.session != "" {
		r.aff.set(req.model, req.session, c.Key, now)
	}
	l := lease{model: req.model, cand: c, pinned: res.pinned, waited: now.Sub(since), route: route}
	if req.batch && req.preempt != nil {
		l.hold = &batchHold{key: c.Key, since: now, cancel: req.preempt}
		r.holds[c.Key] = append(r.holds[c.Key], l.hold)
	}
	return l, true
}

// preemptLocked gives slots held by batch requests to the interactive
// requests waiting for t that no free slot served: for each, in queue
// order, the youngest batch request on a worker it may use (one it has
// not failed on; its session's worker when it is pinned to a live one)
// is cancelled (ErrPreempted) and its slot handed to the queue at once.
// The worker hands the slot on as soon as it sees the request go, and
// its engine drops the cancelled sequence before it takes the
// interactive one, within a step.
// Only batch requests are preempted.
func (r *router) preemptLocked(t target, cands []Candidate, now time.Time) {
	if len(r.holds) == 0 {
		return
	}
	for _, w := range slices.Clone(r.queues[t]) {
		if !slices.Contains(r.queues[t], w) {
			continue // served meanwhile
		}
		h := r.youngestHoldLocked(w.req, cands, now)
		if h == nil {
			continue
		}
		h.preempted = true
		h.cancel(ErrPreempted)
		r.dropHoldLocked(h)
		r.freeLocked(h.key)
		r.m.preempted.WithLabelValues(t.model).Inc()
		r.log.Debug("batch request preempted", "model_ref", t.model, "pool_id", h.key.Pool, "worker_id", h.key.Worker)
		r.dispatchQueueLocked(t, false, cands, now)
	}
}

// youngestHoldLocked is the batch request granted last on a worker of
// cands that req may use, or nil.
func (r *router) youngestHoldLocked(req routeReq, cands []Candidate, now time.Time) *batchHold {
	var pin *WorkerKey
	if req.session != "" {
		if k, ok := r.aff.get(req.model, req.session, now); ok && !req.exclude[k] && slices.ContainsFunc(cands, func(c Candidate) bool { return c.Key == k }) {
			pin = &k
		}
	}
	var best *batchHold
	for _, c := range cands {
		if req.exclude[c.Key] || (pin != nil && c.Key != *pin) {
			continue
		}
		if hs := r.holds[c.Key]; len(hs) > 0 {
			if h := hs[len(hs)-1]; best == nil || h.since.After(best.since) {
				best = h
			}
		}
	}
	return best
}

// dropHoldLocked takes h out of its worker's holds.
func (r *router) dropHoldLocked(h *batchHold) {
	hs := r.holds[h.key]
	if i := slices.Index(hs, h); i >= 0 {
		hs = slices.Delete(hs, i, i+1)
	}
	if len(hs) == 0 {
		delete(r.holds, h.key)
	} else {
		r.holds[h.key] = hs
	}
}

// freeLocked hands one of k's slots back.
func (r *router) freeLocked(k WorkerKey) {
	if n := r.inflight[k]; n != nil && *n > 0 {
		*n--
	}
}

// candidateView is a candidate list as the control plane handed it out (its
// first element and length name it: the control plane hands out one
// slice until its workers change) and its workers' counters.
type candidateView struct {
	first    *Candidate
	n        int
	counters []*int
}

// maxViews bounds the candidate lists whose counters the router keeps.
const maxViews = 1024

// countersLocked returns the in-flight counters of cands' workers, one
// per candidate: those found for the same list before, or looked up (and
// made) now.
func (r *router) countersLocked(t target, cands []Candidate) []*int {
	if len(cands) == 0 {
		return nil
	}
	if v, ok := r.views[t]; ok && v.first == &cands[0] && v.n == len(cands) {
		return v.counters
	}
	r.pruneLocked()
	counters := make([]*int, len(cands))
	for i := range cands {
		n := r.inflight[cands[i].Key]
		if n == nil {
			n = new(int)
			r.inflight[cands[i].Key] = n
		}
		counters[i] = n
	}
	if len(r.views) >= maxViews {
		clear(r.views)
	}
	r.views[t] = candidateView{&cands[0], len(cands), counters}
	return counters
}

// pruneLocked drops the idle counters once they outnumber the viewed
// candidates by far (workers come and go; their counters must not stay),
// and with them the views, which are made again at their next request.
func (r *router) pruneLocked() {
	viewed := 0
	for _, v := range r.views {
		viewed += v.n
	}
	if len(r.inflight) <= 2*viewed+1024 {
		return
	}
	clear(r.views)
	for k, n := range r.inflight {
		if *n == 0 {
			delete(r.inflight, k)
			r.prefix.forget(k)
		}
	}
}

// queuesOf is the queues of batch requests, or of interactive ones.
func (r *router) queuesOf(batch bool) map[target][]*waiter {
	if batch {
		return r.batches
	}
	return r.queues
}

// dispatchLocked gives free slots to the target's waiters, oldest first
// (a waiter pinned to a full worker lets the ones behind it pass); the
// batch requests get a slot only when no interactive request is left
// waiting for the target.
func (r *router) dispatchLocked(t target, cands []Candidate, now time.Time) {
	r.dispatchQueueLocked(t, false, cands, now)
	if len(r.queues[t]) == 0 {
		r.dispatchQueueLocked(t, true, cands, now)
	}
}

func (r *router) dispatchQueueLocked(t target, batch bool, cands []Candidate, now time.Time) {
	q := r.queuesOf(batch)[t]
	if len(q) == 0 {
		return
	}
	kept := q[:0]
	for _, w := range q {
		if l, ok := r.tryLocked(w.req, cands, w.since, now); ok {
			w.ch <- grant{l: l}
			if l.waited > 0 {
				r.m.queueWait.WithLabelValues(t.model).Observe(l.waited.Seconds())
			}
			continue
		}
		kept = append(kept, w)
	}
	clear(q[len(kept):])
	r.setQueueLocked(t, batch, kept)
}

// setQueueLocked sets t's queue (of batch requests, or interactive); the
// depth metric is per model, all its targets and both kinds together.
func (r *router) setQueueLocked(t target, batch bool, q []*waiter) {
	queues := r.queuesOf(batch)
	if len(q) == 0 {
		delete(queues, t)
	} else {
		queues[t] = q
	}
	depth := 0
	for _, queues := range [2]map[target][]*waiter{r.queues, r.batches} {
		for o, q := range queues {
			if o.model == t.model {
				depth += len(q)
			}
		}
	}
	r.m.queueDepth.WithLabelValues(t.model).Set(float64(depth))
}

// removeLocked takes w out of its queue; false when it was granted.
func (r *router) removeLocked(w *waiter) bool {
	t := w.req.target()
	q := r.queuesOf(w.req.batch)[t]
	for i, x := range q {
		if x == w {
			r.setQueueLocked(t, w.req.batch, append(q[:i:i], q[i+1:]...))
			return true
		}
	}
	return false
}

// waitingLocked reports whether a request (of either kind) waits for t.
func (r *router) waitingLocked(t target) bool {
	return len(r.queues[t]) > 0 || len(r.batches[t]) > 0
}

// usableLocked drops the workers that broke a connection lately and the
// degraded ones.
func (r *router) usableLocked(cands []Candidate, now time.Time) []Candidate {
	if len(r.broken) == 0 && r.degraded == 0 && len(r.evicting) == 0 {
		return cands
	}
	out := cands[:0:0]
	for _, c := range cands {
		if until, ok := r.broken[c.Key]; (ok && now.Before(until)) || r.evicting[c.Key] {
			continue
		}
		if e := r.strikes[c.LifecycleID]; e != nil && e.state.Degraded {
			continue
		}
		out = append(out, c)
	}
	return out
}

// release hands a lease's slot back and gives it to a waiter; broken
// marks the worker as one that failed the request's connection.
func (r *router) release(l lease, broken bool) {
	v := verdictNone
	if broken {
		v = verdictBroken
	}
	r.settle(l, v, nil)
}

// settle hands a lease's slot back with what the attempt said of its
// worker (v; cause for a failure), counts it in the worker's strikes and
// returns the strike step. A worker that broke the connection gets no
// requests for brokenFor. The slot may go to a request for the model on
// any pool, or to one pinned to the worker's pool; the workers are looked
// up only when one waits (the slot is freed and the queues read in one
// critical section, so a request that queues meanwhile dispatches
// itself).
func (r *router) settle(l lease, v verdict, cause error) strikeStep {
	targets := [2]target{{l.model, ""}, {l.model, l.cand.Key.Pool}}
	now := time.Now()
	r.mu.Lock()
	switch h := l.hold; {
	case h == nil:
		r.freeLocked(l.cand.Key)
	case !h.preempted: // a preempted one's slot was handed on already
		r.dropHoldLocked(h)
		r.freeLocked(l.cand.Key)
	}
	if len(r.lastUsed) > maxLastUsed {
		for k, t := range r.lastUsed {
			if now.Sub(t) > time.Hour {
				delete(r.lastUsed, k)
			}
		}
	}
	r.lastUsed[l.cand.Key] = now
	step := stepNone
	switch v {
	case verdictServed:
		if len(r.strikes) > 0 {
			step = r.strikeLocked(l.cand, strikeServed, nil, now)
		}
	case verdictFailed, verdictBroken:
		if cause == nil {
			cause = errors.New("the connection broke")
		}
		step = r.strikeLocked(l.cand, strikeFailed, cause, now)
	}
	if v == verdictBroken {
		for k, until := range r.broken {
			if !now.Before(until) {
				delete(r.broken, k)
			}
		}
		r.broken[l.cand.Key] = now.Add(brokenFor)
		r.aff.forget(l.cand.Key)
	}
	waiting := [2]bool{r.waitingLocked(targets[0]), r.waitingLocked(targets[1])}
	// A worker that went idle while requests wait for other models may be
	// evicted for them now: the controller looks at once.
	swap := r.swapWaitsLocked(l.cand.Key, l.model)
	r.mu.Unlock()
	if swap {
		r.demand()
	}
	for i, t := range targets {
		if !waiting[i] {
			continue
		}
		cands := r.source(t)
		now := time.Now()
		r.mu.Lock()
		r.dispatchLocked(t, r.usableLocked(cands, now), now)
		r.mu.Unlock()
	}
	return step
}

// poke tells the router that workers changed (a hive event or heartbeat):
// waiting requests may now have a worker.
func (r *router) poke() {
	r.mu.Lock()
	targets := make([]target, 0, len(r.queues)+len(r.batches))
	for t := range r.queues {
		targets = append(targets, t)
	}
	for t := range r.batches {
		if len(r.queues[t]) == 0 {
			targets = append(targets, t)
		}
	}
	r.mu.Unlock()
	for _, t := range targets {
		cands := r.source(t)
		now := time.Now()
		r.mu.Lock()
		r.dispatchLocked(t, r.usableLocked(cands, now), now)
		r.mu.Unlock()
	}
}

// queueStat is one target's queue, for the controller: its interactive
// and batch requests together (both are demand).
type queueStat struct {
	target target
	queued int
	oldest time.Time
}

func (r *router) queueStats() []queueStat {
	r.mu.Lock()
	defer r.mu.Unlock()
	stats := make(map[target]queueStat, len(r.queues)+len(r.batches))
	for _, queues := range [2]map[target][]*waiter{r.queues, r.batches} {
		for t, q := range queues {
			st, ok := stats[t]
			if !ok || q[0].since.Before(st.oldest) {
				st.oldest = q[0].since
			}
			st.target, st.queued = t, st.queued+len(q)
			stats[t] = st
		}
	}
	out := make([]queueStat, 0, len(stats))
	for _, st := range stats {
		out = append(out, st)
	}
	return out
}

// fail answers every waiter of t with err (nothing serves or starts for
// the target, and the controller cannot place a worker).
func (r *router) fail(t target, err error) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	// Counted before any waiter is answered: a waiter returns as soon as
	// its answer is in its channel, and its client may read the metric.
	n := len(r.queues[t]) + len(r.batches[t])
	if n > 0 {
		r.m.rejected.WithLabelValues(t.model, "no_capacity").Add(float64(n))
	}
	for _, batch := range [2]bool{false, true} {
		for _, w := range r.queuesOf(batch)[t] {
			w.ch <- grant{err: err}
		}
		r.setQueueLocked(t, batch, nil)
	}
	return n
}

// close refuses new requests and answers every waiter ErrShuttingDown.
func (r *router) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	for _, batch := range [2]bool{false, true} {
		for t, q := range r.queuesOf(batch) {
			for _, w := range q {
				w.ch <- grant{err: fmt.Errorf("%w: the queen is stopping", ErrShuttingDown)}
			}
			r.setQueueLocked(t, batch, nil)
		}
	}
}

// inFlight is the number of requests the queen has on each worker.
func (r *router) inFlight() map[WorkerKey]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[WorkerKey]int, len(r.inflight))
	for k, n := range r.inflight {
		if *n > 0 {
			out[k] = *n
		}
	}
	return out
}

func (k WorkerKey) String() string { return k.Pool + "/" + k.Worker }

// sessionKey joins a model and a session id for the affinity table: a
// worker serves one model, so a session is pinned per model.
func sessionKey(model, session string) string {
	var b strings.Builder
	b.Grow(len(model) + 1 + len(session))
	b.WriteString(model)
	b.WriteByte(0)
	b.WriteString(session)
	return b.String()
}

// maxLastUsed is how many workers' last use the router keeps before it
// forgets those unused for an hour (they are evicted first either way).
const maxLastUsed = 4096

// usage is a worker's requests in flight through this queen and when it
// last finished one (zero: never).
func (r *router) usage(k WorkerKey) (inflight int, last time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if n := r.inflight[k]; n != nil {
		inflight = *n
	}
	return inflight, r.lastUsed[k]
}

// waiting reports whether requests (interactive or batch) wait for model
// on any pool, or pinned to pool.
func (r *router) waiting(model, pool string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.waitingLocked(target{model, ""}) || r.waitingLocked(target{model, pool})
}
