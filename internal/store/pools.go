package store

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"time"
)

// Pool is a hive's registration, status and last reported inventory. GPUs
// and Workers are JSON arrays that the registry encodes; the store keeps
// them as they are.
type Pool struct {
	ID              string
	Endpoint        string
	NodeID          string
	Version         string
	Status          string
	Drained         bool
	RegisteredAt    time.Time
	StatusChangedAt time.Time
	LastHeartbeatAt *time.Time
	GPUs            json.RawMessage
	Workers         json.RawMessage
	// Instance is the hive process that holds the pool, as it last
	// registered ("" for a hive that names none).
	Instance string
}

func jsonOr(raw json.RawMessage, empty string) string {
	if len(raw) == 0 {
		return empty
	}
	return string(raw)
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// PutPool inserts p or replaces the pool with its id.
func (t *Tx) PutPool(p Pool) error {
	_, err := t.exec(`INSERT INTO pools (id, endpoint, node_id, version, status, drained, registered_at,
			status_changed_at, last_heartbeat_at, gpus, workers, instance)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (id) DO UPDATE SET endpoint = excluded.endpoint, node_id = excluded.node_id,
			version = excluded.version, status = excluded.status, drained = excluded.drained,
			registered_at = excluded.registered_at, status_changed_at = excluded.status_changed_at,
			last_heartbeat_at = excluded.last_heartbeat_at, gpus = excluded.gpus, workers = excluded.workers,
			instance = excluded.instance`,
		p.ID, p.Endpoint, p.NodeID, p.Version, p.Status, boolInt(p.Drained), micros(p.RegisteredAt),
		micros(p.StatusChangedAt), nullMicros(p.LastHeartbeatAt), jsonOr(p.GPUs, "[]"), jsonOr(p.Workers, "[]"), p.Instance)
	if err != nil {
		return fmt.Errorf("put pool %s: %w", p.ID, err)
	}
	return nil
}

// TouchPools records what the heartbeats of pools brought (their last
// heartbeat, GPUs and workers) without touching their registration or
// status, skipping the pools that no longer exist. The statement is
// prepared once for all of them.
func (t *Tx) TouchPools(beats []Pool) error {
	if len(beats) == 0 {
		return nil
	}
	stmt, err := t.prepare("UPDATE pools SET last_heartbeat_at = ?, gpus = ?, workers = ? WHERE id = ?")
	if err != nil {
		return fmt.Errorf("touch pools: %w", err)
	}
	defer stmt.Close()
	for _, b := range beats {
		at := time.Time{}
		if b.LastHeartbeatAt != nil {
			at = *b.LastHeartbeatAt
		}
		if _, err := stmt.ExecContext(t.ctx, micros(at), jsonOr(b.GPUs, "[]"), jsonOr(b.Workers, "[]"), b.ID); err != nil {
			return fmt.Errorf("touch pool %s: %w", b.ID, err)
		}
	}
	return nil
}

// DeletePool removes the pool id; ErrNotFound when there is none.
func (t *Tx) DeletePool(id string) error {
	res, err := t.exec("DELETE FROM pools WHERE id = ?", id)
	if err != nil {
		return fmt.Errorf("delete pool %s: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("%w: pool %s", ErrNotFound, id)
	}
	return nil
}

// Pool reads the pool id; ErrNotFound when there is none.
func (t *Tx) Pool(id string) (Pool, error) {
	ps, err := t.pools("WHERE id = ?", id)
	if err != nil {
		return Pool{}, err
	}
	if len(ps) == 0 {
		return Pool{}, fmt.Errorf("%w: pool %s", ErrNotFound, id)
	}
	return ps[0], nil
}

// Pools reads every pool, by id.
func (t *Tx) Pools() ([]Pool, error) { return t.pools("ORDER BY id") }

func (t *Tx) pools(where string, args ...any) ([]Pool, error) {
	rows, err := t.query(`SELECT id, endpoint, node_id, version, status, drained, registered_at,
		status_changed_at, last_heartbeat_at, gpus, workers, instance FROM pools `+where, args...)
	if err != nil {
		return nil, fmt.Errorf("read pools: %w", err)
	}
	defer rows.Close()
	var out []Pool
	for rows.Next() {
		var p Pool
		var drained int
		var reg, changed int64
		var beat sql.NullInt64
		var gpus, workers string
		if err := rows.Scan(&p.ID, &p.Endpoint, &p.NodeID, &p.Version, &p.Status, &drained, &reg,
			&changed, &beat, &gpus, &workers, &p.Instance); err != nil {
			return nil, fmt.Errorf("read pools: %w", err)
		}
		p.Drained = drained != 0
		p.RegisteredAt, p.StatusChangedAt, p.LastHeartbeatAt = fromMicros(reg), fromMicros(changed), timePtr(beat)
		p.GPUs, p.Workers = json.RawMessage(gpus), json.RawMessage(workers)
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read pools: %w", err)
	}
	return out, nil
}
