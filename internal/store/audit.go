package store

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// AuditEntry is one change on record: who (actor) did what (action) to
// which pool or worker row (target), why (reason), with details.
type AuditEntry struct {
	ID       int64
	TS       time.Time
	Actor    string
	Action   string
	Target   string
	Reason   string
	Metadata map[string]any
}

// AuditFilter selects entries; zero fields select everything.
type AuditFilter struct {
	Since  time.Time // entries at or after
	Until  time.Time // entries before; zero: no bound
	Actor  string
	Target string
	Action string
	Limit  int // 0: no limit
}

// Append records e and returns it with its id (and TS, when e had none).
func (t *Tx) Append(e AuditEntry) (AuditEntry, error) {
	if e.TS.IsZero() {
		e.TS = time.Now()
	}
	meta := []byte("{}")
	if len(e.Metadata) > 0 {
		var err error
		if meta, err = json.Marshal(e.Metadata); err != nil {
			return e, fmt.Errorf("audit metadata: %w", err)
		}
	}
	// The database gives the id (identity column, AUTOINCREMENT): never
	// reused, across restarts, prunes and queens.
	if err := t.queryRow("INSERT INTO audit_log (ts, actor, action, target, reason, metadata) VALUES (?, ?, ?, ?, ?, ?) RETURNING id",
		micros(e.TS), e.Actor, e.Action, e.Target, e.Reason, string(meta)).Scan(&e.ID); err != nil {
		return e, fmt.Errorf("append audit entry: %w", err)
	}
	e.TS = fromMicros(micros(e.TS))
	return e, nil
}

// Audit reads the entries f selects, newest first.
func (t *Tx) Audit(f AuditFilter) ([]AuditEntry, error) {
	var where []string
	var args []any
	if !f.Since.IsZero() {
		where = append(where, "ts >= ?")
		args = append(args, micros(f.Since))
	}
	if !f.Until.IsZero() {
		where = append(where, "ts < ?")
		args = append(args, micros(f.Until))
	}
	if f.Actor != "" {
		where = append(where, "actor = ?")
		args = append(args, f.Actor)
	}
	if f.Target != "" {
		where = append(where, "target = ?")
		args = append(args, f.Target)
	}
	if f.Action != "" {
		where = append(where, "action = ?")
		args = append(args, f.Action)
	}
	q := "SELECT id, ts, actor, action, target, reason, metadata FROM audit_log"
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	q += " ORDER BY id DESC"
	if f.Limit > 0 {
		q += " LIMIT ?"
		args = append(args, f.Limit)
	}
	rows, err := t.query(q, args...)
	if err != nil {
		return nil, fmt.Errorf("read audit log: %w", err)
	}
	defer rows.Close()
	var out []AuditEntry
	for rows.Next() {
		var e AuditEntry
		var ts int64
		var meta string
		if err := rows.Scan(&e.ID, &ts, &e.Actor, &e.Action, &e.Target, &e.Reason, &meta); err != nil {
			return nil, fmt.Errorf("read audit log: %w", err)
		}
		e.TS = fromMicros(ts)
		if meta != "" && meta != "{}" {
			if err := json.Unmarshal([]byte(meta), &e.Metadata); err != nil {
				return nil, fmt.Errorf("audit entry %d metadata: %w", e.ID, err)
			}
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read audit log: %w", err)
	}
	return out, nil
}
