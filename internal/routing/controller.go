package routing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/lifecycle"
	"github.com/apiary-llm/apiary/internal/openai"
	"github.com/apiary-llm/apiary/internal/registry"
	"github.com/apiary-llm/apiary/internal/store"
)

// modelDemand is what the scale policy sees of one target (a model, or a
// model on one pool for requests pinned to it) with requests waiting.
type modelDemand struct {
	Model      string
	Pool       string // "": any pool
	Queued     int
	OldestWait time.Duration
	Live       int // the target's live rows (STARTING, RUNNING) on healthy pools, plus placements under way
	Starting   int // the target's STARTING rows plus placements under way
	Routable   int // the target's workers taking requests now
	// ModelLive is Live for the model on every healthy pool: what counts
	// against MaxWorkers. It equals Live when Pool is "".
	ModelLive  int
	MaxWorkers int
	RetryAt    time.Time // no placement before this (after failures)
	// NoPlace is why no pool can take a new worker of the target now (the
	// placement's reasons, from the pools and model lists as known); ""
	// when one can or may. Like LastFailure it is in the words an API
	// client reads (openai.PublicText): no file path, address or
	// lifecycle id; the details went to the log and the audit where the
	// failure was seen.
	NoPlace string
	// LastFailure is why the target's last placement gave no worker (no
	// pool, every hive refused, or the placed worker failed to start), or
	// why the pull of its model failed, in public words.
	LastFailure string
	// Pulling: no pool has the model's file, and a pull of it runs on a
	// pool the target may use; its requests wait for it.
	Pulling bool
}

// placeOrder asks for one more worker of Model (on Pool, when it names
// one).
type placeOrder struct {
	Model  string
	Pool   string
	Kind   string // cold_start or scale_up
	Reason string // for the audit entry of the start
}

func (o placeOrder) target() target { return target{o.Model, o.Pool} }

// refusal is a target whose waiting requests no worker will serve: none
// serves or starts, and none can be placed now.
type refusal struct {
	Model, Pool string
	Why         string        // in public words (see modelDemand.NoPlace)
	RetryAfter  time.Duration // when a new placement may be tried; 0: unknown
}

// scaleDecision is what decideScale decided.
type scaleDecision struct {
	Place []placeOrder
	// Refuse holds the targets whose waiting requests no worker will
	// serve (none serves or starts, and none can be placed now), with why.
	Refuse []refusal
	// Recheck is when to decide again if nothing else happens first; 0:
	// no need.
	Recheck time.Duration
}

// demandResync is how often the controller looks again at targets with
// requests waiting even when nothing wakes it: a pool that is drained or
// goes silent (its lease ends) sends no event, and its waiting requests
// must learn that what they waited for is not coming.
const demandResync = time.Second

// swapRecheck is how often the controller looks again at requests that
// wait for busy workers of other models to make room.
const swapRecheck = 200 * time.Millisecond

// noPlaceAuditEvery is how often a target that no pool can take is
// audited again (worker.place_failed) while its reason stays the same.
const noPlaceAuditEvery = time.Minute

// decideScale is the scale policy, pure. For each target with requests
// waiting:
//   - requests wait only for capacity that is coming: a worker that
//     serves (a slot frees), one starting or being placed, or one the
//     policy places now. When none serves or starts and none can be placed
//     (NoPlace: every pool's reason), or the last placement failed and the
//     next may not be tried yet (LastFailure), the requests are refused at
//     once with why;
//   - at most one placement is under way at a time (a starting worker
//     will take the queue);
//   - no worker at all: place one now (cold start);
//   - the oldest request waited ScaleUpAfter: place one more (scale up);
//   - never beyond the model's max workers (counted on every pool), and
//     not before RetryAt. The one exception is the cold start of a pool
//     that requests are pinned to: it gets its first worker of the model
//     even when the model has its max elsewhere (the pin is an explicit
//     ask for that pool, as an operator's start is); idle timeouts take
//     the extra workers back.
//
// Targets that keep waiting are looked at again within demandResync.
func decideScale(now time.Time, demand []modelDemand, scaleUpAfter time.Duration) scaleDecision {
	var d scaleDecision
	recheck := func(after time.Duration) {
		if after > 0 && (d.Recheck == 0 || after < d.Recheck) {
			d.Recheck = after
		}
	}
	for _, m := range demand {
		what, where := m.Model, ""
		if m.Pool != "" {
			what, where = fmt.Sprintf("%s on pool %s", m.Model, m.Pool), " on pool "+m.Pool
		}
		// Nothing serves the target and nothing starts for it.
		idle := m.Live == 0 && m.Routable == 0 && m.Starting == 0
		refused := false
		refuse := func(why string, retryAfter time.Duration) {
			d.Refuse = append(d.Refuse, refusal{Model: m.Model, Pool: m.Pool, Why: why, RetryAfter: retryAfter})
			refused = true
		}
		switch {
		case m.Queued == 0:
		case m.Live == 0 && m.MaxWorkers == 0:
			refuse(fmt.Sprintf("model %s is not placed on demand (its max workers is 0) and no worker of it runs%s; an operator must start one", m.Model, where), 0)
		case m.Starting > 0:
		case idle && m.Pulling:
		case idle && m.NoPlace != "":
			refuse(m.NoPlace, 0)
		case idle && now.Before(m.RetryAt) && m.LastFailure != "":
			refuse(m.LastFailure, m.RetryAt.Sub(now))
		case m.Live > 0 && m.ModelLive >= m.MaxWorkers:
		case now.Before(m.RetryAt):
			recheck(m.RetryAt.Sub(now))
		case m.Live == 0:
			d.Place = append(d.Place, placeOrder{Model: m.Model, Pool: m.Pool, Kind: "cold_start",
				Reason: fmt.Sprintf("demand: %d requests for %s waiting, no worker runs it%s", m.Queued, what, where)})
		case m.OldestWait >= scaleUpAfter:
			d.Place = append(d.Place, placeOrder{Model: m.Model, Pool: m.Pool, Kind: "scale_up",
				Reason: fmt.Sprintf("demand: %d requests for %s waiting, the oldest for %s (threshold %s), %d of at most %d workers live",
					m.Queued, what, m.OldestWait.Round(time.Millisecond), scaleUpAfter, m.ModelLive, m.MaxWorkers)})
		default:
			recheck(scaleUpAfter - m.OldestWait)
		}
		if m.Queued > 0 && !refused {
			recheck(demandResync)
		}
	}
	return d
}

// placeBackoff is the wait before placing a model again after n
// placements in a row that gave it no serving worker: 1s, 2s, 4s … 30s.
func placeBackoff(n int) time.Duration {
	if n <= 0 {
		return 0
	}
	return min(time.Second<<min(n-1, 5), 30*time.Second)
}

// placeResult is what one placement did.
type placeResult struct {
	target target
	row    store.Row
	err    error
}

// controller turns demand (requests waiting in the router's queues) into
// workers: it is the only code that places workers on demand, and it
// never serves a request. One goroutine (run) owns its state; placements
// run on goroutines run starts and waits for.
type controller struct {
	s    *Service
	log  *slog.Logger
	wake chan struct{}
}

func newController(s *Service) *controller {
	return &controller{s: s, log: s.cfg.Logger.With("component", "controller"), wake: make(chan struct{}, 1)}
}

// signal asks the controller to look at the demand; it never blocks.
func (c *controller) signal() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// run decides whenever demand changes, a placement ends, or a deadline of
// the policy passes, until ctx ends; then it waits for its placements.
// Each round it first keeps the models with min_workers at their
// replicas (decideReplicas), then weighs the requests waiting
// (decideScale): a replica being placed is a worker starting for them.
func (c *controller) run(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	results := make(chan placeResult)
	targets := map[target]*placing{}
	reps := map[string]*replicaState{} // models with min_workers
	state := func(t target) *placing {
		if targets[t] == nil {
			targets[t] = &placing{}
		}
		return targets[t]
	}
	launch := func(o placeOrder) {
		state(o.target()).pending++
		wg.Go(func() {
			res := c.place(ctx, o)
			select {
			case results <- res:
			case <-ctx.Done():
			}
		})
	}
	rt := c.s
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	c.signal() // a first round: the replicas of the settings loaded at start
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.wake:
		case <-timer.C:
		case res := <-results:
			st := state(res.target)
			st.pending--
			rs := reps[res.target.model]
			if errors.Is(res.err, errRoomComing) {
				break // no failure: the requests wait on (see noPlace)
			}
			if res.err == nil {
				st.fails, st.failRetry, st.lastFailure = 0, time.Time{}, ""
				st.placed = append(st.placed, res.row.ID)
				if rs != nil {
					rs.watch = append(rs.watch, res.row.ID)
				}
				break
			}
			// The requests learn why in words; the log keeps the details
			// (the audit has them from where the placement failed).
			c.log.Warn("a placement gave no worker", "model_ref", res.target.model, "pool_id", res.target.pool, "err", res.err)
			st.failed(time.Now(), openai.PublicText(res.err))
			if rs != nil {
				c.replicaFailed(ctx, &wg, res.target.model, rs, failure{At: time.Now(), Reason: "the placement gave no worker: " + res.err.Error()})
			}
		}
		replicas := rt.cp.Replicas()
		counts, recheck := c.followReplicas(ctx, &wg, replicas, reps, time.Now())
		// Pulls that failed: the requests that waited for them are
		// refused with why, as after a placement that gave no worker.
		for _, f := range rt.pulls.takeFailed() {
			c.log.Warn("a pull of a model that requests waited for failed", "model_ref", f.model, "pool_id", f.pool, "why", f.why)
			for _, s := range rt.router.queueStats() {
				if s.target.model == f.model && (s.target.pool == "" || s.target.pool == f.pool) {
					state(s.target).failed(time.Now(), f.public)
				}
			}
			if rs := reps[f.model]; rs != nil {
				state(target{model: f.model}).failed(time.Now(), f.public)
			}
		}
		// Rows placed on demand that ended before they served: their
		// waiting requests learn why (the decision below refuses them).
		for t, st := range targets {
			c.followPlaced(ctx, t, st)
		}
		now := time.Now()
		// A target that has a serving worker again starts afresh: its next
		// cold start (after the worker is gone) is not held back.
		for t, st := range targets {
			if (st.coldTries > 0 || st.lastFailure != "") && len(rt.router.source(t)) > 0 {
				st.coldTries, st.coldRetry, st.lastFailure = 0, time.Time{}, ""
			}
			if st.noPlace != "" && now.Sub(st.noPlaceAt) >= noPlaceAuditEvery {
				st.noPlace = ""
			}
			if st.idle() {
				delete(targets, t)
			}
		}
		pending := map[string]int{} // by model, every target
		for t, st := range targets {
			pending[t.model] += st.pending
		}
		var pools []registry.Pool // read once, when a model needs them
		var models map[string]map[string]api.Model
		// noPlace says why no pool can take a worker of t now, and audits
		// it once per reason (again after noPlaceAuditEvery), not once
		// per round or request. For a configured model with a source
		// that no pool has, it starts a pull of it instead (planPull),
		// need saying what needs the worker, and reports pulling: the
		// target waits for the pull.
		noPlace := func(st *placing, t target, need string, waited time.Duration) (why string, pulling bool) {
			if pools == nil {
				pools, models = c.s.pools(registry.Filter{}, nil), rt.catalog.snapshot()
			}
			req := PlaceRequest{Model: t.model, Pool: t.pool, Models: models, Pools: c.s.allowedPools(t.model), Engine: c.s.engineOf(t.model),
				Apart: c.s.apartFrom(t.model)}
			err := unplaceable(c.s.cfg.Placer, pools, req)
			if err == nil {
				return "", false
			}
			if waited < c.s.cfg.SwapWait && c.s.actedUnseen(t.model, t.pool) {
				// The queen placed or evicted on a pool the model may
				// run on since that pool's last heartbeat: its list may
				// lack a worker that is gone or coming. Look again once
				// the hive has reported (at most --swap-wait).
				recheck = minPositive(recheck, swapRecheck)
				return "", true
			}
			if c.s.awaitsHive(t.model, t.pool) {
				// A pool the queen restored at its start may serve it once
				// its hive is heard from (a heartbeat, or the answer to the
				// token fetch): its workers are presumed alive until the
				// lease the restart gave it runs out.
				recheck = minPositive(recheck, swapRecheck)
				return "", true
			}
			if need := c.s.needOf(t.model); need > 0 {
				if _, ok := c.s.planEviction(t.model, t.pool, need, false); ok {
					return "", false // idle workers of other models can make room: the placement evicts them
				}
				if _, ok := c.s.planEviction(t.model, t.pool, need, true); ok {
					if waited < c.s.cfg.SwapWait {
						// Busy (or young) workers hold the room: they are
						// waited for (SwapWait), looked at again soon.
						recheck = minPositive(recheck, swapRecheck)
						return "", true
					}
					more := fmt.Sprintf("workers of other models hold the room it needs, busy (or loaded too recently on a device that swaps often: each stays as long as it took to load, at least --min-residency %s), and did not come free within --swap-wait %s",
						c.s.cfg.MinResidency, c.s.cfg.SwapWait)
					err = openai.Public(fmt.Errorf("%w; %s", err, more), "%s; %s", openai.PublicText(err), more)
				}
			}
			if src := c.s.pullSource(t.model); src != "" {
				running, backoff := rt.pulls.forModel(t.model, now)
				pd := planPull(c.s.cfg.Placer, pools, req, running, backoff)
				switch {
				case pd.Wait:
					return "", true
				case pd.Err != nil:
					// No pool would take it even with its file: the reasons
					// name the pulls that failed lately.
					err = pd.Err
				case now.Before(st.failRetry) && st.lastFailure != "":
					// The last pull or placement failed: its requests are
					// refused with why (LastFailure) until the backoff
					// passes.
					return "", false
				default:
					reason := fmt.Sprintf("%s; no pool has model %s: pulling it on pool %s from %s", need, c.s.nameOf(t.model), pd.Pool.ID, src)
					if rt.pulls.reserve(pd.Pool.ID, t.model, registry.ActorQueen, reason, src, now) {
						pool := pd.Pool.ID
						wg.Go(func() { c.s.startPull(ctx, pool, t.model, src, reason) })
					}
					return "", true
				}
			}
			if why := err.Error(); why != st.noPlace {
				st.noPlace, st.noPlaceAt = why, now
				wg.Go(func() { c.s.placeFailed(ctx, req, err) })
			}
			return openai.PublicText(err), false
		}

		// Replicas: no request needs to wait for them.
		var needs []replicaNeed
		for _, model := range slices.Sorted(maps.Keys(reps)) {
			rs, t := reps[model], target{model: model}
			st := state(t)
			n := counts[model] // taken before the rows were followed: see followReplicas
			need := replicaNeed{Model: model, Min: replicas[model].Min, Live: n.Live() + pending[model], Starting: n.Starting + pending[model],
				RetryAt: later(rs.retry, st.failRetry), CrashLoop: rs.loop != nil}
			if need.Live < need.Min && need.Starting == 0 && !now.Before(need.RetryAt) {
				need.NoPlace, need.Pulling = noPlace(st, t, fmt.Sprintf("replicas: %d of min_workers %d of %s live", need.Live, need.Min, model), 0)
			}
			needs = append(needs, need)
		}
		rdec := decideReplicas(now, needs)
		for _, o := range rdec.Place {
			pending[o.Model]++
			launch(o)
		}
		recheck = minPositive(recheck, rdec.Recheck)
		c.s.setCrashLoops(reps)

		// Nothing waits (the common case: every heartbeat wakes the
		// controller): no demand to weigh.
		if stats := rt.router.queueStats(); len(stats) > 0 {
			recheck = minPositive(recheck, c.weighDemand(now, stats, replicas, reps, pending, state, noPlace, launch))
		}
		if recheck > 0 {
			timer.Reset(recheck)
		}
	}
}

// weighDemand is one round of the scale policy over the targets with
// requests waiting: it refuses those no worker will serve and places
// workers for the others; it returns when to decide again.
func (c *controller) weighDemand(now time.Time, stats []queueStat, replicas map[string]Replica, reps map[string]*replicaState,
	pending map[string]int, state func(target) *placing, noPlace func(*placing, target, string, time.Duration) (string, bool), launch func(placeOrder)) time.Duration {
	rt := c.s
	rt.m.rounds.Inc()
	// Workers on pools that are silent take no requests: they do not
	// count against the model's max workers. A drained pool's running
	// workers serve on, and count.
	var demand []modelDemand
	for _, s := range stats {
		st := state(s.target)
		n := c.s.counts(s.target, true)
		all := n
		if s.target.pool != "" {
			all = c.s.counts(target{model: s.target.model}, true)
		}
		m := modelDemand{Model: s.target.model, Pool: s.target.pool, Queued: s.queued, OldestWait: now.Sub(s.oldest),
			Live: n.Live() + st.pending, Starting: n.Starting + st.pending, Routable: len(rt.router.source(s.target)),
			ModelLive: all.Live() + pending[s.target.model], MaxWorkers: c.s.cfg.maxWorkers(s.target.model, replicas[s.target.model]),
			RetryAt: later(st.coldRetry, st.failRetry), LastFailure: st.lastFailure}
		if s.target.pool == "" {
			m.Live = m.ModelLive
		}
		if rs := reps[s.target.model]; rs != nil && rs.loop != nil {
			// A model in a crash loop is not placed faster on demand.
			m.RetryAt = later(m.RetryAt, rs.retry)
			// Its last failure (a worker's exit, with paths) is in the
			// log and the audit, not in the refusal.
			m.LastFailure = fmt.Sprintf("model %s is in a crash loop (%d failures within %s; replaced every %s)",
				s.target.model, rs.loop.Failures, c.s.cfg.CrashLoopWindow, c.s.cfg.CrashLoopBackoff)
		}
		if m.Live == 0 && m.Routable == 0 && m.MaxWorkers > 0 {
			// Nothing serves or starts: can a worker be placed at all?
			m.NoPlace, m.Pulling = noPlace(st, s.target, fmt.Sprintf("demand: %d requests for %s waiting", s.queued, s.target), now.Sub(s.oldest))
		}
		demand = append(demand, m)
	}
	sort.Slice(demand, func(i, j int) bool {
		a, b := demand[i], demand[j]
		return a.Model < b.Model || (a.Model == b.Model && a.Pool < b.Pool)
	})
	dec := decideScale(now, demand, c.s.cfg.ScaleUpAfter)
	for _, r := range dec.Refuse {
		if n := rt.router.fail(target{r.Model, r.Pool}, &capacityError{why: r.Why, retryAfter: r.RetryAfter}); n > 0 {
			c.log.Warn("no worker can serve the waiting requests; refused", "model_ref", r.Model, "pool_id", r.Pool, "refused", n, "why", r.Why)
		}
	}
	for _, o := range dec.Place {
		st := state(o.target())
		if o.Kind == "cold_start" {
			// A worker that dies while loading brings the target back
			// here: each cold start in a row waits longer.
			st.coldTries++
			st.coldRetry = now.Add(placeBackoff(st.coldTries))
		}
		launch(o)
	}
	return dec.Recheck
}

func minPositive(a, b time.Duration) time.Duration {
	if a <= 0 || (b > 0 && b < a) {
		return b
	}
	return a
}

// placing is what the controller remembers of one target.
type placing struct {
	pending     int       // placements under way
	coldTries   int       // cold starts since the model last had a serving worker
	coldRetry   time.Time // no cold start before (after one that gave no worker)
	fails       int       // placements in a row that failed
	failRetry   time.Time // no placement before (after failures)
	lastFailure string    // why the last placement gave no worker, until one serves
	noPlace     string    // why no pool could take a worker, as last audited
	noPlaceAt   time.Time // when noPlace was audited
	// placed holds the rows placed for the target that have not served
	// yet; bounded by the placements one at a time and max workers.
	placed []string
}

func (p *placing) idle() bool {
	return p.pending == 0 && p.coldTries == 0 && p.fails == 0 && p.lastFailure == "" && p.noPlace == "" && len(p.placed) == 0
}

// failed records a placement that gave no worker, and why.
func (p *placing) failed(now time.Time, why string) {
	p.fails++
	p.failRetry = now.Add(placeBackoff(p.fails))
	p.lastFailure = why
}

// followPlaced drops the rows of st.placed that serve (RUNNING) and
// records a failed placement for each that ended before it served: in
// words for the waiting requests, with the row and its reason (a worker's
// exit, which may name files) in the log; the row's audit entries have it.
func (c *controller) followPlaced(ctx context.Context, t target, st *placing) {
	kept := st.placed[:0]
	for _, id := range st.placed {
		row, err := c.s.cp.Row(ctx, id)
		switch {
		case err != nil:
			c.log.Warn("cannot read a row placed on demand", "lifecycle_id", id, "err", err)
		case row.Status == lifecycle.StatusStarting:
			kept = append(kept, id)
		case row.Status == lifecycle.StatusRunning:
		case row.Status == lifecycle.StatusFailed:
			c.log.Warn("a worker placed on demand failed to start", "model_ref", t.model, "lifecycle_id", id, "pool_id", row.PoolID, "reason", row.Reason)
			st.failed(time.Now(), fmt.Sprintf("the worker placed for %s on pool %s failed to start", t, row.PoolID))
		default:
			c.log.Warn("a worker placed on demand was stopped before it was ready", "model_ref", t.model, "lifecycle_id", id, "pool_id", row.PoolID, "reason", row.Reason)
			st.failed(time.Now(), fmt.Sprintf("the worker placed for %s on pool %s was stopped before it was ready", t, row.PoolID))
		}
	}
	clear(st.placed[len(kept):])
	st.placed = kept
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// errRoomComing is a placement that found no room now, with room coming:
// workers of other models hold it that are busy (or young) now, or a
// hive's memory or --max-loaded is still taken by workers it is
// stopping. It is not a failure: the requests wait on, up to
// --swap-wait (see noPlace).
var errRoomComing = errors.New("no room yet; workers of other models hold it")

// place starts one worker of o.Model (on o.Pool when it names one):
// placement, lifecycle row, hive start. Its decision is reserved (see
// ledger) until the pool lists the worker. Without room, idle workers of
// other models are evicted first (once); with only busy ones, the
// placement ends with errRoomComing. A hive that refuses (or does not
// answer) is left out and the placement is made again without it; one
// that has no room yet (its memory or --max-loaded, taken by workers it
// is still stopping) is tried again after a change, up to --swap-wait,
// when no other pool takes the worker.
func (c *controller) place(ctx context.Context, o placeOrder) placeResult {
	start := time.Now()
	exclude := map[string]string{}
	excludeDetail := map[string]string{} // what the excluded pools' hives said, for the log
	noRoom := map[string]string{}        // pools whose hive had no room yet, and why
	evicted := false
	var res *reservation
	fail := func(err error) placeResult {
		c.s.ledger.release(res)
		return placeResult{target: o.target(), err: err}
	}
	roomBy := start.Add(c.s.cfg.SwapWait)
	pause := evictPoll
	for {
		req := PlaceRequest{Model: o.Model, Pool: o.Pool, Exclude: exclude, ExcludeDetail: excludeDetail}
		if len(noRoom) > 0 {
			req.Exclude = maps.Clone(exclude)
			maps.Copy(req.Exclude, noRoom)
		}
		d, err := c.s.decide(ctx, req, false, &res)
		if err != nil && len(exclude) == 0 && len(noRoom) == 0 && !evicted {
			if r, ok := c.evict(ctx, o.Model, o.Pool); ok {
				// Idle workers of other models made room: place again.
				c.s.ledger.release(res)
				res, evicted = r, true
				continue
			}
			if need := c.s.needOf(o.Model); need > 0 {
				if _, ok := c.s.planEviction(o.Model, o.Pool, need, true); ok || c.s.actedUnseen(o.Model, o.Pool) {
					return fail(fmt.Errorf("%w: %w", errRoomComing, err))
				}
			}
		}
		if err != nil && len(noRoom) > 0 && time.Now().Before(roomBy) {
			// The hive that had no room may have it after its next event.
			select {
			case <-ctx.Done():
				return fail(ctx.Err())
			case <-c.s.changes.wait():
			case <-time.After(pause):
			}
			pause = min(2*pause, time.Second)
			clear(noRoom)
			continue
		}
		if err != nil {
			maps.Copy(exclude, noRoom)
			c.s.placeFailed(ctx, PlaceRequest{Model: o.Model, Pool: o.Pool, Exclude: exclude, ExcludeDetail: excludeDetail}, err)
			c.s.m.placements.WithLabelValues(o.Model, "failed").Inc()
			return fail(err)
		}
		gpu := d.GPU
		row, err := c.s.cp.StartWorker(ctx, Start{Model: o.Model, Pool: d.Pool.ID, GPU: gpu, GPUs: d.GPUs, Reason: o.Reason,
			Meta: map[string]any{"placement": d.AuditMeta(), "demand": o.Kind}})
		var refused *StartRefused
		switch {
		case err == nil:
			c.s.ledger.started(res, row.ID)
			c.s.m.placements.WithLabelValues(o.Model, "started").Inc()
			c.log.Info("worker placed on demand", "model_ref", o.Model, "kind", o.Kind, "pool_id", d.Pool.ID, "gpu_device", gpu, "gpu_devices", d.GPUs,
				"lifecycle_id", row.ID, "duration_ms", time.Since(start).Milliseconds())
			return placeResult{target: o.target(), row: row}
		case ctx.Err() != nil:
			return fail(err)
		case errors.As(err, &refused) && refused.NoRoomYet && time.Now().Before(roomBy) && c.s.roomMayCome(o.Model, d.Pool.ID):
			// Workers it is stopping have not left the hive's table yet,
			// or it counts one the queen does not see yet: another pool
			// first, this one again after a change.
			noRoom[d.Pool.ID] = refused.Why
		case errors.As(err, &refused):
			exclude[d.Pool.ID] = refused.Why
			if refused.Err != nil {
				excludeDetail[d.Pool.ID] = refused.Why + ": " + refused.Err.Error()
			}
		default:
			c.s.m.placements.WithLabelValues(o.Model, "failed").Inc()
			return fail(err)
		}
		c.log.Warn("placement refused; placing again without the pool", "model_ref", o.Model, "pool_id", d.Pool.ID, "err", err)
	}
}

// actedUnseen says whether the queen placed or evicted on a pool model
// may run on (pool, when it is not "") after that pool's last heartbeat.
func (s *Service) actedUnseen(model, pool string) bool {
	ok := s.poolsFor(model, pool)
	for _, p := range s.cp.Pools(registry.Filter{Statuses: []registry.Status{registry.Healthy}}) {
		if ok(p.ID) && s.ledger.actedSince(p.ID, p.LastHeartbeatAt) {
			return true
		}
	}
	return false
}

// awaitsHive says whether a pool the queen restored at its start, whose
// hive it has not heard from yet, may serve model (on pool, when it is
// not ""): one the model may run on.
func (s *Service) awaitsHive(model, pool string) bool {
	return slices.ContainsFunc(s.cp.AwaitedPools(), s.poolsFor(model, pool))
}

// poolsFor says of a pool id whether a worker of model may go there: the
// target's pool (pool, when it is not "") and the model's config's pools.
func (s *Service) poolsFor(model, pool string) func(id string) bool {
	allowed := s.allowedPools(model)
	return func(id string) bool {
		return (pool == "" || id == pool) && (allowed == nil || slices.Contains(allowed, id))
	}
}

// roomMayCome says whether a hive's "no room" for a worker of model may
// pass on its own within --swap-wait: a worker stops there (an eviction's
// victim, a draining one), or workers of other models there could be
// evicted once they are done. Otherwise the refusal is the answer (the
// model does not fit beside what stays).
func (s *Service) roomMayCome(model, pool string) bool {
	if s.ledger.stopping(pool) {
		return true
	}
	if p, ok := s.cp.Pool(pool); ok {
		for _, w := range p.Workers {
			if live(w) && lifecycle.State(w.Status) == lifecycle.Draining {
				return true
			}
		}
	}
	if need := s.needOf(model); need > 0 {
		if _, ok := s.planEviction(model, pool, need, true); ok {
			return true
		}
	}
	return false
}

// Place places a worker of req.Model: the catalog is brought up to date
// for it, then the Placer decides (req.Models is filled in here, and
// req.Pools from the model's config when it has none). A
// placement that finds no pool is audited with every pool's reason. The
// queen places an operator's start without a pool with it.
func (s *Service) Place(ctx context.Context, req PlaceRequest) (Decision, error) {
	return s.placeWith(ctx, req, true)
}

// placeWith is Place; a failure is audited only with audit.
func (s *Service) placeWith(ctx context.Context, req PlaceRequest, audit bool) (Decision, error) {
	return s.decide(ctx, req, audit, nil)
}

// decide is placeWith that, with res, reserves what it decides (see
// ledger): *res is made, or moved to the new decision; the pools are seen
// without *res itself. The decision and the reservation are one step
// under placeMu.
func (s *Service) decide(ctx context.Context, req PlaceRequest, audit bool, res **reservation) (Decision, error) {
	if req.Pools == nil {
		req.Pools = s.allowedPools(req.Model)
	}
	if req.Engine == "" {
		req.Engine = s.engineOf(req.Model)
	}
	if req.Apart == nil {
		req.Apart = s.apartFrom(req.Model)
	}
	var healthy []registry.Pool
	for _, p := range s.cp.Pools(registry.Filter{}) {
		if p.Status == registry.Healthy && (req.Pool == "" || p.ID == req.Pool) && (req.Pools == nil || slices.Contains(req.Pools, p.ID)) {
			healthy = append(healthy, p)
		}
	}
	s.catalog.ensure(ctx, healthy, req.Model)
	req.Models = s.catalog.snapshot()
	var own *reservation
	if res != nil {
		own = *res
	}
	s.placeMu.Lock()
	d, err := s.cfg.Placer.Place(s.pools(registry.Filter{}, own), req)
	if err == nil && res != nil {
		if own == nil {
			*res = s.ledger.reserve(req.Model, d.Pool.ID, d.GPU, time.Now())
		} else {
			s.ledger.move(own, d.Pool.ID, d.GPU)
		}
		s.ledger.split(*res, d.GPUs, d.Shares)
	}
	s.placeMu.Unlock()
	if err == nil {
		return d, nil
	}
	if audit {
		s.placeFailed(ctx, req, err)
	}
	return Decision{}, err
}

// placeFailed audits (worker.place_failed) and logs a placement that
// found no pool, with every pool's reason.
func (s *Service) placeFailed(ctx context.Context, req PlaceRequest, err error) {
	meta := map[string]any{"model_ref": req.Model, "rejected": rejectedMeta(placementRejections(err))}
	if req.GPU != nil {
		meta["gpu_device"] = *req.GPU
	}
	if req.Pool != "" {
		meta["pool_id"] = req.Pool
	}
	s.cp.Audit(context.WithoutCancel(ctx), store.AuditEntry{Actor: registry.ActorQueen, Action: "worker.place_failed",
		Target: "model:" + req.Model, Reason: err.Error(), Metadata: meta})
	s.log.Warn("placement found no pool", "model_ref", req.Model, "pool_id", req.Pool, "err", err)
}
