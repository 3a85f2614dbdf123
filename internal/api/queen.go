package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"
)

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
	// Pulls are the model pulls running on the pool that the queen
	// started (an operator's, or its own for a configured model), with
	// their progress as the hive last said.
	Pulls []ModelPull `json:"pulls,omitempty"`
	// MaxLoaded is the hive's --max-loaded (absent: no limit but memory).
	MaxLoaded int `json:"max_loaded,omitempty"`
	// Evictions are the pool's latest workers the queen evicted to make
	// room for another model's, newest first (at most MaxEvictionsShown).
	Evictions []Eviction `json:"evictions,omitempty"`
}

// MaxEvictionsShown bounds Pool.Evictions.
const MaxEvictionsShown = 10

// Eviction is one worker the queen stopped to make room: which, of what
// model, for what model, when.
type Eviction struct {
	At          time.Time `json:"at"`
	WorkerID    string    `json:"worker_id"`
	LifecycleID string    `json:"lifecycle_id"`
	GPUDevice   int       `json:"gpu_device"`
	Model       string    `json:"model"` // the evicted worker's model ref
	For         string    `json:"for"`   // the ref of the model it made room for
	// ModelName and ForName are the names the queen's --config gives
	// Model and For; absent when it names none.
	ModelName string `json:"model_name,omitempty"`
	ForName   string `json:"for_name,omitempty"`
	// LastUsedAt is when the worker last finished a request (absent:
	// never, through this queen).
	LastUsedAt *time.Time `json:"last_used_at,omitempty"`
}

// PoolList is the answer of GET /v2/pools.
type PoolList struct {
	Pools []Pool `json:"pools"`
}

// PoolAction is the optional body of POST /v2/pools/{id}/drain and
// DELETE /v2/pools/{id}: why, for the audit log.
type PoolAction struct {
	Reason string `json:"reason,omitempty"`
	// Now, on a drain, also stops the pool's running workers (gracefully:
	// their requests in flight finish); without it they serve on until
	// they stop or idle out.
	Now bool `json:"now,omitempty"`
}

// LifecycleRow is one worker lifecycle row of the queen, the source of
// truth about a worker it asked for.
type LifecycleRow struct {
	ID       string `json:"id"` // wk-…
	PoolID   string `json:"pool_id"`
	WorkerID string `json:"worker_id,omitempty"` // the hive's id, once it accepted
	ModelRef string `json:"model_ref"`
	// ModelName is the name the queen's --config gives the model (what
	// clients send); absent when the config names none for model_ref.
	ModelName string `json:"model_name,omitempty"`
	GPUDevice *int   `json:"gpu_device"`
	// GPUDevices are, for a worker split over more than one GPU, every
	// one it runs on (gpu_device first), as its hive reports them; absent
	// for a worker on one device.
	GPUDevices []int `json:"gpu_devices,omitempty"`
	// DeviceKind is the kind of device gpu_device names (DeviceCPU: the
	// CPU, not a GPU; DeviceCUDA), from its pool's inventory; empty when
	// the pool is no longer known.
	DeviceKind string `json:"device_kind,omitempty"`
	// Pod and Node are, for a worker that is a Kubernetes Pod, its Pod
	// (NAMESPACE/NAME) and node, as its hive reports them.
	Pod             string     `json:"pod,omitempty"`
	Node            string     `json:"node,omitempty"`
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
	// Strikes is how the queen's routing sees a RUNNING worker that
	// failed requests lately; absent when it has no failures in a row.
	Strikes *WorkerStrikes `json:"strikes,omitempty"`
}

// WorkerStrikes are a worker's relay failures in a row at the queen.
type WorkerStrikes struct {
	Failures int `json:"failures"` // requests failed in a row (and failed health checks while degraded)
	Limit    int `json:"limit"`    // the queen's --strike-limit: degraded at Limit, stopped at 3 × Limit
	// Degraded: the queen sends it no new requests until its health
	// check answers or a request in flight succeeds.
	Degraded  bool   `json:"degraded"`
	LastError string `json:"last_error,omitempty"`
}

// LifecycleRowList is the answer of GET /api/admin/workers, newest first.
type LifecycleRowList struct {
	Workers []LifecycleRow `json:"workers"`
}

// Admin worker actions.
const (
	ActionStart  = "start"
	ActionStop   = "stop"
	ActionCreate = "create"
)

// Placements of a created row: who brings its worker up.
const (
	// PlacementAuto: the queen places the worker on a pool and asks its
	// hive to start it (as action start does).
	PlacementAuto = "auto"
	// PlacementOperator: the row waits for a worker started by hand
	// (`apiary worker --queen URL --lifecycle-id ID`) to claim it.
	PlacementOperator = "operator"
)

// AdminWorkerRequest is the body of POST /api/admin/workers:
// {"action":"start","model","pool_id"?,"gpu"?,"reason"},
// {"action":"create","model","placement":"auto"|"operator","pool_id"?,"gpu"?,"reason"} or
// {"action":"stop","lifecycle_id","drain","reason"}. The seed's
// "lifecycleId" is still taken in place of "lifecycle_id" (UnmarshalJSON).
type AdminWorkerRequest struct {
	Action      string `json:"action"`
	Model       string `json:"model,omitempty"`
	PoolID      string `json:"pool_id,omitempty"`
	GPU         *int   `json:"gpu,omitempty"`
	Placement   string `json:"placement,omitempty"` // action create: PlacementAuto (default) or PlacementOperator
	LifecycleID string `json:"lifecycle_id,omitempty"`
	Drain       bool   `json:"drain,omitempty"`
	Reason      string `json:"reason"`
}

// legacyLifecycleID is the camelCase key the seed used for lifecycle ids
// (before every key on the wire became snake_case); it is still read.
type legacyLifecycleID struct {
	Legacy *string `json:"lifecycleId,omitempty"`
}

// UnmarshalJSON decodes strictly (an unknown field is an error, as
// Decode's) and takes "lifecycleId" for "lifecycle_id"; both at once must
// agree.
func (r *AdminWorkerRequest) UnmarshalJSON(b []byte) error {
	type plain AdminWorkerRequest // without this method
	var v struct {
		plain
		legacyLifecycleID
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		return err
	}
	if err := v.merge(&v.LifecycleID); err != nil {
		return err
	}
	*r = AdminWorkerRequest(v.plain)
	return nil
}

// merge moves a legacy id into *id.
func (l legacyLifecycleID) merge(id *string) error {
	switch {
	case l.Legacy == nil:
	case *id == "":
		*id = *l.Legacy
	case *id != *l.Legacy:
		return fmt.Errorf("lifecycle_id %q and lifecycleId %q differ; send lifecycle_id only", *id, *l.Legacy)
	}
	return nil
}

// AdminWorkerResponse answers a start (201) or a stop (202). A keeper
// reads "lifecycleId" too, from a queen of the seed's wire.
type AdminWorkerResponse struct {
	LifecycleID string       `json:"lifecycle_id"`
	Worker      LifecycleRow `json:"worker"`
}

// UnmarshalJSON takes "lifecycleId" for "lifecycle_id".
func (r *AdminWorkerResponse) UnmarshalJSON(b []byte) error {
	type plain AdminWorkerResponse
	var v struct {
		plain
		legacyLifecycleID
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	if err := v.merge(&v.LifecycleID); err != nil {
		return err
	}
	*r = AdminWorkerResponse(v.plain)
	return nil
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

// MaxReplicas bounds a model's min_workers and max_workers.
const MaxReplicas = 1000

// ModelScaleRequest is the body of PUT /api/admin/models/{name}:
// {"min_workers", "max_workers"?, "reason"}. Without max_workers the
// queen's own bound (--max-workers, --model-max-workers) applies.
type ModelScaleRequest struct {
	MinWorkers *int   `json:"min_workers"`
	MaxWorkers *int   `json:"max_workers,omitempty"`
	Reason     string `json:"reason"`
}

// ModelSetting is a model's setting (apiary models scale) with what the
// queen sees of it now: the answer of PUT /api/admin/models/{name} and an
// entry of GET /api/admin/models.
type ModelSetting struct {
	Model string `json:"model"` // the model's ref (its file)
	// ModelName is the name the queen's --config gives the model; absent
	// when it names none.
	ModelName  string    `json:"model_name,omitempty"`
	MinWorkers int       `json:"min_workers"`
	MaxWorkers *int      `json:"max_workers"` // null: the queen's bound
	Reason     string    `json:"reason"`
	UpdatedAt  time.Time `json:"updated_at"`
	// Starting and Running count the model's live rows on healthy pools.
	Starting int `json:"starting"`
	Running  int `json:"running"`
	// CrashLoop is set while the model is in a crash loop.
	CrashLoop *CrashLoop `json:"crash_loop,omitempty"`
	// From is "config" for a setting of the queen's model config (which
	// PUT cannot change), empty for one set with PUT.
	From string `json:"from,omitempty"`
}

// CrashLoop is a model whose workers keep failing: it is replaced only at
// a slow pace until one of its workers serves.
type CrashLoop struct {
	Since       time.Time `json:"since"`
	Failures    int       `json:"failures"` // within the queen's window
	LastFailure string    `json:"last_failure"`
	LastExit    *int      `json:"last_exit_code,omitempty"`
	NextTry     time.Time `json:"next_try"`
}

// ModelSettingList is the answer of GET /api/admin/models, by model.
type ModelSettingList struct {
	Models []ModelSetting `json:"models"`
}

// WorkerClaim is the body of POST /v2/workers/claim: a worker run by hand
// (`apiary worker --queen URL`) that serves model_ref at uri claims the
// STARTING row lifecycle_id, or, without one, asks for a row of its own.
// worker_token is the worker's own bearer token ("" for a worker without
// one): the queen relays requests with it and never stores it.
type WorkerClaim struct {
	LifecycleID string `json:"lifecycle_id,omitempty"`
	ModelRef    string `json:"model_ref"`
	URI         string `json:"uri"`
	WorkerToken string `json:"worker_token,omitempty"`
	VRAMBytes   uint64 `json:"vram_bytes"`
	PID         int    `json:"pid,omitempty"`
}

// WorkerReport is the body of POST /v2/workers/{id}/report: a worker run
// by hand says it is draining or has stopped (status DRAINING or
// STOPPED).
type WorkerReport struct {
	Status string `json:"status"`
	Reason string `json:"reason"`
}

// UnloadRequest is the body of the queen's POST
// /api/admin/models/{name}/unload: why (for the audit log), and the pool
// to unload it from ("": every pool).
type UnloadRequest struct {
	PoolID string `json:"pool_id,omitempty"`
	Reason string `json:"reason"`
}

// UnloadAnswer is its 200: the model, and the lifecycle ids of the
// workers stopped (each drained first; their rows have ended).
type UnloadAnswer struct {
	Model   string   `json:"model"`
	Stopped []string `json:"stopped"`
}
