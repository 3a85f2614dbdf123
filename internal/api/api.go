// Package api is the wire between apiary's processes, both ends of it:
//   - the JSON types they exchange (the hive's API, the worker's ready
//     callback, the hive → queen registration, heartbeat and events, the
//     admin API); the queen decodes what the hive encodes with the same
//     types;
//   - the checks both ends apply to what is on the wire (CheckID,
//     CheckModel), so that no daemon takes what its peer would refuse;
//   - the server side of a JSON endpoint (Decode, WriteJSON, Bearer,
//     StatusRecorder) and of its errors (RequestError, StatusOf, Fail, the
//     error shape), and the reading of a peer's error (RemoteError,
//     Printable);
//   - FormatBytes, the one way sizes are shown.
package api

import "time"

// Error is the body of every error answer, in OpenAI's shape:
// {"error":{"code","message","type","param"}}.
type Error struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail names what went wrong: a snake_case code, one clear line,
// OpenAI's type for the status, and the field at fault (null: none).
type ErrorDetail struct {
	Code    string  `json:"code"`
	Message string  `json:"message"`
	Type    string  `json:"type,omitempty"`
	Param   *string `json:"param"`
}

// Liveness is the answer of a queen's GET /health/live: 200 while the
// process answers, active or standby, for a watchdog (a standby's
// /health is 503 for load balancers).
type Liveness struct {
	Status  string `json:"status"`           // "live"
	Role    string `json:"role"`             // "active" or "standby"
	Active  string `json:"active,omitempty"` // a standby's: the active queen's URL, when known
	Version string `json:"version,omitempty"`
}

// Health is the answer of a daemon's GET /health.
type Health struct {
	Status  string `json:"status"`
	Version string `json:"version,omitempty"`
	// Tokens says that the queen's admin and API endpoints want tokens
	// (the dashboard asks for one before it calls them, instead of after
	// a 401).
	Tokens bool `json:"tokens,omitempty"`
}

// StartWorkerRequest is the body of the hive's POST /v2/workers/start.
type StartWorkerRequest struct {
	ModelRef  string `json:"model_ref"`
	GPUDevice *int   `json:"gpu_device,omitempty"`
	// GPUDevices are the GPUs of one node a model too big for one is
	// split over (llama.cpp's layer split), more than one; GPUDevice, when
	// given too, must be the first. Absent: one device (GPUDevice).
	GPUDevices  []int  `json:"gpu_devices,omitempty"`
	LifecycleID string `json:"lifecycle_id,omitempty"`
	// Engine names the hive's engine that runs the worker; "" is the
	// built-in one. A hive without it answers 400 unknown_engine.
	Engine string `json:"engine,omitempty"`
	WorkerOptions
}

// WorkerOptions are how one worker starts, from the queen's model config;
// a zero field takes the hive's own (--ctx-size, --worker-slots,
// --worker-threads, --idle-timeout).
type WorkerOptions struct {
	CtxSize       int   `json:"ctx_size,omitempty"`
	Slots         int   `json:"slots,omitempty"`
	Threads       int   `json:"threads,omitempty"`
	IdleTimeoutMS int64 `json:"idle_timeout_ms,omitempty"`
	// Projector is the vision projector the worker loads (a file of the
	// hive's models directory, by its name without .gguf: the config's
	// mmproj); "" the model's own, mmproj-REF.gguf beside it, if any.
	Projector string `json:"projector,omitempty"`
}

// Check reports the first option out of range (what names the field).
func (o WorkerOptions) Check() error {
	for _, n := range []struct {
		field string
		v     int64
	}{{"ctx_size", int64(o.CtxSize)}, {"slots", int64(o.Slots)}, {"threads", int64(o.Threads)}, {"idle_timeout_ms", o.IdleTimeoutMS}} {
		if n.v < 0 {
			return BadRequest("%s must not be negative, got %d", n.field, n.v)
		}
	}
	return nil
}

// StartWorkerResponse is the 202 answer to a start.
type StartWorkerResponse struct {
	WorkerID string `json:"worker_id"`
	Status   string `json:"status"`
}

// StopWorkerRequest is the body of the hive's POST /v2/workers/{id}/stop.
type StopWorkerRequest struct {
	Drain        bool `json:"drain"`
	GraceSeconds *int `json:"grace_seconds,omitempty"`
	// Reason is why the queen stops it (evicted for a model, unloaded,
	// stopped by an operator): the worker's stop reason on the hive, in
	// its events and log. Absent: "stop requested" or "drain requested".
	Reason string `json:"reason,omitempty"`
}

// StopWorkerResponse is the 202 answer to a stop.
type StopWorkerResponse struct {
	WorkerID string `json:"worker_id"`
	Status   string `json:"status"`
}

// ReadyCallback is what a worker POSTs to the hive once it serves.
type ReadyCallback struct {
	WorkerID  string `json:"worker_id"`
	VRAMBytes uint64 `json:"vram_bytes"`
	URI       string `json:"uri"`
}

// Transition is one entry of a worker's history.
type Transition struct {
	From       string    `json:"from"`
	To         string    `json:"to"`
	Reason     string    `json:"reason"`
	At         time.Time `json:"at"`
	DurationMS int64     `json:"duration_ms"` // time spent in From
}

// Worker is one entry of the hive's worker registry (WLIFE-10020 plus what
// the queen's lifecycle row needs).
type Worker struct {
	WorkerID    string `json:"worker_id"`
	LifecycleID string `json:"lifecycle_id,omitempty"`
	ModelRef    string `json:"model_ref"`
	// ModelName is the name the queen's --config gives the model (the
	// queen's listings only); absent when the config names none.
	ModelName string `json:"model_name,omitempty"`
	GPUDevice int    `json:"gpu_device"`
	VRAMBytes uint64 `json:"vram_bytes"`
	// Devices are, for a worker split over more than one GPU, every one
	// it runs on (GPUDevice first) with what it holds there: the driver's
	// count once ready, its share of the estimate before. VRAMBytes is
	// their sum. Absent for a worker on one device (GPUDevice).
	Devices []WorkerDevice `json:"devices,omitempty"`
	// Pod and Node are, for a worker that is a Kubernetes Pod (queen
	// --kubernetes), its Pod (NAMESPACE/NAME) and the node it runs on.
	Pod       string     `json:"pod,omitempty"`
	Node      string     `json:"node,omitempty"`
	URI       string     `json:"uri"`
	Status    string     `json:"status"`
	Reason    string     `json:"reason,omitempty"`
	PID       int        `json:"pid"`
	ExitCode  *int       `json:"exit_code,omitempty"`
	InFlight  int        `json:"in_flight"`
	StartedAt time.Time  `json:"started_at"`
	ReadyAt   *time.Time `json:"ready_at,omitempty"`
	StoppedAt *time.Time `json:"stopped_at,omitempty"`
	// LastUsedAt is when the worker last finished a request through the
	// queen (its listings only; absent: never since the queen started).
	LastUsedAt *time.Time `json:"last_used_at,omitempty"`
	// IdleTimeoutMS is how long the hive lets the worker stay ready with
	// no request before it stops it (0 or absent: never).
	IdleTimeoutMS int64 `json:"idle_timeout_ms,omitempty"`
	// History is the worker's last transitions (lifecycle.HistoryLimit at
	// most), in the hive's own API only: heartbeats and events leave it
	// out. Transitions counts them all.
	History     []Transition `json:"history,omitempty"`
	Transitions int          `json:"transitions,omitempty"`
}

// WorkerDevice is one device of a split worker and what it holds there.
type WorkerDevice struct {
	ID        int    `json:"id"`
	VRAMBytes uint64 `json:"vram_bytes"`
}

// DeviceIDs are every device w runs on: Devices' ids, or GPUDevice.
func (w Worker) DeviceIDs() []int {
	if len(w.Devices) == 0 {
		return []int{w.GPUDevice}
	}
	ids := make([]int, len(w.Devices))
	for i, d := range w.Devices {
		ids[i] = d.ID
	}
	return ids
}

// On says whether w runs on device id and what it holds there: its entry
// of Devices, or VRAMBytes on GPUDevice (0 while it starts: the caller
// counts its estimate).
func (w Worker) On(id int) (uint64, bool) {
	if len(w.Devices) == 0 {
		return w.VRAMBytes, w.GPUDevice == id
	}
	for _, d := range w.Devices {
		if d.ID == id {
			return d.VRAMBytes, true
		}
	}
	return 0, false
}

// Brief is w without its history: what the hive sends the queen in every
// heartbeat and event, so that a message's size does not grow with a
// worker's age.
func (w Worker) Brief() Worker {
	w.History = nil
	return w
}

// WorkerList is the answer of GET /v2/workers.
type WorkerList struct {
	Workers []Worker `json:"workers"`
}

// Device kinds.
const (
	DeviceCUDA = "cuda"
	DeviceCPU  = "cpu"
)

// GPU is one device of a node: an NVIDIA GPU, or the CPU with system memory
// as its budget when the node has no GPU.
type GPU struct {
	ID             int      `json:"id"`
	Kind           string   `json:"kind"`
	Name           string   `json:"name"`
	UUID           string   `json:"uuid,omitempty"`
	TotalBytes     uint64   `json:"total_vram_bytes"`
	FreeBytes      uint64   `json:"free_vram_bytes"`
	AllocatedBytes uint64   `json:"allocated_vram_bytes"`
	ReservedBytes  uint64   `json:"reserved_vram_bytes"`
	TemperatureC   *int     `json:"temperature_c,omitempty"`
	Workers        []string `json:"workers"`
	// Unusable says why no worker can be placed on the device (no GPU
	// backend, a driver too old, memory a stopped worker did not give
	// back); absent when workers can use it.
	Unusable string `json:"unusable,omitempty"`
}

// GPUList is the answer of GET /v2/gpus.
type GPUList struct {
	GPUs []GPU `json:"gpus"`
}

// Model is one GGUF in a hive's models dir.
type Model struct {
	Ref string `json:"ref"`
	// Names are the names the queen's --config gives the model whose file
	// this is (the queen's listings only); absent when it names none.
	Names        []string  `json:"names,omitempty"`
	SizeBytes    int64     `json:"size_bytes"`
	ModifiedAt   time.Time `json:"modified_at"`
	Architecture string    `json:"architecture,omitempty"`
	// EstimateBytes is the memory a worker of the model needs at the
	// hive's context size, as the hive checks it before a start (weights,
	// KV cache, compute buffers); absent from an older hive. Placement
	// counts the larger of it and SizeBytes.
	EstimateBytes int64 `json:"estimate_bytes,omitempty"`
	// Engines are the hive's engines that can be asked to run the model
	// (every engine the hive has); absent from an older hive: builtin
	// only.
	Engines []string `json:"engines,omitempty"`
	// ParameterCount is the elements of all the model's tensors, and
	// FileType its GGUF file type (F16, Q4_K_M …), as its header says;
	// absent from an older hive.
	ParameterCount uint64 `json:"parameter_count,omitempty"`
	FileType       string `json:"file_type,omitempty"`
	// Digest is "sha256:<hex>" of the model's bytes, once the hive has
	// hashed the file (it does so in the background after it is first
	// listed); absent until then.
	Digest string `json:"digest,omitempty"`
	// Pooling is the pooling the model's GGUF names, as llama.cpp names
	// it ("mean", "rank" …), or PoolingUnspecified when it names none;
	// absent from an older hive. A reranker's is "rank": the queen
	// refuses a rerank of a model whose Pooling is another.
	Pooling string `json:"pooling,omitempty"`
	// Vision says that the model has a vision projector beside it
	// (mmproj-REF.gguf): its workers read images.
	Vision bool `json:"vision,omitempty"`
}

// PoolingUnspecified is Model.Pooling of a GGUF that names no pooling
// (llama.cpp's LLAMA_POOLING_TYPE_UNSPECIFIED).
const PoolingUnspecified = "unspecified"

// ModelList is the answer of GET /v2/models.
type ModelList struct {
	Models []Model `json:"models"`
}

// RegisterPool is the body of the queen's POST /v2/pools/register.
type RegisterPool struct {
	PoolID   string `json:"pool_id"`
	Endpoint string `json:"endpoint"`
	NodeID   string `json:"node_id"`
	Version  string `json:"version"`
	GPUs     []GPU  `json:"gpus"`
	// MaxLoaded is the most live workers the hive runs at once (its
	// --max-loaded; 0 or absent: no limit but memory). The queen places
	// no more there, and evicts idle ones to make room.
	MaxLoaded int `json:"max_loaded,omitempty"`
	// Instance is drawn at random when the hive process starts (absent
	// from an older hive): the queen tells the same hive registering
	// again from another hive that claims the same pool id by it (and by
	// the endpoint). Every later call of the hive to the queen carries it
	// in the HiveInstanceHeader.
	Instance string `json:"instance,omitempty"`
}

// HiveInstanceHeader carries a hive's Instance on its calls to the queen
// after the registration (heartbeats, the heartbeat stream, events, going
// offline): the queen refuses them (409 pool_id_in_use) when another
// hive holds the pool now.
const HiveInstanceHeader = "X-Apiary-Hive-Instance"

// QueenEpochHeader carries the fencing epoch of the queen on its commands
// to a hive. A hive refuses (409 stale_queen) a command of an epoch older
// than the newest it has seen, in a command or a heartbeat's answer
// (HeartbeatAnswer.QueenEpoch): that queen was deposed.
const QueenEpochHeader = "X-Apiary-Queen-Epoch"

// WorkerTokens is the answer of a hive's GET /v2/workers/tokens: its live
// workers' own bearer tokens by worker id, for the queen only.
type WorkerTokens struct {
	WorkerTokens map[string]string `json:"worker_tokens"`
	// Instance is the answering hive process's (RegisterPool.Instance):
	// a restarted queen that hears it from a pool's holder routes to the
	// pool again before its next heartbeat.
	Instance string `json:"instance,omitempty"`
}

// Heartbeat is the body of the queen's POST /v2/pools/{id}/heartbeat.
type Heartbeat struct {
	GPUs    []GPU    `json:"gpus"`
	Workers []Worker `json:"workers"`
	// WorkerTokens are the live workers' own bearer tokens by worker id:
	// the queen needs them to send requests to the workers. They travel
	// only from hive to queen, never in a listing.
	WorkerTokens map[string]string `json:"worker_tokens,omitempty"`
	// Unchanged says that the devices, workers and tokens are those of
	// the hive's last heartbeat that the queen took whole; such a beat
	// carries nothing else. It only renews the lease: a queen that does
	// not hold that heartbeat (it restarted, or the pool registered again
	// or went unhealthy since) answers FullWanted and renews nothing.
	Unchanged bool `json:"unchanged,omitempty"`
	// Load is the node's load now (CPU, memory, GPU utilisation), sent
	// on a full or an unchanged beat at most every LoadEverySeconds the
	// queen's last answer asked for; absent otherwise.
	Load *NodeLoad `json:"load,omitempty"`
}

// NodeLoad is a hive's node as loaded now, read from /proc and the GPU
// driver: what the dashboard graphs per node.
type NodeLoad struct {
	// CPUPercent is the node's CPU time spent busy since the hive's last
	// load, over all its cores (0–100); absent when it cannot be read.
	CPUPercent *float64 `json:"cpu_percent,omitempty"`
	// MemTotalBytes and MemAvailableBytes are /proc/meminfo's MemTotal
	// and MemAvailable; 0 when they cannot be read.
	MemTotalBytes     uint64 `json:"mem_total_bytes,omitempty"`
	MemAvailableBytes uint64 `json:"mem_available_bytes,omitempty"`
	// GPUs are the devices' utilisation, for those whose driver reports
	// one (NVML), by device id.
	GPUs []GPULoad `json:"gpus,omitempty"`
}

// GPULoad is one device's utilisation: the percent of the last sample
// period its driver saw a kernel running.
type GPULoad struct {
	ID          int `json:"id"`
	UtilPercent int `json:"util_percent"`
}

// decodeKnown takes an unchanged heartbeat without the JSON decoder
// (Decode: knownBodies), as it would: the body Go's encoder writes for
// Heartbeat{Unchanged: true} (what hives send, every second when nothing
// changes), and the shortest one.
func (h *Heartbeat) decodeKnown(b []byte) bool {
	switch string(b) {
	case `{"gpus":null,"workers":null,"unchanged":true}`:
		h.GPUs, h.Workers, h.Unchanged = nil, nil, true
	case `{"unchanged":true}`:
		h.Unchanged = true
	default:
		return false
	}
	return true
}

// HeartbeatAnswer is the queen's 200 to a heartbeat: the pool's status,
// and the worker entries it refused (each alone, with why; the rest of the
// heartbeat was taken).
type HeartbeatAnswer struct {
	PoolID  string          `json:"pool_id"`
	Status  string          `json:"status"`
	Refused []RefusedWorker `json:"refused,omitempty"`
	// FullWanted answers an unchanged beat that the queen could not take:
	// the hive sends its full heartbeat at once.
	FullWanted bool `json:"full_wanted,omitempty"`
	// QueenEpoch is the fencing epoch of the queen that answered (0: a
	// queen without one, on SQLite): the hive refuses commands of an
	// older epoch from then on (QueenEpochHeader).
	QueenEpoch int64 `json:"queen_epoch,omitempty"`
	// LoadEverySeconds asks the hive for its node's load (Heartbeat.Load)
	// at most this often; 0 (an older queen): never.
	LoadEverySeconds int `json:"load_every_s,omitempty"`
}

// RefusedWorker is one worker entry of a heartbeat the queen refused.
type RefusedWorker struct {
	WorkerID string `json:"worker_id"`
	Reason   string `json:"reason"`
}

// WorkerEvent is one transition the hive pushes to the queen's
// POST /v2/internal/workers/events as it happens.
type WorkerEvent struct {
	// Kind is "" for a transition (From, To); EventMemoryLeaked for a
	// worker whose GPU memory the driver did not give back (Reason says
	// what holds it; From and To are not set).
	Kind        string    `json:"kind,omitempty"`
	PoolID      string    `json:"pool_id"`
	WorkerID    string    `json:"worker_id"`
	LifecycleID string    `json:"lifecycle_id,omitempty"`
	From        string    `json:"from"`
	To          string    `json:"to"`
	Reason      string    `json:"reason"`
	At          time.Time `json:"at"`
	Worker      Worker    `json:"worker"`
	// WorkerToken is the worker's own bearer token while it lives (see
	// Heartbeat.WorkerTokens).
	WorkerToken string `json:"worker_token,omitempty"`
}

// EventMemoryLeaked is the WorkerEvent kind of memory a GPU's driver did
// not give back after a worker ended; the queen audits it as
// worker.memory_leaked.
const EventMemoryLeaked = "memory_leaked"

// WorkerHealth is the worker's GET /health answer as the hive reads it.
// Fields the hive does not need are left out; decoding ignores them.
type WorkerHealth struct {
	Status        string     `json:"status"`
	Model         string     `json:"model"`
	InFlight      int        `json:"in_flight"`
	LastRequestAt *time.Time `json:"last_request_at"`
}

// PullModelRequest is the body of the hive's POST /v2/models/pull and of
// the queen's POST /api/admin/pools/{id}/models/pull.
type PullModelRequest struct {
	// Ref is what to pull: hf://ORG/REPO:QUANT, hf://ORG/REPO/FILE.gguf,
	// hf.co/ORG/REPO:QUANT, or an http(s) URL of a GGUF file.
	Ref string `json:"ref"`
	// Name is the model's ref; default the file name without ".gguf".
	Name string `json:"name,omitempty"`
	// Force replaces a model of the same name.
	Force bool `json:"force,omitempty"`
	// Exact asks that the model be served as Name: a split model, served
	// as its first part's name (NAME-00001-of-0000N), is refused unless
	// Name is that name. The queen sets it for a configured model, whose
	// file must be what the hive lists.
	Exact bool `json:"exact,omitempty"`
	// Reason goes to the queen's audit log (the queen's endpoint only).
	Reason string `json:"reason,omitempty"`
}

// The states of a ModelPull.
const (
	PullRunning = "pulling"
	PullDone    = "pulled"
	PullFailed  = "failed"
)

// ModelPull is one pull of a model on a hive, as GET /v2/models/pulls
// shows it.
type ModelPull struct {
	ID     string `json:"id"`
	PoolID string `json:"pool_id,omitempty"`
	Ref    string `json:"ref"`
	// Model is the ref the model has once pulled.
	Model        string     `json:"model"`
	State        string     `json:"state"` // PullRunning, PullDone or PullFailed
	WrittenBytes int64      `json:"written_bytes"`
	ResumedBytes int64      `json:"resumed_bytes,omitempty"` // of WrittenBytes, kept from an earlier attempt
	TotalBytes   int64      `json:"total_bytes"`             // -1 while unknown
	Error        string     `json:"error,omitempty"`
	StartedAt    time.Time  `json:"started_at"`
	EndedAt      *time.Time `json:"ended_at,omitempty"`
}

// ModelPullList is the answer of GET /v2/models/pulls.
type ModelPullList struct {
	Pulls []ModelPull `json:"pulls"`
}

// PoolModels is one pool's models, as the queen last read them from its
// hive.
type PoolModels struct {
	PoolID string  `json:"pool_id"`
	Models []Model `json:"models"`
}

// PoolModelsList is the answer of the queen's GET /api/admin/pools/models.
type PoolModelsList struct {
	Pools []PoolModels `json:"pools"`
}
