package batch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/apiary-llm/apiary/internal/openai"
	"github.com/apiary-llm/apiary/internal/routing"
	"github.com/apiary-llm/apiary/internal/store"
)

// jobDone is a job's attempt, ended and written.
type jobDone struct {
	job   store.BatchJob
	pause time.Duration // no job of its model is taken for this long
}

// writeTimeout bounds the store write of a job's end (also while the
// queen stops).
const writeTimeout = 10 * time.Second

// Run dispatches queued jobs until ctx ends, then waits for the jobs
// under way (they end at once: their requests are cancelled, and they go
// back to the queue). First it queues again the jobs that were running
// when the queen last stopped, and finishes the batches whose requests
// had all ended.
func (s *Service) Run(ctx context.Context) (err error) {
	defer func() { s.endRecovery(err) }() // creations wait no more, whatever happened
	n, err := s.requeue(ctx)
	if err != nil {
		return err
	}
	if n > 0 {
		s.log.Warn("jobs that were running when the queen stopped are queued again", "jobs", n)
	}
	if err := s.removeUnfinished(ctx); err != nil {
		return err
	}
	s.endRecovery(nil)
	if err := s.endAllQueued(ctx); err != nil {
		return err
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	finishing := map[string]bool{} // batches being finalized; owned by this loop
	finished := make(chan string)
	finishAll := func(ids []string) {
		for _, id := range ids {
			if finishing[id] {
				continue
			}
			finishing[id] = true
			wg.Go(func() {
				if err := s.finalize(ctx, id); err != nil && ctx.Err() == nil {
					s.log.Error("cannot finish a batch; will retry", "batch_id", id, "err", err)
				}
				select {
				case finished <- id:
				case <-ctx.Done():
				}
			})
		}
	}
	finishAll(s.settledBatches(ctx))
	// The writer of the jobs' ends; it stops once every job is done
	// (deferred after wg.Wait, so it runs before it).
	stopWriter := make(chan struct{})
	wg.Go(func() { s.writeEnds(stopWriter) })
	defer close(stopWriter)
	paused := map[string]time.Time{} // by model: no job taken before
	perBatch := map[string]int{}     // jobs under way, by batch
	running := 0
	// drained: the last fill found fewer queued jobs than it asked for;
	// none is taken again until a job may have been queued (a wake, a job
	// back in the queue, the resync tick).
	drained := false
	// Jobs are taken in groups of at least group (one transaction for
	// them all) while others are under way: the router's batch queue
	// holds enough for the slots meanwhile.
	group := max(1, s.cfg.Concurrency/8)
	tick := time.NewTicker(resync)
	defer tick.Stop()
	lastSweep := time.Time{}
	for {
		if ctx.Err() != nil {
			// Stopping: the jobs under way end at once (queued again).
			if running == 0 {
				return nil
			}
			<-s.done
			running--
			continue
		}
		if free := s.cfg.Concurrency - running; !drained && free > 0 && (free >= group || running == 0) {
			now := time.Now()
			maps.DeleteFunc(paused, func(_ string, until time.Time) bool { return !now.Before(until) })
			taken := s.fill(ctx, &wg, free, slices.Collect(maps.Keys(paused)), perBatch)
			for _, j := range taken {
				perBatch[j.BatchID]++
			}
			running += len(taken)
			drained = len(taken) < free
		}
		select {
		case <-ctx.Done():
		case <-s.wake:
			drained = false
		case id := <-s.cancelled:
			// A batch cancelled with none of its jobs under way (one
			// queued behind an older batch) ends now, not when the queen
			// restarts.
			if perBatch[id] <= 0 {
				if settled, err := s.settled(ctx, id); err == nil && settled {
					finishAll([]string{id})
				}
			}
		case id := <-finished:
			delete(finishing, id)
			s.ended(id)
		case d := <-s.done:
			running--
			b := d.job.BatchID
			if perBatch[b]--; perBatch[b] <= 0 {
				delete(perBatch, b)
			}
			if d.pause > 0 {
				paused[d.job.ModelRef] = time.Now().Add(d.pause)
			}
			if d.job.State == string(JobQueued) {
				drained = false
			} else if perBatch[b] == 0 && ctx.Err() == nil {
				// The batch's last job under way ended: it may be settled
				// (the store says whether any is still queued).
				if settled, err := s.settled(ctx, b); err == nil && settled {
					finishAll([]string{b})
				}
			}
		case <-tick.C:
			drained = false
			finishAll(s.expire(ctx))
			if time.Since(lastSweep) >= sweepEvery {
				lastSweep = time.Now()
				s.sweep(ctx)
				if err := s.endAllQueued(ctx); err != nil && ctx.Err() == nil {
					s.log.Error("cannot end the queued jobs of cancelled and expired batches; will retry", "err", err)
				}
				// Active batches whose jobs all ended that nothing else
				// finished (a cancel the channel had no room for).
				for _, id := range s.settledBatches(ctx) {
					if perBatch[id] <= 0 {
						finishAll([]string{id})
					}
				}
			}
		}
	}
}

// endRecovery lets creations go on, once: with err, they are refused.
func (s *Service) endRecovery(err error) {
	s.recoverOnce.Do(func() {
		if err != nil {
			s.recoverErr = fmt.Errorf("the batch service did not start: %w", err)
		}
		close(s.recovered)
	})
}

// requeue queues again the jobs that were running: the queen stopped
// (or died) while they ran, and their answers are lost.
func (s *Service) requeue(ctx context.Context) (int, error) {
	var n int
	err := s.st.Update(ctx, func(tx *store.Tx) (err error) {
		n, err = tx.RequeueBatchJobs(string(JobRunning), string(JobQueued), time.Now())
		return err
	})
	return n, err
}

// removeUnfinished removes the batches whose creation the queen's end
// cut short (still validating: their clients were never answered), with
// the jobs they had written.
func (s *Service) removeUnfinished(ctx context.Context) error {
	var bs []store.Batch
	if err := s.st.View(ctx, func(tx *store.Tx) (err error) {
		bs, err = tx.Batches("", listAll, string(StatusValidating))
		return err
	}); err != nil {
		return err
	}
	for _, b := range bs {
		if err := s.removeBatch(ctx, b.ID); err != nil {
			return err
		}
		s.log.Warn("removed a batch whose creation the queen's end cut short; its client was never answered and may create it again", "batch_id", b.ID)
	}
	return nil
}

// fill takes up to free queued jobs (none of a paused model) in one
// transaction and starts them; it returns the jobs it started. The
// batches in progress share the free places fairly: those with the
// fewest jobs under way (perBatch) get them first, oldest first among
// equals, so a batch created behind a large one starts at once instead
// of waiting for it to end.
func (s *Service) fill(ctx context.Context, wg *sync.WaitGroup, free int, paused []string, perBatch map[string]int) []store.BatchJob {
	var taken []store.BatchJob
	endpoints := map[string]string{}
	err := s.st.Update(ctx, func(tx *store.Tx) error {
		taken = taken[:0]
		bs, err := tx.Batches("", listAll, string(StatusInProgress))
		if err != nil {
			return err
		}
		slices.Reverse(bs) // oldest first
		ids := make([]string, 0, len(bs))
		under := make([]int, 0, len(bs))
		for _, b := range bs {
			if b.ExpiredAt != nil {
				continue
			}
			ids = append(ids, b.ID)
			under = append(under, perBatch[b.ID])
			endpoints[b.ID] = b.Endpoint
		}
		// Rounds: a batch that had fewer queued jobs than its share is out
		// of the next round, whose shares split what it left.
		open := slices.Repeat([]bool{true}, len(ids))
		for left := free; left > 0; {
			shares := fairShares(left, under, open)
			got := 0
			for i, n := range shares {
				if n == 0 {
					continue
				}
				jobs, err := tx.ClaimBatchJobs(ids[i], string(JobQueued), string(JobRunning), n, time.Now(), paused...)
				if err != nil {
					return err
				}
				taken = append(taken, jobs...)
				under[i] += len(jobs)
				got += len(jobs)
				if len(jobs) < n {
					open[i] = false
				}
			}
			if got == 0 {
				break
			}
			left -= got
		}
		return nil
	})
	if err != nil {
		if ctx.Err() == nil {
			s.log.Error("cannot take queued jobs; will retry", "err", err)
		}
		return nil
	}
	for _, j := range taken {
		endpoint := endpoints[j.BatchID]
		wg.Go(func() {
			d := s.runJob(ctx, j, endpoint)
			s.done <- d // the loop receives until every job it started is done
		})
	}
	return taken
}

// listAll bounds the batches one read of those of a status lists.
const listAll = 10000

// fairShares splits free places among the batches still open (open[i]):
// one at a time to the batch with the fewest jobs under way (under[i]
// plus what it got so far), the first such one on a tie. It returns each
// batch's share; pure.
func fairShares(free int, under []int, open []bool) []int {
	shares := make([]int, len(under))
	for range free {
		best := -1
		for i := range under {
			if open[i] && (best < 0 || under[i]+shares[i] < under[best]+shares[best]) {
				best = i
			}
		}
		if best < 0 {
			break
		}
		shares[best]++
	}
	return shares
}

// jobEnd is a job's attempt, ended, on its way to the store.
type jobEnd struct {
	// next is the job as it ends; the writer sets the state it was
	// written with before it sends on written.
	next    store.BatchJob
	written chan error // buffered 1: nil once committed
}

// maxEndGroup bounds the jobs' ends written in one transaction.
const maxEndGroup = 256

// writeEnds writes the jobs' ends until stop is closed: each transaction
// takes every end that arrived while the one before was written (group
// commit: no end waits longer than one transaction, and none is reported
// written before its transaction committed).
func (s *Service) writeEnds(stop <-chan struct{}) {
	var group []*jobEnd
	for {
		select {
		case <-stop:
			return
		case e := <-s.ends:
			group = append(group[:0], e)
		}
	more:
		for len(group) < maxEndGroup {
			select {
			case e := <-s.ends:
				group = append(group, e)
			default:
				break more
			}
		}
		errs := s.writeGroup(group)
		for i, e := range group {
			e.written <- errs[i]
		}
		clear(group)
	}
}

// writeGroup writes the ends of group in one transaction and returns
// each one's error.
func (s *Service) writeGroup(group []*jobEnd) []error {
	ctx, cancel := context.WithTimeout(context.Background(), writeTimeout)
	defer cancel()
	jobs := make([]store.BatchJob, len(group))
	var errs []error
	err := s.st.Update(ctx, func(tx *store.Tx) error {
		batches := map[string]store.Batch{}
		for i, e := range group {
			next := e.next
			if next.State == string(JobQueued) {
				// A job goes back to the queue only while its batch runs:
				// a batch cancelled or expired meanwhile has no queue.
				b, ok := batches[next.BatchID]
				if !ok {
					var err error
					if b, err = tx.Batch(next.BatchID); err != nil {
						return err
					}
					batches[next.BatchID] = b
				}
				switch {
				case Status(b.Status) == StatusCancelling:
					next.State = string(JobCancelled)
				case b.ExpiredAt != nil:
					next.State = string(JobFailed)
				}
			}
			jobs[i] = next
		}
		var err error
		errs, err = tx.UpdateBatchJobs(jobs, string(JobRunning))
		return err
	})
	if err != nil {
		errs = make([]error, len(group))
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	for i := range group {
		group[i].next = jobs[i]
	}
	return errs
}

// runJob sends a job's request and writes how it ended. When its batch
// is cancelled or expires (the withdrawal ends), the request leaves the
// routing's queue if it still waits for a slot, and is cancelled at its
// worker if it runs: either way it ends at once (routing.ErrWithdrawn).
func (s *Service) runJob(ctx context.Context, j store.BatchJob, endpoint string) jobDone {
	withdraw, done := s.withdrawalOf(j.BatchID)
	jctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(withdraw, func() { cancel(routing.ErrWithdrawn) })
	ans, err := s.cfg.Router.Serve(jctx, withdraw, endpoint, []byte(j.Body),
		routing.BatchLimits{Timeout: s.cfg.AttemptTimeout, MaxAnswerBytes: s.cfg.MaxAnswerBytes})
	stop()
	if err != nil && ctx.Err() == nil && errors.Is(context.Cause(jctx), routing.ErrWithdrawn) && !errors.Is(err, routing.ErrWithdrawn) {
		err = fmt.Errorf("%w: %w", routing.ErrWithdrawn, err)
	}
	cancel(nil)
	done()
	next, pause := decide(j, ans, err, ctx.Err() != nil, s.cfg)
	next.UpdatedAt = time.Now()
	e := &jobEnd{next: next, written: make(chan error, 1)}
	s.ends <- e // the writer runs until every job is done
	if werr := <-e.written; werr != nil {
		// The job stays running in the store: the next start of the
		// queen queues it again.
		s.log.Error("cannot write the end of a job", "batch_id", j.BatchID, "line", j.Line, "err", werr)
		return jobDone{job: j}
	}
	next = e.next
	lvl := s.log.Debug
	if next.State == string(JobFailed) || (next.State == string(JobQueued) && pause == 0 && err != nil && ctx.Err() == nil && !errors.Is(err, routing.ErrPreempted)) {
		lvl = s.log.Warn
	}
	lvl("job attempt ended", "batch_id", j.BatchID, "line", j.Line, "custom_id", j.CustomID, "state", next.State,
		"attempts", next.Attempts, "lifecycle_id", next.LifecycleID, "preempted", errors.Is(err, routing.ErrPreempted), "err", err)
	return jobDone{job: next, pause: pause}
}

// decide is what one attempt makes of its job, pure: the worker's
// answer ends it (succeeded with a 200, failed with the worker's 4xx
// error, both in its result line); a worker that failed before it
// answered (routing.AttemptError) queues it again while it has attempts
// left, else fails it; an attempt past the queen's limits
// (routing.LimitError: its deadline, the answer's size) fails it; a
// request the routing refused as the client's fault (4xx: unknown
// model, invalid body) fails it; anything else (no
// capacity now, the queue full, the queen stopping, an interactive
// request that took its slot) is no attempt: the job is queued again,
// and pause says how long its model waits.
func decide(j store.BatchJob, ans routing.Answer, err error, stopping bool, cfg Config) (store.BatchJob, time.Duration) {
	next := j
	var ae *routing.AttemptError
	var le *routing.LimitError
	switch {
	case err == nil:
		next.LifecycleID = ans.LifecycleID
		next.State = string(JobSucceeded)
		if ans.Status != http.StatusOK {
			next.State = string(JobFailed)
		}
		next.Result = resultLine(j, &ResultResponse{StatusCode: ans.Status, RequestID: requestID(j), Body: jsonBody(ans.Body)}, nil)
		return next, 0
	case stopping, errors.Is(err, routing.ErrPreempted), errors.Is(err, routing.ErrWithdrawn):
		// Not the worker's fault: queued again, the attempt not counted
		// (a withdrawn job's batch has no queue: the write ends it).
		next.State, next.Attempts = string(JobQueued), max(j.Attempts-1, 0)
		return next, 0
	case errors.As(err, &le):
		// Another attempt would run as long, or answer as much.
		next.LifecycleID, next.State = le.LifecycleID, string(JobFailed)
		e := &ResultError{Code: "attempt_timeout", Message: fmt.Sprintf("the request ran past the queen's limit of %s an attempt (--batch-attempt-timeout) on worker %s and was cancelled; ask for less (max_tokens) or raise the limit",
			cfg.AttemptTimeout, le.LifecycleID)}
		if errors.Is(le, routing.ErrAnswerTooLarge) {
			e = &ResultError{Code: "answer_too_large", Message: fmt.Sprintf("worker %s's answer is larger than the queen's limit of %d bytes (--batch-max-answer-bytes) and was cut off; ask for less or raise the limit",
				le.LifecycleID, cfg.MaxAnswerBytes)}
		}
		next.Result = resultLine(j, nil, e)
		return next, 0
	case errors.As(err, &ae):
		next.LifecycleID = ae.LifecycleID
		if j.Attempts < cfg.MaxAttempts {
			next.State = string(JobQueued)
			return next, 0
		}
		next.State = string(JobFailed)
		next.Result = resultLine(j, nil, &ResultError{Code: "worker_failed",
			Message: fmt.Sprintf("the request failed on %d attempts; the last: %v", j.Attempts, ae)})
		return next, 0
	}
	oe := openai.AsError(err)
	if st := oe.HTTPStatus(); st >= 400 && st < 500 && st != http.StatusTooManyRequests {
		next.State = string(JobFailed)
		next.Result = resultLine(j, nil, &ResultError{Code: oe.Code, Message: oe.Message})
		return next, 0
	}
	next.State, next.Attempts = string(JobQueued), max(j.Attempts-1, 0)
	pause := resync
	if oe.RetryAfter > 0 {
		pause = oe.RetryAfter
	}
	return next, pause
}

func requestID(j store.BatchJob) string { return fmt.Sprintf("req_%s_%d", j.BatchID, j.Line) }

// jsonBody is a worker's answer as JSON (a string when it is not).
func jsonBody(b []byte) json.RawMessage {
	if json.Valid(b) {
		return b
	}
	s, _ := json.Marshal(string(b))
	return s
}

// resultLine is a job's line of the output or error file.
func resultLine(j store.BatchJob, resp *ResultResponse, e *ResultError) string {
	b, _ := json.Marshal(ResultLine{ID: fmt.Sprintf("batch_req_%s_%d", j.BatchID, j.Line), CustomID: j.CustomID, Response: resp, Error: e})
	return string(b)
}

// settled reports whether no job of the batch is queued or running.
func (s *Service) settled(ctx context.Context, id string) (bool, error) {
	var c Counts
	err := s.st.View(ctx, func(tx *store.Tx) error {
		byState, err := tx.BatchJobCounts(id)
		c = countJobs(0, byState)
		return err
	})
	return c.Settled(), err
}

// settledBatches returns the active batches (in progress, finalizing,
// cancelling) whose jobs have all ended: after a restart, those whose
// files were not written yet.
func (s *Service) settledBatches(ctx context.Context) []string {
	var out []string
	err := s.st.View(ctx, func(tx *store.Tx) error {
		bs, err := tx.Batches("", listAll, activeStatuses...)
		if err != nil {
			return err
		}
		for _, b := range bs {
			byState, err := tx.BatchJobCounts(b.ID)
			if err != nil {
				return err
			}
			if countJobs(0, byState).Settled() {
				out = append(out, b.ID)
			}
		}
		return nil
	})
	if err != nil && ctx.Err() == nil {
		s.log.Error("cannot read the active batches", "err", err)
	}
	return out
}
