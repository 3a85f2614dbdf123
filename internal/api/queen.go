package api

import "time"

// This file holds the queen's own answers and admin requests: the pool
// registry (/v2/pools), the lifecycle rows and the audit log
// (/api/admin/…). The keeper decodes what the queen encodes with them.

// Pool is one entry of the queen's GET /v2/pools.
type Pool struct {
	PoolID          string     `json:"pool_id"`
	Endpoint        string     `json:"endpoint"`
	NodeID          string     `json:"node_id"`
	Version         string     `json:"version"`
	Status          string     `json:"status"` // healthy, unhealthy, draining, offline
	Drained         bool       `json:"drained"`
	RegisteredAt    time.Time  `json:"registered_at"`
	StatusChangedAt time.Time  `json:"status_changed_at"`
	LastHeartbeatAt *time.Time `json:"last_heartbeat_at,omitempty"`
	GPUs            []GPU      `json:"gpus"`
	Workers         []Worker   `json:"workers"`
}

// PoolList is the answer of GET /v2/pools.
type PoolList struct {
	Pools []Pool `json:"pools"`
}

// PoolAction is the optional body of POST /v2/pools/{id}/drain and
// DELETE /v2/pools/{id}: why, for the audit log.
type PoolAction struct {
	Reason string `json:"reason,omitempty"`
}

// LifecycleRow is one worker lifecycle row of the queen, the source of
// truth about a worker it asked for.
type LifecycleRow struct {
	ID              string     `json:"id"` // wk-…
	PoolID          string     `json:"pool_id"`
	WorkerID        string     `json:"worker_id,omitempty"` // the hive's id, once it accepted
	ModelRef        string     `json:"model_ref"`
	GPUDevice       *int       `json:"gpu_device"`
	Status          string     `json:"status"` // STARTING, RUNNING, DRAINING, STOPPED, FAILED
	Reason          string     `json:"reason"`
	CreatedAt       time.Time  `json:"created_at"`
	StartedAt       *time.Time `json:"started_at"`
	ReadyAt         *time.Time `json:"ready_at"`
	StoppedAt       *time.Time `json:"stopped_at"`
	LastHeartbeatAt *time.Time `json:"last_heartbeat_at"`
	VRAMBytes       uint64     `json:"vram_bytes"`
	URI             string     `json:"uri"`
	PID             *int       `json:"pid"`
	ExitCode        *int       `json:"exit_code"`
	Owner           string     `json:"owner"` // queen or operator
}

// LifecycleRowList is the answer of GET /api/admin/workers, newest first.
type LifecycleRowList struct {
	Workers []LifecycleRow `json:"workers"`
}

// Admin worker actions.
const (
	ActionStart = "start"
	ActionStop  = "stop"
)

// AdminWorkerRequest is the body of POST /api/admin/workers:
// {"action":"start","model","pool_id"?,"gpu"?,"reason"} or
// {"action":"stop","lifecycleId","drain","reason"}.
type AdminWorkerRequest struct {
	Action      string `json:"action"`
	Model       string `json:"model,omitempty"`
	PoolID      string `json:"pool_id,omitempty"`
	GPU         *int   `json:"gpu,omitempty"`
	LifecycleID string `json:"lifecycleId,omitempty"`
	Drain       bool   `json:"drain,omitempty"`
	Reason      string `json:"reason"`
}

// AdminWorkerResponse answers a start (201) or a stop (202).
type AdminWorkerResponse struct {
	LifecycleID string       `json:"lifecycleId"`
	Worker      LifecycleRow `json:"worker"`
}

// AuditEntry is one entry of the queen's audit log.
type AuditEntry struct {
	ID       int64          `json:"id"`
	TS       time.Time      `json:"ts"`
	Actor    string         `json:"actor"`
	Action   string         `json:"action"`
	Target   string         `json:"target"`
	Reason   string         `json:"reason"`
	Metadata map[string]any `json:"metadata,omitempty"`
}

// AuditList is the answer of GET /api/admin/audit, newest first.
type AuditList struct {
	Entries []AuditEntry `json:"entries"`
}

// EventAck answers a worker event: applied false says the queen understood
// the event but did not change a row (unknown worker, transition refused);
// the hive must not retry it.
type EventAck struct {
	Applied bool   `json:"applied"`
	Message string `json:"message,omitempty"`
}
