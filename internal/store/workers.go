package store

import (
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/apiary-llm/apiary/internal/lifecycle"
)

// Row is one worker lifecycle row: the queen's persisted record of a worker
// it asked a hive for, from STARTING to STOPPED or FAILED.
type Row struct {
	ID              string // wk-…, the lifecycle id
	PoolID          string
	WorkerID        string // the hive's id of the process; "" until the hive accepted
	ModelRef        string
	GPUDevice       *int
	Status          lifecycle.Status
	Reason          string
	Owner           string // queen or operator
	CreatedAt       time.Time
	StartedAt       *time.Time
	ReadyAt         *time.Time
	StoppedAt       *time.Time
	LastHeartbeatAt *time.Time
	VRAMBytes       uint64
	URI             string
	PID             *int
	ExitCode        *int
}

// RowFilter selects rows; zero fields select everything.
type RowFilter struct {
	Statuses []lifecycle.Status
	ModelRef string
	PoolID   string
	Limit    int // 0: no limit
}

const rowColumns = `id, pool_id, worker_id, model_ref, gpu_device, status, reason, owner, created_at,
	started_at, ready_at, stopped_at, last_heartbeat_at, vram_bytes, uri, pid, exit_code`

func (r Row) args() []any {
	return []any{r.ID, r.PoolID, r.WorkerID, r.ModelRef, nullInt(r.GPUDevice), string(r.Status), r.Reason, r.Owner,
		micros(r.CreatedAt), nullMicros(r.StartedAt), nullMicros(r.ReadyAt), nullMicros(r.StoppedAt),
		nullMicros(r.LastHeartbeatAt), int64(r.VRAMBytes), r.URI, nullInt(r.PID), nullInt(r.ExitCode)}
}

// InsertRow adds a new row; ErrExists when its id is taken.
func (t *Tx) InsertRow(r Row) error {
	if _, err := t.Row(r.ID); err == nil {
		return fmt.Errorf("%w: worker row %s", ErrExists, r.ID)
	}
	_, err := t.exec(`INSERT INTO workers (`+rowColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`, r.args()...)
	if err != nil {
		return fmt.Errorf("insert worker row %s: %w", r.ID, err)
	}
	return nil
}

// UpdateRow replaces the row with r's id; ErrNotFound when there is none.
func (t *Tx) UpdateRow(r Row) error {
	a := r.args()
	res, err := t.exec(`UPDATE workers SET pool_id = ?, worker_id = ?, model_ref = ?, gpu_device = ?, status = ?,
		reason = ?, owner = ?, created_at = ?, started_at = ?, ready_at = ?, stopped_at = ?, last_heartbeat_at = ?,
		vram_bytes = ?, uri = ?, pid = ?, exit_code = ? WHERE id = ?`, append(a[1:], a[0])...)
	if err != nil {
		return fmt.Errorf("update worker row %s: %w", r.ID, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("%w: worker row %s", ErrNotFound, r.ID)
	}
	return nil
}

// TouchRows sets last_heartbeat_at of the given rows.
// The statement is prepared once for all of them.
func (t *Tx) TouchRows(beats map[string]time.Time) error {
	if len(beats) == 0 {
		return nil
	}
	stmt, err := t.prepare("UPDATE workers SET last_heartbeat_at = ? WHERE id = ?")
	if err != nil {
		return fmt.Errorf("touch worker rows: %w", err)
	}
	defer stmt.Close()
	for id, at := range beats {
		if _, err := stmt.ExecContext(t.ctx, micros(at), id); err != nil {
			return fmt.Errorf("touch worker row %s: %w", id, err)
		}
	}
	return nil
}

// Row reads one row; ErrNotFound when there is none.
func (t *Tx) Row(id string) (Row, error) {
	rs, err := t.rows("WHERE id = ?", id)
	if err != nil {
		return Row{}, err
	}
	if len(rs) == 0 {
		return Row{}, fmt.Errorf("%w: worker row %s", ErrNotFound, id)
	}
	return rs[0], nil
}

// Rows reads the rows f selects, newest first.
func (t *Tx) Rows(f RowFilter) ([]Row, error) {
	var where []string
	var args []any
	if len(f.Statuses) > 0 {
		where = append(where, "status IN ("+strings.TrimSuffix(strings.Repeat("?, ", len(f.Statuses)), ", ")+")")
		for _, s := range f.Statuses {
			args = append(args, string(s))
		}
	}
	if f.ModelRef != "" {
		where = append(where, "model_ref = ?")
		args = append(args, f.ModelRef)
	}
	if f.PoolID != "" {
		where = append(where, "pool_id = ?")
		args = append(args, f.PoolID)
	}
	clause := ""
	if len(where) > 0 {
		clause = "WHERE " + strings.Join(where, " AND ")
	}
	clause += " ORDER BY created_at DESC, id DESC"
	if f.Limit > 0 {
		clause += " LIMIT ?"
		args = append(args, f.Limit)
	}
	return t.rows(clause, args...)
}

// CountRows counts rows by status.
func (t *Tx) CountRows() (map[lifecycle.Status]int, error) {
	rows, err := t.query("SELECT status, COUNT(*) FROM workers GROUP BY status")
	if err != nil {
		return nil, fmt.Errorf("count worker rows: %w", err)
	}
	defer rows.Close()
	out := map[lifecycle.Status]int{}
	for rows.Next() {
		var s string
		var n int
		if err := rows.Scan(&s, &n); err != nil {
			return nil, fmt.Errorf("count worker rows: %w", err)
		}
		out[lifecycle.Status(s)] = n
	}
	return out, rows.Err()
}

func (t *Tx) rows(clause string, args ...any) ([]Row, error) {
	rows, err := t.query("SELECT "+rowColumns+" FROM workers "+clause, args...)
	if err != nil {
		return nil, fmt.Errorf("read worker rows: %w", err)
	}
	defer rows.Close()
	var out []Row
	for rows.Next() {
		var r Row
		var status string
		var gpu, pid, exit, started, ready, stopped, beat sql.NullInt64
		var created, vram int64
		if err := rows.Scan(&r.ID, &r.PoolID, &r.WorkerID, &r.ModelRef, &gpu, &status, &r.Reason, &r.Owner, &created,
			&started, &ready, &stopped, &beat, &vram, &r.URI, &pid, &exit); err != nil {
			return nil, fmt.Errorf("read worker rows: %w", err)
		}
		r.Status = lifecycle.Status(status)
		r.GPUDevice, r.PID, r.ExitCode = intPtr(gpu), intPtr(pid), intPtr(exit)
		r.CreatedAt = fromMicros(created)
		r.StartedAt, r.ReadyAt, r.StoppedAt, r.LastHeartbeatAt = timePtr(started), timePtr(ready), timePtr(stopped), timePtr(beat)
		r.VRAMBytes = uint64(vram)
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read worker rows: %w", err)
	}
	return out, nil
}
