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
func (s *Service) Run(ctx context.Context) error {
	n, err := s.requeue(ctx)
	if err != nil {
		return err
	}
	if n > 0 {
		s.log.Warn("jobs that were running when the queen stopped are queued again", "jobs", n)
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
	paused := map[string]time.Time{} // by model: no job taken before
	endpoints := map[string]string{} // by batch
	running := 0
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
		now := time.Now()
		maps.DeleteFunc(paused, func(_ string, until time.Time) bool { return !now.Before(until) })
		running += s.fill(ctx, &wg, s.cfg.Concurrency-running, slices.Collect(maps.Keys(paused)), endpoints)
		select {
		case <-ctx.Done():
		case <-s.wake:
		case id := <-finished:
			delete(finishing, id)
			delete(endpoints, id)
		case d := <-s.done:
			running--
			if d.pause > 0 {
				paused[d.job.ModelRef] = time.Now().Add(d.pause)
			}
			if d.job.State != string(JobQueued) && ctx.Err() == nil {
				if settled, err := s.settled(ctx, d.job.BatchID); err == nil && settled {
					finishAll([]string{d.job.BatchID})
				}
			}
		case <-tick.C:
			finishAll(s.expire(ctx))
			if time.Since(lastSweep) >= sweepEvery {
				lastSweep = time.Now()
				s.sweep(ctx)
			}
		}
	}
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

// fill takes up to free queued jobs (none of a paused model) and starts
// them; it returns how many it started.
func (s *Service) fill(ctx context.Context, wg *sync.WaitGroup, free int, paused []string, endpoints map[string]string) int {
	if free <= 0 {
		return 0
	}
	var taken []store.BatchJob
	now := time.Now()
	err := s.st.Update(ctx, func(tx *store.Tx) error {
		taken = taken[:0]
		jobs, err := tx.BatchJobsIn(string(JobQueued), free, paused...)
		if err != nil {
			return err
		}
		for _, j := range jobs {
			if _, ok := endpoints[j.BatchID]; !ok {
				b, err := tx.Batch(j.BatchID)
				if err != nil {
					return err
				}
				endpoints[j.BatchID] = b.Endpoint
			}
			j.Attempts++
			j.State, j.UpdatedAt = string(JobRunning), now
			if err := tx.UpdateBatchJob(j, string(JobQueued)); err != nil {
				return err
			}
			taken = append(taken, j)
		}
		return nil
	})
	if err != nil {
		if ctx.Err() == nil {
			s.log.Error("cannot take queued jobs; will retry", "err", err)
		}
		return 0
	}
	for _, j := range taken {
		endpoint := endpoints[j.BatchID]
		wg.Go(func() {
			d := s.runJob(ctx, j, endpoint)
			s.done <- d // the loop receives until every job it started is done
		})
	}
	return len(taken)
}

// runJob sends a job's request and writes how it ended.
func (s *Service) runJob(ctx context.Context, j store.BatchJob, endpoint string) jobDone {
	ans, err := s.cfg.Router.Serve(ctx, endpoint, []byte(j.Body))
	next, pause := decide(j, ans, err, ctx.Err() != nil, s.cfg.MaxAttempts)
	next.UpdatedAt = time.Now()
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
	defer cancel()
	werr := s.st.Update(wctx, func(tx *store.Tx) error {
		if next.State == string(JobQueued) {
			// A job goes back to the queue only while its batch runs: a
			// batch cancelled or expired meanwhile has no queue.
			b, err := tx.Batch(j.BatchID)
			if err != nil {
				return err
			}
			switch {
			case Status(b.Status) == StatusCancelling:
				next.State = string(JobCancelled)
			case b.ExpiredAt != nil:
				next.State = string(JobFailed)
			}
		}
		return tx.UpdateBatchJob(next, string(JobRunning))
	})
	if werr != nil {
		// The job stays running in the store: the next start of the
		// queen queues it again.
		s.log.Error("cannot write the end of a job", "batch_id", j.BatchID, "line", j.Line, "err", werr)
		return jobDone{job: j}
	}
	lvl := s.log.Debug
	if next.State == string(JobFailed) || (next.State == string(JobQueued) && pause == 0 && err != nil && ctx.Err() == nil) {
		lvl = s.log.Warn
	}
	lvl("job attempt ended", "batch_id", j.BatchID, "line", j.Line, "custom_id", j.CustomID, "state", next.State,
		"attempts", next.Attempts, "lifecycle_id", next.LifecycleID, "err", err)
	return jobDone{job: next, pause: pause}
}

// decide is what one attempt makes of its job, pure: the worker's
// answer ends it (succeeded with a 200, failed with the worker's 4xx
// error, both in its result line); a worker that failed before it
// answered (routing.AttemptError) queues it again while it has attempts
// left, else fails it; a request the routing refused as the client's
// fault (4xx: unknown model, invalid body) fails it; anything else (no
// capacity now, the queue full, the queen stopping) is no attempt: the
// job is queued again, and pause says how long its model waits.
func decide(j store.BatchJob, ans routing.Answer, err error, stopping bool, maxAttempts int) (store.BatchJob, time.Duration) {
	next := j
	var ae *routing.AttemptError
	switch {
	case err == nil:
		next.LifecycleID = ans.LifecycleID
		next.State = string(JobSucceeded)
		if ans.Status != http.StatusOK {
			next.State = string(JobFailed)
		}
		next.Result = resultLine(j, &ResultResponse{StatusCode: ans.Status, RequestID: requestID(j), Body: jsonBody(ans.Body)}, nil)
		return next, 0
	case stopping:
		next.State, next.Attempts = string(JobQueued), max(j.Attempts-1, 0)
		return next, 0
	case errors.As(err, &ae):
		next.LifecycleID = ae.LifecycleID
		if j.Attempts < maxAttempts {
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
		bs, err := tx.Batches("", MaxRequests, activeStatuses...)
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
