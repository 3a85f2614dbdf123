package routing

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/apiary-llm/apiary/internal/lifecycle"
	"github.com/apiary-llm/apiary/internal/registry"
	"github.com/apiary-llm/apiary/internal/store"
)

// Replica is an operator's setting of a model (apiary models scale): the
// controller keeps at least Min workers of it live, with no request
// waiting, and places at most Max of it (nil: the queen's max workers).
// A Min above the max raises the max to Min.
type Replica struct {
	Min int
	Max *int
}

// CrashLoop is a model whose workers failed CrashLoopFailures times within
// CrashLoopWindow: it is replaced only every CrashLoopBackoff until one
// of its workers serves for StableAfter.
type CrashLoop struct {
	Since       time.Time
	Failures    int       // failures within the window
	LastFailure string    // why the last worker ended
	LastExit    *int      // its exit code, when the hive reported one
	NextTry     time.Time // no replacement before
}

// replicaNeed is what the replica policy sees of one model with
// min_workers.
type replicaNeed struct {
	Model    string
	Min      int
	Live     int // live rows (STARTING, RUNNING) on healthy pools, plus placements under way
	Starting int // STARTING rows plus placements under way
	RetryAt  time.Time
	// NoPlace is why no pool can take a worker of the model now; "" when
	// one can or may.
	NoPlace   string
	CrashLoop bool
	// Pulling: no pool has the model's file and a pull of it runs; the
	// replica waits for it.
	Pulling bool
}

// replicaDecision is what decideReplicas decided.
type replicaDecision struct {
	Place   []placeOrder
	Recheck time.Duration // when to decide again; 0: no need
}

// decideReplicas is the replica policy, pure. For each model with
// min_workers, when fewer than Min of its workers are live on healthy
// pools, it places one more (kind replica), with no request waiting:
//   - one placement at a time per model (a starting worker counts as
//     live until it fails);
//   - not while no pool can take one (NoPlace: a pool that registers or
//     beats wakes the controller);
//   - not before RetryAt (the replacement backoff, or the crash loop's).
func decideReplicas(now time.Time, needs []replicaNeed) replicaDecision {
	var d replicaDecision
	for _, n := range needs {
		switch {
		case n.Live >= n.Min:
		case n.Starting > 0:
		case n.NoPlace != "", n.Pulling:
		case now.Before(n.RetryAt):
			if after := n.RetryAt.Sub(now); d.Recheck == 0 || after < d.Recheck {
				d.Recheck = after
			}
		default:
			why := fmt.Sprintf("replicas: %d of min_workers %d of %s live", n.Live, n.Min, n.Model)
			if n.CrashLoop {
				why += "; the model is in a crash loop (replaced at the slow pace)"
			}
			d.Place = append(d.Place, placeOrder{Model: n.Model, Kind: "replica", Reason: why})
		}
	}
	return d
}

// crashLoopPolicy is when a model's failures make a crash loop, and how
// it is retried.
type crashLoopPolicy struct {
	Failures int           // failures within Window that make a crash loop
	Window   time.Duration //
	Backoff  time.Duration // the wait between replacements in a crash loop
}

// failure is one worker of a model that ended FAILED, or one placement of
// it that gave no worker.
type failure struct {
	At          time.Time
	LifecycleID string // "" for a placement that gave no worker
	PoolID      string
	Reason      string
	ExitCode    *int
}

// replicaState is what the controller remembers of a model with
// min_workers: the rows placed for it, followed until they end, its
// replacement backoff, and its crash loop.
type replicaState struct {
	// watch holds the rows placed for the model, followed until they
	// end; bounded by its max workers (the ended ones are dropped each
	// round).
	watch []string
	tries int       // failures since a worker of the model last served for StableAfter
	retry time.Time // no replacement before
	// recent holds the failures within the window, oldest first; at most
	// policy.Failures of them.
	recent []failure
	loop   *CrashLoop // set while the model is in a crash loop
}

// failed records f and sets the next replacement's time: placeBackoff of
// the failures in a row, or the crash loop's slow pace. It reports
// whether f started a crash loop.
func (r *replicaState) failed(f failure, p crashLoopPolicy) bool {
	r.tries++
	kept := r.recent[:0]
	for _, old := range r.recent {
		if f.At.Sub(old.At) < p.Window {
			kept = append(kept, old)
		}
	}
	r.recent = append(kept, f)
	if n := len(r.recent) - p.Failures; n > 0 {
		r.recent = append(r.recent[:0], r.recent[n:]...)
	}
	started := false
	if r.loop == nil && len(r.recent) >= p.Failures {
		r.loop = &CrashLoop{Since: f.At}
		started = true
	}
	if r.loop != nil {
		r.retry = f.At.Add(p.Backoff)
		r.loop.Failures, r.loop.LastFailure, r.loop.LastExit, r.loop.NextTry = len(r.recent), f.Reason, f.ExitCode, r.retry
	} else {
		r.retry = f.At.Add(placeBackoff(r.tries))
	}
	return started
}

// stable records that a worker of the model served for StableAfter: the
// backoff and the failures are forgotten, and a crash loop ends (the one
// it ended is returned).
func (r *replicaState) stable() *CrashLoop {
	loop := r.loop
	r.tries, r.retry, r.recent, r.loop = 0, time.Time{}, nil, nil
	return loop
}

// followReplicas brings reps up to date with the settings (a model whose
// min_workers is 0 is no longer followed) and follows the rows placed for
// each model: one that ended FAILED is a failure (STOPPED: stopped on
// purpose, not one); one that served for StableAfter ends the model's
// backoff and crash loop. It returns each model's live rows, counted
// before its rows are read (what decideReplicas weighs), and when a
// worker that serves now will have served long enough (0: none to wait
// for).
//
// The count comes first because a row can end while the round reads: a
// row ends once, so one that the count missed (ended) is read as ended
// below and its failure sets the backoff before the round decides. The
// other order let a row read as STARTING be gone from the count taken
// after, and the round replaced it at once, with no backoff. A row that
// ends between the count and its read is counted live and recorded as
// failed: the controller decides again at once (signal), with a count
// without it.
func (c *controller) followReplicas(ctx context.Context, wg *sync.WaitGroup, replicas map[string]Replica, reps map[string]*replicaState,
	now time.Time) (map[string]Count, time.Duration) {
	for model, rs := range reps {
		if replicas[model].Min == 0 {
			delete(reps, model)
			if rs.loop != nil {
				c.log.Info("crash loop no longer followed: the model's min_workers is 0", "model_ref", model)
			}
		}
	}
	for model, r := range replicas {
		if r.Min > 0 && reps[model] == nil {
			reps[model] = &replicaState{}
		}
	}
	var recheck time.Duration
	counts := make(map[string]Count, len(reps))
	for model, rs := range reps {
		counts[model] = c.s.counts(target{model: model}, true)
		kept := rs.watch[:0]
		stable := false
		for _, id := range rs.watch {
			row, err := c.s.cp.Row(ctx, id)
			switch {
			case err != nil:
				kept = append(kept, id)
				c.log.Warn("cannot read a row placed for a model with min_workers", "lifecycle_id", id, "err", err)
			case row.Status == lifecycle.StatusFailed:
				c.replicaFailed(ctx, wg, model, rs, failure{At: now, LifecycleID: id, PoolID: row.PoolID, Reason: row.Reason, ExitCode: row.ExitCode})
				c.signal() // the count may hold the row: decide again with one that does not
			case row.Status == lifecycle.StatusStopped:
				c.signal() // likewise: a stopped row is replaced, with a count without it
			default:
				kept = append(kept, id)
				if row.Status != lifecycle.StatusRunning || row.ReadyAt == nil || (rs.tries == 0 && rs.loop == nil) {
					break
				}
				if served := now.Sub(*row.ReadyAt); served >= c.s.cfg.StableAfter {
					stable = true
				} else {
					recheck = minPositive(recheck, c.s.cfg.StableAfter-served)
				}
			}
		}
		clear(rs.watch[len(kept):])
		rs.watch = kept
		if !stable {
			continue
		}
		if loop := rs.stable(); loop != nil {
			c.s.endCrashLoop(model) // published before it is logged
			wg.Go(func() {
				c.s.cp.Audit(context.WithoutCancel(ctx), store.AuditEntry{Actor: registry.ActorQueen, Action: "worker.crashloop_ended",
					Target: "model:" + model, Reason: fmt.Sprintf("a worker of %s served for %s", model, c.s.cfg.StableAfter),
					Metadata: map[string]any{"model_ref": model, "since": loop.Since}})
				// Logged once it is on record: what reads the log finds it.
				c.log.Info("crash loop ended: a worker of the model served", "model_ref", model, "stable_after", c.s.cfg.StableAfter, "since", loop.Since)
			})
		}
	}
	return counts, recheck
}

// crashLogLines bounds the log lines of the last failed worker that the
// crash loop's audit entry carries, and maxLogLine each line.
const (
	crashLogLines = 20
	maxLogLine    = 500
)

// replicaFailed records a failure of a model with min_workers; the first
// one that makes a crash loop is audited (worker.crashloop) with the
// failures and the last log lines of the last failed worker.
func (c *controller) replicaFailed(ctx context.Context, wg *sync.WaitGroup, model string, rs *replicaState, f failure) {
	pol := c.s.cfg.crashLoop()
	started := rs.failed(f, pol)
	c.log.Warn("a worker of a model with min_workers failed; it is replaced after a backoff", "model_ref", model, "lifecycle_id", f.LifecycleID,
		"pool_id", f.PoolID, "reason", f.Reason, "failures_in_window", len(rs.recent), "retry_in", rs.retry.Sub(f.At), "crash_loop", rs.loop != nil)
	if !started {
		return
	}
	loop, recent := *rs.loop, slices.Clone(rs.recent)
	c.s.markCrashLoop(model, loop) // published before it is logged: what reads the log finds it
	wg.Go(func() {
		c.auditCrashLoop(context.WithoutCancel(ctx), model, loop, recent, pol)
		// Logged once it is on record, as the end of a crash loop is.
		c.log.Error("model in a crash loop: it is replaced only at the slow pace until a worker serves", "model_ref", model,
			"failures", len(recent), "window", pol.Window, "retry_every", pol.Backoff, "last_failure", f.Reason, "since", loop.Since)
	})
}

// auditCrashLoop writes the one audit entry of a crash loop.
func (c *controller) auditCrashLoop(ctx context.Context, model string, loop CrashLoop, recent []failure, pol crashLoopPolicy) {
	var fails []map[string]any
	lastRow := ""
	for _, f := range recent {
		m := map[string]any{"at": f.At, "reason": f.Reason}
		if f.LifecycleID != "" {
			m["lifecycle_id"], m["pool_id"] = f.LifecycleID, f.PoolID
			lastRow = f.LifecycleID
		}
		if f.ExitCode != nil {
			m["exit_code"] = *f.ExitCode
		}
		fails = append(fails, m)
	}
	meta := map[string]any{"model_ref": model, "failures": fails, "window": pol.Window.String(), "retry_every": pol.Backoff.String()}
	if lastRow != "" {
		lctx, cancel := context.WithTimeout(ctx, catalogTimeout)
		lines, err := c.s.cp.LogTail(lctx, lastRow, crashLogLines)
		cancel()
		if err != nil {
			meta["log_error"] = err.Error()
		} else {
			for i, l := range lines {
				if len(l) > maxLogLine {
					lines[i] = l[:maxLogLine] + "…"
				}
			}
			meta["last_log_lines"], meta["log_of"] = lines, lastRow
		}
	}
	c.s.cp.Audit(ctx, store.AuditEntry{Actor: registry.ActorQueen, Action: "worker.crashloop", Target: "model:" + model,
		Reason: fmt.Sprintf("%s failed %d times within %s: crash loop; replaced every %s until a worker serves for %s; the last: %s",
			model, len(recent), pol.Window, pol.Backoff, c.s.cfg.StableAfter, loop.LastFailure),
		Metadata: meta})
}

// markCrashLoop publishes one model's crash loop at once, before the
// controller's round ends with setCrashLoops.
func (s *Service) markCrashLoop(model string, loop CrashLoop) {
	s.loopsMu.Lock()
	loops := maps.Clone(s.loops)
	if loops == nil {
		loops = map[string]CrashLoop{}
	}
	loops[model] = loop
	s.loops = loops
	s.loopsMu.Unlock()
	s.m.crashLoop.WithLabelValues(model).Set(1)
}

// endCrashLoop publishes the end of one model's crash loop at once.
func (s *Service) endCrashLoop(model string) {
	s.loopsMu.Lock()
	if _, ok := s.loops[model]; ok {
		loops := maps.Clone(s.loops)
		delete(loops, model)
		s.loops = loops
	}
	s.loopsMu.Unlock()
	s.m.crashLoop.WithLabelValues(model).Set(0)
}

// setCrashLoops publishes the models in a crash loop (CrashLoops, the
// gauge).
func (s *Service) setCrashLoops(reps map[string]*replicaState) {
	var loops map[string]CrashLoop
	for m, rs := range reps {
		if rs.loop != nil {
			if loops == nil {
				loops = map[string]CrashLoop{}
			}
			loops[m] = *rs.loop
		}
	}
	s.loopsMu.Lock()
	old := s.loops
	s.loops = loops
	s.loopsMu.Unlock()
	for m := range old {
		if _, ok := loops[m]; !ok {
			s.m.crashLoop.WithLabelValues(m).Set(0)
		}
	}
	for m := range loops {
		if _, ok := old[m]; !ok {
			s.m.crashLoop.WithLabelValues(m).Set(1)
		}
	}
}

// CrashLoops returns the models in a crash loop now, by model.
func (s *Service) CrashLoops() map[string]CrashLoop {
	s.loopsMu.Lock()
	defer s.loopsMu.Unlock()
	return maps.Clone(s.loops)
}
