package store

import (
	"context"
	"fmt"
	"time"

	"github.com/apiary-llm/apiary/internal/lifecycle"
)

// Retention says how long the store keeps what only grows: audit entries
// and ended lifecycle rows. A zero age keeps them forever.
type Retention struct {
	// Audit: entries older than this are removed.
	Audit time.Duration
	// Rows: STOPPED and FAILED rows that ended longer ago than this are
	// removed (by stopped_at, or created_at when a row never stopped
	// cleanly). Live rows are never removed.
	Rows time.Duration
	// Interval is how often the store prunes, after once at Open;
	// default DefaultPruneInterval.
	Interval time.Duration
}

// DefaultPruneInterval is how often the store prunes.
const DefaultPruneInterval = time.Hour

// pruneBatch bounds one prune transaction, so that a large backlog never
// holds the database long: the rest waits for the next batch.
const pruneBatch = 1000

func (r Retention) enabled() bool { return r.Audit > 0 || r.Rows > 0 }

// Pruned is what one Prune removed.
type Pruned struct {
	Audit     int // audit entries
	Rows      int // ended lifecycle rows
	Responses int // kept responses of the Responses API, as old as those rows
}

// Prune removes audit entries with ts before auditBefore and ended
// (STOPPED, FAILED) rows that ended before rowsBefore, pruneBatch at a
// time, each batch its own transaction. A zero time prunes nothing of its
// kind. It stops between batches when ctx ends, returning what it removed.
func (s *Store) Prune(ctx context.Context, auditBefore, rowsBefore time.Time) (Pruned, error) {
	var p Pruned
	if !auditBefore.IsZero() {
		n, err := s.pruneBatches(ctx, `DELETE FROM audit_log WHERE id IN
			(SELECT id FROM audit_log WHERE ts < ? ORDER BY ts LIMIT ?)`, micros(auditBefore))
		p.Audit = n
		if err != nil {
			return p, fmt.Errorf("prune audit log: %w", err)
		}
	}
	if !rowsBefore.IsZero() {
		n, err := s.pruneBatches(ctx, `DELETE FROM workers WHERE id IN
			(SELECT id FROM workers WHERE status IN (?, ?) AND COALESCE(stopped_at, created_at) < ? LIMIT ?)`,
			string(lifecycle.StatusStopped), string(lifecycle.StatusFailed), micros(rowsBefore))
		p.Rows = n
		if err != nil {
			return p, fmt.Errorf("prune ended worker rows: %w", err)
		}
		n, err = s.pruneBatches(ctx, `DELETE FROM responses WHERE id IN
			(SELECT id FROM responses WHERE created_at < ? LIMIT ?)`, micros(rowsBefore))
		p.Responses = n
		if err != nil {
			return p, fmt.Errorf("prune kept responses: %w", err)
		}
	}
	return p, nil
}

// pruneBatches runs query (whose last argument is the batch size) until a
// batch removes fewer than pruneBatch, and returns how many it removed.
func (s *Store) pruneBatches(ctx context.Context, query string, args ...any) (int, error) {
	total := 0
	for {
		var n int64
		err := s.Update(ctx, func(tx *Tx) error {
			res, err := tx.exec(query, append(args, pruneBatch)...)
			if err != nil {
				return err
			}
			n, err = res.RowsAffected()
			return err
		})
		if err != nil {
			return total, err
		}
		total += int(n)
		if n < pruneBatch {
			return total, nil
		}
	}
}

// runRetention prunes once now, then every r.Interval, until ctx ends.
func (s *Store) runRetention(ctx context.Context, r Retention) {
	every := r.Interval
	if every <= 0 {
		every = DefaultPruneInterval
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		s.pruneOnce(ctx, r)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (s *Store) pruneOnce(ctx context.Context, r Retention) {
	now := time.Now()
	var auditBefore, rowsBefore time.Time
	if r.Audit > 0 {
		auditBefore = now.Add(-r.Audit)
	}
	if r.Rows > 0 {
		rowsBefore = now.Add(-r.Rows)
	}
	start := time.Now()
	p, err := s.Prune(ctx, auditBefore, rowsBefore)
	if err != nil && ctx.Err() == nil {
		s.log.Error("prune failed; will retry at the next interval", "err", err, "audit_removed", p.Audit, "rows_removed", p.Rows)
		return
	}
	if p.Audit > 0 || p.Rows > 0 || p.Responses > 0 {
		s.log.Info("pruned", "audit_removed", p.Audit, "rows_removed", p.Rows, "responses_removed", p.Responses,
			"audit_retention", r.Audit, "rows_retention", r.Rows, "took", time.Since(start).Round(time.Millisecond))
	}
}
