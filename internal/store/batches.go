package store

import (
	"cmp"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"
)

// BatchFile is a file of the OpenAI Batch API: the row says what it is;
// its bytes live in the database on PostgreSQL (PutBatchFileContent), in
// the queen's data dir on SQLite.
type BatchFile struct {
	ID        string
	Purpose   string // batch, batch_output, batch_error
	Filename  string
	Bytes     int64
	CreatedAt time.Time
	ExpiresAt *time.Time // nil: never
}

// Batch is one batch of the OpenAI Batch API. Status and the job states
// are the batch package's; the store keeps them as text.
type Batch struct {
	ID               string
	Endpoint         string
	InputFileID      string
	CompletionWindow string
	Status           string
	OutputFileID     string
	ErrorFileID      string
	Failure          string // why a batch failed or expired
	Metadata         map[string]string
	Total            int // requests (jobs)
	CreatedAt        time.Time
	ExpiresAt        time.Time
	InProgressAt     *time.Time
	FinalizingAt     *time.Time
	CompletedAt      *time.Time
	FailedAt         *time.Time
	ExpiredAt        *time.Time
	CancellingAt     *time.Time
	CancelledAt      *time.Time
}

// BatchJob is one request of a batch: its line in the input file.
type BatchJob struct {
	BatchID     string
	Line        int // 1-based, in the input file
	CustomID    string
	ModelRef    string
	Body        string // the request body
	State       string
	Attempts    int
	LifecycleID string // the worker of the last attempt
	Result      string // the job's one line of the output or error file
	UpdatedAt   time.Time
}

const batchFileCols = "id, purpose, filename, bytes, created_at, expires_at"

// PutBatchFile writes a new file row.
func (t *Tx) PutBatchFile(f BatchFile) error {
	_, err := t.exec("INSERT INTO batch_files ("+batchFileCols+") VALUES (?, ?, ?, ?, ?, ?)",
		f.ID, f.Purpose, f.Filename, f.Bytes, micros(f.CreatedAt), nullMicros(f.ExpiresAt))
	if err != nil {
		return fmt.Errorf("write file %s: %w", f.ID, err)
	}
	return nil
}

func scanBatchFile(sc scanner) (BatchFile, error) {
	var f BatchFile
	var created int64
	var expires sql.NullInt64
	if err := sc.Scan(&f.ID, &f.Purpose, &f.Filename, &f.Bytes, &created, &expires); err != nil {
		return f, err
	}
	f.CreatedAt, f.ExpiresAt = fromMicros(created), timePtr(expires)
	return f, nil
}

// BatchFile reads one file row; ErrNotFound when there is none.
func (t *Tx) BatchFile(id string) (BatchFile, error) {
	f, err := scanBatchFile(t.queryRow("SELECT "+batchFileCols+" FROM batch_files WHERE id = ?", id))
	if errors.Is(err, sql.ErrNoRows) {
		return f, fmt.Errorf("%w: file %s", ErrNotFound, id)
	}
	if err != nil {
		return f, fmt.Errorf("read file %s: %w", id, err)
	}
	return f, nil
}

// BatchFiles lists files, newest first: purpose "" for all, those older
// than the file after when it is not "", at most limit.
func (t *Tx) BatchFiles(purpose, after string, limit int) ([]BatchFile, error) {
	q, args := "SELECT "+batchFileCols+" FROM batch_files WHERE 1 = 1", []any{}
	if purpose != "" {
		q, args = q+" AND purpose = ?", append(args, purpose)
	}
	if after != "" {
		q += " AND (created_at, id) < (SELECT created_at, id FROM batch_files WHERE id = ?)"
		args = append(args, after)
	}
	return queryAll(t, "list files", scanBatchFile, q+" ORDER BY created_at DESC, id DESC LIMIT ?", append(args, limit)...)
}

// DeleteBatchFile removes a file row, and its content in the database
// (PutBatchFileContent) when it has any; ErrNotFound when there is no row.
func (t *Tx) DeleteBatchFile(id string) error {
	if _, err := t.exec("DELETE FROM batch_file_chunks WHERE file_id = ?", id); err != nil {
		return fmt.Errorf("delete the content of file %s: %w", id, err)
	}
	res, err := t.exec("DELETE FROM batch_files WHERE id = ?", id)
	if err != nil {
		return fmt.Errorf("delete file %s: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("%w: file %s", ErrNotFound, id)
	}
	return nil
}

// CountBatchFiles counts the files of purpose.
func (t *Tx) CountBatchFiles(purpose string) (int, error) {
	var n int
	if err := t.queryRow("SELECT COUNT(*) FROM batch_files WHERE purpose = ?", purpose).Scan(&n); err != nil {
		return 0, fmt.Errorf("count files: %w", err)
	}
	return n, nil
}

// ExpiredBatchFiles returns the ids of at most limit files whose
// expires_at is before.
func (t *Tx) ExpiredBatchFiles(before time.Time, limit int) ([]string, error) {
	return queryAll(t, "read expired files", scanID,
		"SELECT id FROM batch_files WHERE expires_at IS NOT NULL AND expires_at < ? ORDER BY expires_at LIMIT ?", micros(before), limit)
}

const batchCols = `id, endpoint, input_file_id, completion_window, status, output_file_id, error_file_id, failure, metadata, total,
	created_at, expires_at, in_progress_at, finalizing_at, completed_at, failed_at, expired_at, cancelling_at, cancelled_at`

func batchArgs(b Batch) ([]any, error) {
	meta, err := json.Marshal(b.Metadata)
	if err != nil {
		return nil, err
	}
	if b.Metadata == nil {
		meta = []byte("{}")
	}
	return []any{b.ID, b.Endpoint, b.InputFileID, b.CompletionWindow, b.Status, b.OutputFileID, b.ErrorFileID, b.Failure, string(meta), b.Total,
		micros(b.CreatedAt), micros(b.ExpiresAt), nullMicros(b.InProgressAt), nullMicros(b.FinalizingAt), nullMicros(b.CompletedAt),
		nullMicros(b.FailedAt), nullMicros(b.ExpiredAt), nullMicros(b.CancellingAt), nullMicros(b.CancelledAt)}, nil
}

// PutBatch writes a new batch row.
func (t *Tx) PutBatch(b Batch) error {
	args, err := batchArgs(b)
	if err == nil {
		_, err = t.exec("INSERT INTO batches ("+batchCols+") VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", args...)
	}
	if err != nil {
		return fmt.Errorf("write batch %s: %w", b.ID, err)
	}
	return nil
}

// UpdateBatch rewrites a batch row whose status is still from (the
// compare of a compare-and-set); ErrNotFound when none is.
func (t *Tx) UpdateBatch(b Batch, from string) error {
	args, err := batchArgs(b)
	if err != nil {
		return fmt.Errorf("update batch %s: %w", b.ID, err)
	}
	res, err := t.exec(`UPDATE batches SET endpoint = ?, input_file_id = ?, completion_window = ?, status = ?, output_file_id = ?,
		error_file_id = ?, failure = ?, metadata = ?, total = ?, created_at = ?, expires_at = ?, in_progress_at = ?, finalizing_at = ?,
		completed_at = ?, failed_at = ?, expired_at = ?, cancelling_at = ?, cancelled_at = ? WHERE id = ? AND status = ?`,
		append(args[1:], b.ID, from)...)
	if err != nil {
		return fmt.Errorf("update batch %s: %w", b.ID, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("%w: batch %s with status %s", ErrNotFound, b.ID, from)
	}
	return nil
}

func scanBatch(sc scanner) (Batch, error) {
	var b Batch
	var meta string
	var created, expires int64
	var inProgress, finalizing, completed, failed, expired, cancelling, cancelled sql.NullInt64
	if err := sc.Scan(&b.ID, &b.Endpoint, &b.InputFileID, &b.CompletionWindow, &b.Status, &b.OutputFileID, &b.ErrorFileID, &b.Failure,
		&meta, &b.Total, &created, &expires, &inProgress, &finalizing, &completed, &failed, &expired, &cancelling, &cancelled); err != nil {
		return b, err
	}
	if err := json.Unmarshal([]byte(meta), &b.Metadata); err != nil {
		return b, fmt.Errorf("metadata: %w", err)
	}
	b.CreatedAt, b.ExpiresAt = fromMicros(created), fromMicros(expires)
	b.InProgressAt, b.FinalizingAt, b.CompletedAt = timePtr(inProgress), timePtr(finalizing), timePtr(completed)
	b.FailedAt, b.ExpiredAt, b.CancellingAt, b.CancelledAt = timePtr(failed), timePtr(expired), timePtr(cancelling), timePtr(cancelled)
	return b, nil
}

// Batch reads one batch; ErrNotFound when there is none.
func (t *Tx) Batch(id string) (Batch, error) {
	b, err := scanBatch(t.queryRow("SELECT "+batchCols+" FROM batches WHERE id = ?", id))
	if errors.Is(err, sql.ErrNoRows) {
		return b, fmt.Errorf("%w: batch %s", ErrNotFound, id)
	}
	if err != nil {
		return b, fmt.Errorf("read batch %s: %w", id, err)
	}
	return b, nil
}

// Batches lists batches, newest first: those older than the batch after
// when it is not "", those with one of statuses when any is given, at
// most limit.
func (t *Tx) Batches(after string, limit int, statuses ...string) ([]Batch, error) {
	q, args := "SELECT "+batchCols+" FROM batches WHERE 1 = 1", []any{}
	if after != "" {
		q += " AND (created_at, id) < (SELECT created_at, id FROM batches WHERE id = ?)"
		args = append(args, after)
	}
	if len(statuses) > 0 {
		q += " AND status IN (?" + repeat(", ?", len(statuses)-1) + ")"
		for _, s := range statuses {
			args = append(args, s)
		}
	}
	return queryAll(t, "list batches", scanBatch, q+" ORDER BY created_at DESC, id DESC LIMIT ?", append(args, limit)...)
}

// batchCountLockKey is the transaction advisory lock that serializes,
// on PostgreSQL, the transactions that count batches to bound them
// ("batches" in ASCII).
const batchCountLockKey = 0x62617463686573

// LockBatchCount holds the count of batches and of batch files until the
// transaction ends: two transactions that each lock it, add a batch (or a
// file) and count (to refuse one past a bound) run one after the other, on every queen of the
// database, so they cannot both take the last place. SQLite's write
// transactions are serial already; on PostgreSQL a transaction advisory
// lock does it (READ COMMITTED would let each count without the other's
// row).
func (t *Tx) LockBatchCount() error {
	if t.s.dialect != Postgres {
		return nil
	}
	if _, err := t.tx.ExecContext(t.ctx, "SELECT pg_advisory_xact_lock($1)", int64(batchCountLockKey)); err != nil {
		return fmt.Errorf("lock the batches' count: %w", classifyPG(err))
	}
	return nil
}

// CountBatches counts the batches with one of statuses.
func (t *Tx) CountBatches(statuses ...string) (int, error) {
	args := make([]any, len(statuses))
	for i, s := range statuses {
		args[i] = s
	}
	var n int
	if err := t.queryRow("SELECT COUNT(*) FROM batches WHERE status IN (?"+repeat(", ?", len(statuses)-1)+")", args...).Scan(&n); err != nil {
		return 0, fmt.Errorf("count batches: %w", err)
	}
	return n, nil
}

func repeat(s string, n int) string {
	out := ""
	for range n {
		out += s
	}
	return out
}

// DeleteBatch removes a batch and its jobs.
func (t *Tx) DeleteBatch(id string) error {
	if _, err := t.exec("DELETE FROM batch_jobs WHERE batch_id = ?", id); err != nil {
		return fmt.Errorf("delete the jobs of batch %s: %w", id, err)
	}
	if _, err := t.exec("DELETE FROM batches WHERE id = ?", id); err != nil {
		return fmt.Errorf("delete batch %s: %w", id, err)
	}
	return nil
}

// DeleteBatchJobs removes at most limit jobs of a batch (those of its
// last lines first) and returns how many it removed: a batch's jobs are
// removed a bounded transaction at a time.
func (t *Tx) DeleteBatchJobs(batchID string, limit int) (int, error) {
	res, err := t.exec(`DELETE FROM batch_jobs WHERE (batch_id, line) IN
		(SELECT batch_id, line FROM batch_jobs WHERE batch_id = ? ORDER BY line DESC LIMIT ?)`, batchID, limit)
	if err != nil {
		return 0, fmt.Errorf("delete the jobs of batch %s: %w", batchID, err)
	}
	n, err := res.RowsAffected()
	return int(n), err
}

const batchJobCols = "batch_id, line, custom_id, model_ref, body, state, attempts, lifecycle_id, result, updated_at"

// PutBatchJobs writes new jobs.
func (t *Tx) PutBatchJobs(jobs []BatchJob) error {
	st, err := t.prepare("INSERT INTO batch_jobs (" + batchJobCols + ") VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
	if err != nil {
		return fmt.Errorf("write jobs: %w", err)
	}
	defer st.Close()
	for _, j := range jobs {
		if _, err := st.ExecContext(t.ctx, j.BatchID, j.Line, j.CustomID, j.ModelRef, j.Body, j.State, j.Attempts, j.LifecycleID, j.Result,
			micros(j.UpdatedAt)); err != nil {
			return fmt.Errorf("write job %s/%d: %w", j.BatchID, j.Line, err)
		}
	}
	return nil
}

func scanBatchJob(sc scanner) (BatchJob, error) {
	var j BatchJob
	var updated int64
	err := sc.Scan(&j.BatchID, &j.Line, &j.CustomID, &j.ModelRef, &j.Body, &j.State, &j.Attempts, &j.LifecycleID, &j.Result, &updated)
	j.UpdatedAt = fromMicros(updated)
	return j, err
}

func (t *Tx) batchJobs(q string, args ...any) ([]BatchJob, error) {
	return queryAll(t, "read jobs", scanBatchJob, "SELECT "+batchJobCols+" FROM batch_jobs "+q, args...)
}

// BatchJobResults reads a batch's jobs from line after+1 on, in line
// order, at most limit, without their bodies (Body is ""): what a
// batch's result files are written from.
func (t *Tx) BatchJobResults(batchID string, after, limit int) ([]BatchJob, error) {
	return queryAll(t, "read job results", scanBatchJob, "SELECT batch_id, line, custom_id, model_ref, '', state, attempts, lifecycle_id, result, updated_at "+
		"FROM batch_jobs WHERE batch_id = ? AND line > ? ORDER BY line LIMIT ?", batchID, after, limit)
}

// ClaimBatchJobs moves at most limit jobs of batch batchID in state from
// to state to, an attempt counted, in one statement (a compare-and-set: a
// job is claimed once), and returns them as they are now, by line; the
// models skip names are left out.
func (t *Tx) ClaimBatchJobs(batchID, from, to string, limit int, now time.Time, skip ...string) ([]BatchJob, error) {
	sub, args := "SELECT batch_id, line FROM batch_jobs WHERE batch_id = ? AND state = ?", []any{to, micros(now), batchID, from}
	if len(skip) > 0 {
		sub += " AND model_ref NOT IN (?" + repeat(", ?", len(skip)-1) + ")"
		for _, s := range skip {
			args = append(args, s)
		}
	}
	out, err := queryAll(t, "claim jobs", scanBatchJob, `UPDATE batch_jobs SET state = ?, attempts = attempts + 1, updated_at = ?
		WHERE (batch_id, line) IN (`+sub+` ORDER BY line LIMIT ?) RETURNING `+batchJobCols, append(args, limit)...)
	if err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b BatchJob) int { return cmp.Compare(a.Line, b.Line) })
	return out, nil
}

// UpdateBatchJobs is UpdateBatchJob for each of jobs with one statement
// prepared once: errs[i] is jobs[i]'s ErrNotFound when it was no longer
// in state from (the others are written all the same); err is a failure
// of the database, after which nothing may be committed.
func (t *Tx) UpdateBatchJobs(jobs []BatchJob, from string) (errs []error, err error) {
	st, err := t.prepare(`UPDATE batch_jobs SET state = ?, attempts = ?, lifecycle_id = ?, result = ?, updated_at = ?
		WHERE batch_id = ? AND line = ? AND state = ?`)
	if err != nil {
		return nil, fmt.Errorf("update jobs: %w", err)
	}
	defer st.Close()
	errs = make([]error, len(jobs))
	for i, j := range jobs {
		res, err := st.ExecContext(t.ctx, j.State, j.Attempts, j.LifecycleID, j.Result, micros(j.UpdatedAt), j.BatchID, j.Line, from)
		if err != nil {
			return nil, fmt.Errorf("update job %s/%d: %w", j.BatchID, j.Line, err)
		}
		if n, _ := res.RowsAffected(); n == 0 {
			errs[i] = fmt.Errorf("%w: job %s/%d in state %s", ErrNotFound, j.BatchID, j.Line, from)
		}
	}
	return errs, nil
}

// RequeueBatchJobs moves every running job back to queued, its attempt
// not counted (the queen stopped while it ran, not the worker), and
// returns how many it moved.
func (t *Tx) RequeueBatchJobs(running, queued string, now time.Time) (int, error) {
	res, err := t.exec(`UPDATE batch_jobs SET state = ?, updated_at = ?, attempts = CASE WHEN attempts > 0 THEN attempts - 1 ELSE 0 END
		WHERE state = ?`, queued, micros(now), running)
	if err != nil {
		return 0, fmt.Errorf("requeue running jobs: %w", err)
	}
	n, err := res.RowsAffected()
	return int(n), err
}

// BatchesCreatedBefore returns the ids of at most limit batches in one of
// statuses created before.
func (t *Tx) BatchesCreatedBefore(before time.Time, limit int, statuses ...string) ([]string, error) {
	args := []any{micros(before)}
	for _, s := range statuses {
		args = append(args, s)
	}
	return queryAll(t, "read old batches", scanID,
		"SELECT id FROM batches WHERE created_at < ? AND status IN (?"+repeat(", ?", len(statuses)-1)+") ORDER BY created_at LIMIT ?",
		append(args, limit)...)
}

// BatchJobsOf reads the jobs of a batch in state, in line order, at most
// limit.
func (t *Tx) BatchJobsOf(batchID, state string, limit int) ([]BatchJob, error) {
	return t.batchJobs("WHERE batch_id = ? AND state = ? ORDER BY line LIMIT ?", batchID, state, limit)
}

// UpdateBatchJob rewrites a job whose state is still from (the compare
// of a compare-and-set); ErrNotFound when it is not.
func (t *Tx) UpdateBatchJob(j BatchJob, from string) error {
	res, err := t.exec(`UPDATE batch_jobs SET state = ?, attempts = ?, lifecycle_id = ?, result = ?, updated_at = ?
		WHERE batch_id = ? AND line = ? AND state = ?`, j.State, j.Attempts, j.LifecycleID, j.Result, micros(j.UpdatedAt), j.BatchID, j.Line, from)
	if err != nil {
		return fmt.Errorf("update job %s/%d: %w", j.BatchID, j.Line, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("%w: job %s/%d in state %s", ErrNotFound, j.BatchID, j.Line, from)
	}
	return nil
}

// MoveBatchJobs moves at most limit jobs of batchID in state from to
// state to and returns how many it moved: a batch's jobs are moved a
// bounded transaction at a time.
func (t *Tx) MoveBatchJobs(batchID, from, to string, limit int, now time.Time) (int, error) {
	res, err := t.exec(`UPDATE batch_jobs SET state = ?, updated_at = ? WHERE (batch_id, line) IN
		(SELECT batch_id, line FROM batch_jobs WHERE batch_id = ? AND state = ? ORDER BY line LIMIT ?)`, to, micros(now), batchID, from, limit)
	if err != nil {
		return 0, fmt.Errorf("move the jobs of batch %s from %s to %s: %w", batchID, from, to, err)
	}
	n, err := res.RowsAffected()
	return int(n), err
}

// BatchJobCounts counts a batch's jobs by state.
func (t *Tx) BatchJobCounts(batchID string) (map[string]int, error) {
	rows, err := t.query("SELECT state, COUNT(*) FROM batch_jobs WHERE batch_id = ? GROUP BY state", batchID)
	if err != nil {
		return nil, fmt.Errorf("count the jobs of batch %s: %w", batchID, err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var s string
		var n int
		if err := rows.Scan(&s, &n); err != nil {
			return nil, err
		}
		out[s] = n
	}
	return out, rows.Err()
}

// scanner is a row to scan: *sql.Row or *sql.Rows.
type scanner interface{ Scan(...any) error }

// queryAll runs q and scans every row with scan; an error says what it
// was doing (what).
func queryAll[T any](t *Tx, what string, scan func(scanner) (T, error), q string, args ...any) ([]T, error) {
	rows, err := t.query(q, args...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	defer rows.Close()
	var out []T
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return out, nil
}

// scanID scans a row of one text column.
func scanID(sc scanner) (id string, err error) { return id, sc.Scan(&id) }
