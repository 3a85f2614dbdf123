package batch

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/apiary-llm/apiary/internal/store"
)

// finalize writes the output and error files of a batch whose jobs have
// all ended, then ends it (completed, expired or cancelled) with its
// audit entry. Each job's line is written once: the files are made from
// the job rows, in line order, under ids that are the batch's own, so a
// finalize cut short by a crash writes the same files again.
func (s *Service) finalize(ctx context.Context, id string) error {
	var b store.Batch
	var from Status
	ready := false
	err := s.st.Update(ctx, func(tx *store.Tx) error {
		var err error
		if b, err = tx.Batch(id); err != nil {
			return err
		}
		from = Status(b.Status)
		if !isActive(from) {
			return nil
		}
		byState, err := tx.BatchJobCounts(id)
		if err != nil || !countJobs(0, byState).Settled() {
			return err
		}
		ready = true
		if from != StatusInProgress {
			return nil
		}
		now := time.Now()
		b.Status, b.FinalizingAt = string(StatusFinalizing), &now
		from = StatusFinalizing
		return tx.UpdateBatch(b, string(StatusInProgress))
	})
	if err != nil || !ready {
		return err
	}
	out, errs, c, err := s.writeResults(ctx, b)
	if err != nil {
		return err
	}
	kept := []*store.BatchFile{}
	for _, f := range []*store.BatchFile{out, errs} {
		if f != nil {
			kept = append(kept, f)
		}
	}
	defer func() {
		for _, f := range kept {
			os.Remove(s.files.temp(f.ID))
		}
	}()
	for _, f := range kept {
		if err := s.files.place(f.ID); err != nil {
			return err
		}
	}
	end := endOf(from, b.ExpiredAt != nil)
	err = s.st.Update(ctx, func(tx *store.Tx) error {
		now := time.Now()
		for _, f := range kept {
			if err := tx.DeleteBatchFile(f.ID); err != nil && !errors.Is(err, store.ErrNotFound) {
				return err
			}
			if err := tx.PutBatchFile(*f); err != nil {
				return err
			}
			if err := s.files.put(tx, f.ID); err != nil {
				return err
			}
		}
		if out != nil {
			b.OutputFileID = out.ID
		}
		if errs != nil {
			b.ErrorFileID = errs.ID
		}
		b.Status = string(end)
		switch end {
		case StatusCancelled:
			b.CancelledAt = &now
		case StatusCompleted:
			b.CompletedAt = &now
		}
		if err := tx.UpdateBatch(b, string(from)); err != nil {
			return err
		}
		_, err := tx.Append(store.AuditEntry{Actor: "queen", Action: "batch." + string(end), Target: id,
			Reason: fmt.Sprintf("%d requests: %d succeeded, %d failed, %d cancelled", c.Total, c.Completed, c.Failed-c.Cancelled, c.Cancelled),
			Metadata: map[string]any{"total": c.Total, "succeeded": c.Completed, "failed": c.Failed - c.Cancelled, "cancelled": c.Cancelled,
				"output_file_id": b.OutputFileID, "error_file_id": b.ErrorFileID}})
		return err
	})
	if err == nil {
		// Logged once committed: a client that reads the batch after this
		// line sees it ended.
		s.log.Info("batch ended", "batch_id", id, "status", string(end), "succeeded", c.Completed, "failed", c.Failed)
	}
	return err
}

// writeResults writes a settled batch's files: the succeeded jobs' lines
// to the output file, the others' to the error file (a job cancelled or
// expired before it ran gets its line here). A file with no line is not
// made (nil).
func (s *Service) writeResults(ctx context.Context, b store.Batch) (out, errs *store.BatchFile, c Counts, err error) {
	suffix := strings.TrimPrefix(b.ID, "batch_")
	outF, err := newResultFile(s.cfg.Dir, "file-"+suffix+"-output", s.files.temp)
	if err != nil {
		return nil, nil, c, err
	}
	defer outF.abort()
	errF, err := newResultFile(s.cfg.Dir, "file-"+suffix+"-errors", s.files.temp)
	if err != nil {
		return nil, nil, c, err
	}
	defer errF.abort()
	after := 0
	for {
		var jobs []store.BatchJob
		if err := s.st.View(ctx, func(tx *store.Tx) (err error) {
			// A page holds at most resultPage answers (each bounded by
			// MaxAnswerBytes), not the bodies.
			jobs, err = tx.BatchJobResults(b.ID, after, resultPage)
			return err
		}); err != nil {
			return nil, nil, c, err
		}
		if len(jobs) == 0 {
			break
		}
		for _, j := range jobs {
			after = j.Line
			c.Total++
			line, f := j.Result, errF
			switch JobState(j.State) {
			case JobSucceeded:
				f = outF
				c.Completed++
			case JobCancelled:
				c.Cancelled++
				c.Failed++
				if line == "" {
					line = resultLine(j, nil, &ResultError{Code: "batch_cancelled", Message: "the batch was cancelled before this request ran"})
				}
			default:
				c.Failed++
				if line == "" {
					line = resultLine(j, nil, &ResultError{Code: "batch_expired", Message: "the batch's completion window (24h) passed before this request ran"})
				}
			}
			if err := f.line(line); err != nil {
				return nil, nil, c, err
			}
		}
	}
	now := time.Now()
	if out, err = outF.keep(b.ID, PurposeBatchOutput, "-output", now, s.expiry(now)); err != nil {
		return nil, nil, c, err
	}
	if errs, err = errF.keep(b.ID, PurposeBatchError, "-errors", now, s.expiry(now)); err != nil {
		return nil, nil, c, err
	}
	return out, errs, c, nil
}

// resultPage bounds the jobs' result lines writeResults reads at once.
const resultPage = 200

// resultFile is an output or error file being written, to its
// temporary file (contents.temp); kept by finalize (contents.place, put).
type resultFile struct {
	id    string
	tmp   string
	f     *os.File
	w     *bufio.Writer
	lines int
	bytes int64
}

func newResultFile(dir, id string, temp func(string) string) (*resultFile, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("files dir: %w", err)
	}
	tmp := temp(id)
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, fmt.Errorf("write results: %w", err)
	}
	return &resultFile{id: id, tmp: tmp, f: f, w: bufio.NewWriterSize(f, 64<<10)}, nil
}

func (r *resultFile) line(s string) error {
	r.lines++
	r.bytes += int64(len(s)) + 1
	_, err := r.w.WriteString(s + "\n")
	return err
}

// keep finishes the written file and returns its row; nil when it has no
// line (its temporary file is removed then).
func (r *resultFile) keep(batchID, purpose, suffix string, now time.Time, expires *time.Time) (*store.BatchFile, error) {
	if r.lines == 0 {
		return nil, nil
	}
	if err := r.w.Flush(); err != nil {
		return nil, fmt.Errorf("write results: %w", err)
	}
	if err := r.f.Sync(); err != nil {
		return nil, fmt.Errorf("write results: %w", err)
	}
	if err := r.f.Close(); err != nil {
		return nil, fmt.Errorf("write results: %w", err)
	}
	r.f = nil
	return &store.BatchFile{ID: r.id, Purpose: purpose, Filename: batchID + suffix + ".jsonl", Bytes: r.bytes, CreatedAt: now, ExpiresAt: expires}, nil
}

// abort removes a file that was not kept.
func (r *resultFile) abort() {
	if r.f != nil {
		r.f.Close()
		os.Remove(r.tmp)
	}
}

// expire marks the batches in progress whose completion window passed
// (the dispatcher takes none of their jobs from then on): their queued
// jobs fail (batch_expired, a chunk a transaction), and those the
// dispatcher took are cancelled where they are (OpenAI cancels a
// batch's unfinished requests when it expires). It returns the batches
// whose jobs have all ended.
func (s *Service) expire(ctx context.Context) []string {
	now := time.Now()
	var ids []string
	err := s.st.Update(ctx, func(tx *store.Tx) error {
		bs, err := tx.Batches("", listAll, string(StatusInProgress))
		if err != nil {
			return err
		}
		for _, b := range bs {
			if b.ExpiredAt != nil || now.Before(b.ExpiresAt) {
				continue
			}
			b.ExpiredAt = &now
			if err := tx.UpdateBatch(b, string(StatusInProgress)); err != nil {
				return err
			}
			byState, err := tx.BatchJobCounts(b.ID)
			if err != nil {
				return err
			}
			n := byState[string(JobQueued)]
			if _, err := tx.Append(store.AuditEntry{Actor: "queen", Action: "batch.expiring", Target: b.ID,
				Reason: fmt.Sprintf("its completion window (%s) passed: %d queued requests failed", b.CompletionWindow, n)}); err != nil {
				return err
			}
			ids = append(ids, b.ID)
		}
		return nil
	})
	if err != nil {
		if ctx.Err() == nil {
			s.log.Error("cannot expire batches; will retry", "err", err)
		}
		return nil
	}
	var settled []string
	for _, id := range ids {
		s.withdraw(id)
		if err := s.endQueued(ctx, id, JobFailed); err != nil {
			if ctx.Err() == nil {
				s.log.Error("cannot fail an expired batch's queued jobs; will retry", "batch_id", id, "err", err)
			}
			continue
		}
		if ok, err := s.settled(ctx, id); err == nil && ok {
			settled = append(settled, id)
		}
	}
	return settled
}

// sweep removes the files past their expires_at and the ended batches
// (with their jobs) created longer than FileRetention ago.
func (s *Service) sweep(ctx context.Context) {
	if s.cfg.FileRetention <= 0 {
		return
	}
	now := time.Now()
	var files, batches []string
	err := s.st.Update(ctx, func(tx *store.Tx) error {
		var err error
		if files, err = tx.ExpiredBatchFiles(now, 1000); err != nil {
			return err
		}
		for _, id := range files {
			if err := tx.DeleteBatchFile(id); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		files = nil
	}
	for _, id := range files {
		if err := s.files.removed(id); err != nil {
			s.log.Warn("cannot remove an expired file's bytes", "file_id", id, "err", err)
		}
	}
	if err == nil {
		err = s.st.View(ctx, func(tx *store.Tx) (err error) {
			batches, err = tx.BatchesCreatedBefore(now.Add(-s.cfg.FileRetention), 1000,
				string(StatusCompleted), string(StatusFailed), string(StatusCancelled), string(StatusExpired))
			return err
		})
	}
	removed := 0
	for _, id := range batches {
		// A chunk of jobs a transaction: a batch's 50 000 rows in one
		// would hold the store's write lock for seconds.
		if err = s.removeBatch(ctx, id); err != nil {
			break
		}
		removed++
	}
	if err != nil && ctx.Err() == nil {
		s.log.Error("cannot remove expired files and batches; will retry", "err", err)
	}
	if len(files)+removed > 0 {
		s.log.Info("removed expired files and batches", "files", len(files), "batches", removed)
	}
}
