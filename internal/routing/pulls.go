package routing

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/registry"
)

// Pull is a model pull that runs on a pool, started through the queen
// (by an operator, or by the controller for a configured model that no
// pool has), as routing follows it.
type Pull struct {
	api.ModelPull
	Actor  string // who started it
	Reason string // why, as audited
}

// pullKey is one model on one pool: at most one pull of it runs at a
// time.
type pullKey struct{ pool, model string }

// pullState is what is known of the pulls of one model on one pool.
type pullState struct {
	pull    Pull // the running pull, as last known; valid while running
	running bool
	endedID string    // the id of the last pull that ended: a late word of its start is not a new pull
	fails   int       // pulls in a row that failed
	retryAt time.Time // the controller pulls again no sooner (after a failure)
	lastErr string    // why the last pull failed, as the hive said (for the log)
	// lastPublic is lastErr in words for API clients and the placement's
	// reasons: no source address or file.
	lastPublic string
}

// pullFailure is a pull that failed, for the controller to fail the
// requests that waited for it.
type pullFailure struct {
	pool, model string
	why         string // with the hive's error, for the log
	public      string // in words, for the requests that waited
}

// pullForget is how long an ended pull's state is kept after its
// backoff passed (its failures in a row count towards the next backoff).
const pullForget = time.Hour

// maxUnseenFailures bounds the failures kept for the controller between
// two of its rounds.
const maxUnseenFailures = 256

// pulls follows the pulls started through the queen: which run (one per
// pool and model) and which failed lately (their backoff). Bounded: one
// entry per pool and model pulled through the queen, dropped pullForget
// after its last backoff, or when the pool registers again or leaves.
type pulls struct {
	mu     sync.Mutex
	m      map[pullKey]*pullState // guarded by mu
	failed []pullFailure          // guarded by mu; failures the controller has not taken yet, at most maxUnseenFailures
}

func newPulls() *pulls { return &pulls{m: map[pullKey]*pullState{}} }

// pullBackoff is the wait before pulling a model again on a pool after n
// pulls of it in a row failed there: the controller's placement backoff
// (placeBackoff) at ten times its pace, 10s, 20s, 40s … 5m. A pull asks a
// remote Hub, which is not asked again every second for a file it refused.
func pullBackoff(n int) time.Duration { return 10 * placeBackoff(n) }

// reserve marks a pull of model on pool as running before its hive is
// asked (so that no second one is asked meanwhile); false when one runs.
func (p *pulls) reserve(pool, model, actor, reason, ref string, now time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.entryLocked(pullKey{pool, model})
	if st.running {
		return false
	}
	st.running = true
	st.pull = Pull{ModelPull: api.ModelPull{PoolID: pool, Ref: ref, Model: model, State: api.PullRunning, TotalBytes: -1, StartedAt: now.UTC()},
		Actor: actor, Reason: reason}
	return true
}

func (p *pulls) entryLocked(k pullKey) *pullState {
	st := p.m[k]
	if st == nil {
		st = &pullState{}
		p.m[k] = st
	}
	return st
}

// started records a pull its hive accepted (or answered as running).
func (p *pulls) started(pool string, mp api.ModelPull, actor, reason string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.entryLocked(pullKey{pool, mp.Model})
	if mp.State != api.PullRunning || (mp.ID != "" && mp.ID == st.endedID) {
		return // it ended already (its end came first)
	}
	if st.running && st.pull.Actor != "" {
		actor, reason = st.pull.Actor, st.pull.Reason // the one who asked first
	}
	mp.PoolID = pool
	st.running, st.pull = true, Pull{ModelPull: mp, Actor: actor, Reason: reason}
}

// progress updates the bytes of a running pull from its hive's word.
func (p *pulls) progress(mp api.ModelPull) {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.m[pullKey{mp.PoolID, mp.Model}]
	if st == nil || !st.running || mp.State != api.PullRunning || (st.pull.ID != "" && st.pull.ID != mp.ID) {
		return
	}
	st.pull.ID, st.pull.WrittenBytes, st.pull.ResumedBytes, st.pull.TotalBytes = mp.ID, mp.WrittenBytes, mp.ResumedBytes, mp.TotalBytes
}

// ended records the end of a pull. A failure of a pull that was followed
// (running) starts its backoff and is handed to the controller; a success
// clears the model's failures on the pool.
func (p *pulls) ended(mp api.ModelPull, public string, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	k := pullKey{mp.PoolID, mp.Model}
	st := p.m[k]
	if st == nil {
		if mp.State != api.PullFailed {
			return
		}
		st = p.entryLocked(k)
	}
	followed := st.running
	st.running, st.endedID = false, mp.ID
	if mp.State == api.PullDone {
		st.fails, st.retryAt, st.lastErr = 0, time.Time{}, ""
		return
	}
	st.fails++
	st.retryAt = now.Add(pullBackoff(st.fails))
	st.lastErr = fmt.Sprintf("pulling %s from %s on pool %s failed: %s", mp.Model, mp.Ref, mp.PoolID, mp.Error)
	// The hive's error may name files and the source addresses: API
	// clients read only that the pull failed, or public when the hive
	// refused the source the config names (its words are about that
	// name).
	st.lastPublic = fmt.Sprintf("pulling %s on pool %s failed", mp.Model, mp.PoolID)
	if public != "" {
		st.lastPublic = public
	}
	if followed && len(p.failed) < maxUnseenFailures {
		p.failed = append(p.failed, pullFailure{pool: mp.PoolID, model: mp.Model, why: st.lastErr, public: st.lastPublic})
	}
}

// takeFailed returns the failures since the last call.
func (p *pulls) takeFailed() []pullFailure {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := p.failed
	p.failed = nil
	return out
}

// forgetPool drops what is known of a pool's pulls: its hive registered
// again (a pull under way did not survive it) or left.
func (p *pulls) forgetPool(pool string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for k := range p.m {
		if k.pool == pool {
			delete(p.m, k)
		}
	}
}

// forModel returns the pools where a pull of model runs, and the pools
// where one failed and may not be tried again yet, with why; it drops the
// entries past pullForget.
func (p *pulls) forModel(model string, now time.Time) (running []string, backoff map[string]string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for k, st := range p.m {
		if !st.running && now.Sub(st.retryAt) > pullForget {
			delete(p.m, k)
			continue
		}
		if k.model != model {
			continue
		}
		switch {
		case st.running:
			running = append(running, k.pool)
		case now.Before(st.retryAt):
			if backoff == nil {
				backoff = map[string]string{}
			}
			backoff[k.pool] = fmt.Sprintf("%s; not pulled there again before %s", st.lastPublic, st.retryAt.UTC().Format(time.RFC3339))
		}
	}
	slices.Sort(running)
	return running, backoff
}

// list returns the running pulls, by pool then model.
func (p *pulls) list() []Pull {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []Pull
	for _, st := range p.m {
		if st.running {
			out = append(out, st.pull)
		}
	}
	slices.SortFunc(out, func(a, b Pull) int {
		if c := strings.Compare(a.PoolID, b.PoolID); c != 0 {
			return c
		}
		return strings.Compare(a.Model, b.Model)
	})
	return out
}

// pullDecision is what planPull decided for a model that no pool can run
// now.
type pullDecision struct {
	Wait bool          // a pull of the model runs on a pool the request may use: wait for it
	Pool registry.Pool // else, when Err is nil: pull the model there
	Err  error         // no pool would take the model even with its file (each pool's reason)
}

// planPull is the pull policy, pure. For a model no pool can run now
// (unplaceable said why), requests wait for a pull of it that runs on a
// pool they may use (healthy, allowed); else the pool to pull it on is the
// one placement would choose if every pool whose model list is known had
// the file (the size of the copy another pool has, else 0: the hive checks
// the fit when the worker starts), leaving out the pools where a pull of
// it failed lately (backoff, with why). When none would qualify but a
// healthy pool the request may use has a model list not known yet, the
// request waits for it (Wait, that pool). Err is the placer's error, every
// pool's reason, when no pool would qualify.
func planPull(placer Placer, pools []registry.Pool, req PlaceRequest, running []string, backoff map[string]string) pullDecision {
	for _, id := range running {
		if req.Pool != "" && id != req.Pool || req.Pools != nil && !slices.Contains(req.Pools, id) {
			continue
		}
		if i := slices.IndexFunc(pools, func(p registry.Pool) bool { return p.ID == id }); i >= 0 && pools[i].Status == registry.Healthy {
			return pullDecision{Wait: true, Pool: pools[i]}
		}
	}
	var size int64
	for _, models := range req.Models {
		if m, ok := models[req.Model]; ok && m.SizeBytes > 0 {
			size = m.SizeBytes
			break
		}
	}
	with := make(map[string]map[string]api.Model, len(req.Models))
	for id, models := range req.Models {
		m, ok := models[req.Model]
		if !ok {
			m = api.Model{Ref: req.Model, SizeBytes: size}
		}
		with[id] = map[string]api.Model{req.Model: m}
	}
	exclude := maps.Clone(req.Exclude)
	for id, why := range backoff {
		if exclude == nil {
			exclude = map[string]string{}
		}
		exclude[id] = why
	}
	hypo := req
	hypo.Models, hypo.Exclude = with, exclude
	d, err := placer.Place(pools, hypo)
	if err != nil {
		// A healthy pool the request may use whose model list is not
		// known yet (it registered a moment ago) may still take the
		// pull: wait for its list rather than refuse.
		for _, p := range pools {
			_, known := req.Models[p.ID]
			if !known && p.Status == registry.Healthy && (req.Pool == "" || p.ID == req.Pool) &&
				(req.Pools == nil || slices.Contains(req.Pools, p.ID)) && exclude[p.ID] == "" {
				return pullDecision{Wait: true, Pool: p}
			}
		}
		return pullDecision{Err: err}
	}
	return pullDecision{Pool: d.Pool}
}

// pullSource is the source a configured model is pulled from when no
// pool has its file; "" for a model that is not configured or has none.
func (s *Service) pullSource(model string) string {
	if m, ok := s.modelFile(model); ok {
		return m.Source
	}
	return ""
}

// startPull asks the control plane to pull model on pool from src, the
// pull reserve marked as running. A refusal ends it as a failed pull; a
// model the hive already has ends it as pulled (the catalog was behind).
func (s *Service) startPull(ctx context.Context, pool, model, src, reason string) {
	mp, err := s.cp.PullModel(ctx, pool, api.PullModelRequest{Ref: src, Name: model, Exact: true, Reason: reason})
	switch {
	case err != nil:
		failed := api.ModelPull{PoolID: pool, Ref: src, Model: model, State: api.PullFailed, Error: "the hive did not start it: " + err.Error()}
		s.pulls.ended(failed, sourceRefused(err, model, src, pool), time.Now())
		s.ctl.signal()
	case mp.State == api.PullDone:
		mp.PoolID, mp.Model = pool, model
		s.PullEnded(ctx, mp)
	default:
		s.log.Info("pulling a configured model that no pool has", "model_ref", model, "pool_id", pool, "ref", src, "pull_id", mp.ID)
	}
}

// PullStarted tells routing that a pull runs on a pool (its hive accepted
// it): until it ends, the controller waits for it instead of pulling the
// model again, and Pulls lists it.
func (s *Service) PullStarted(poolID string, mp api.ModelPull, actor, reason string) {
	s.pulls.started(poolID, mp, actor, reason)
}

// PullProgress updates a running pull's bytes from its hive's word.
func (s *Service) PullProgress(mp api.ModelPull) { s.pulls.progress(mp) }

// PullEnded tells routing that a pull on pool mp.PoolID ended (its hive
// reported it). A pulled model's pool has its list read again before the
// pull counts as ended, so the next placement finds the file; a pull
// whose model the list then lacks counts as failed. A failed pull that
// the controller waited for fails the requests that waited.
func (s *Service) PullEnded(ctx context.Context, mp api.ModelPull) {
	if mp.State == api.PullDone {
		if p, ok := s.cp.Pool(mp.PoolID); ok {
			s.catalog.collect(context.WithoutCancel(ctx), []registry.Pool{p}, true, func(*poolModels) bool { return true })
			if _, listed := s.catalog.lookup([]registry.Pool{p}, mp.Model); !listed {
				mp.State, mp.Error = api.PullFailed, fmt.Sprintf("the hive pulled it, but its model list does not have %s", mp.Model)
			}
		}
	}
	s.pulls.ended(mp, "", time.Now())
	s.ctl.signal()
}

// sourceRefusals are the codes of a hive's refusal of a pull's source
// itself (a reference that is no model, a quantization the repository
// lacks, a split model named otherwise, a gated repository): its words
// are about the source the queen's config names, for the client too.
var sourceRefusals = []string{"invalid_ref", "invalid_model_ref", "model_not_found", "hub_refused"}

// sourceRefused is what API clients read of a pull the hive refused to
// start: the hive's words when it refused the source itself, else ""
// (only that the pull failed).
func sourceRefused(err error, model, src, pool string) string {
	var he interface {
		ErrorCode() string
		HiveMessage() string
	}
	if !errors.As(err, &he) || !slices.Contains(sourceRefusals, he.ErrorCode()) {
		return ""
	}
	return fmt.Sprintf("pulling %s from %s on pool %s failed: %s", model, src, pool, he.HiveMessage())
}

// Pulls returns the pulls running on the pools, as last known.
func (s *Service) Pulls() []Pull { return s.pulls.list() }
