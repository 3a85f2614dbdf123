package api

import "time"

// This file holds the queen's SSH nodes (/api/admin/nodes) and its
// cascading shutdown (/api/admin/shutdown).

// AddNodeRequest is the body of POST /api/admin/nodes.
type AddNodeRequest struct {
	Name       string `json:"name"`
	SSH        string `json:"ssh"`                   // USER@HOST[:PORT]
	InstallDir string `json:"install_dir,omitempty"` // default ~/.local/bin
	HivePort   *int   `json:"hive_port,omitempty"`   // default 9200; 0: any free port
	Reason     string `json:"reason,omitempty"`
	// TLS files on the node, for its hive (and its workers): required
	// when the queen serves TLS. CAFile is what the hive trusts besides
	// the node's system roots (the cluster's CA).
	TLSCert string `json:"tls_cert,omitempty"`
	TLSKey  string `json:"tls_key,omitempty"`
	CAFile  string `json:"ca_file,omitempty"`
}

// States of the hive a queen runs on a node.
const (
	HiveConnecting = "connecting" // probing the node, copying apiary
	HiveRunning    = "running"    // the hive process (or its SSH session) is up
	HiveRetrying   = "retrying"   // it failed or ended; the queen tries again after a pause
	HiveExternal   = "external"   // a hive the queen did not start serves the pool: left alone
	HiveStopping   = "stopping"   // cascading: the hive stops its workers, then exits
	HiveStopped    = "stopped"
)

// Node is one entry of GET /api/admin/nodes: a machine the queen starts a
// hive on, and that hive's state. The local hive of an ephemeral queen is
// listed too, with Local set.
type Node struct {
	Name       string    `json:"name"`
	SSH        string    `json:"ssh,omitempty"`
	InstallDir string    `json:"install_dir,omitempty"`
	HivePort   int       `json:"hive_port"`
	Local      bool      `json:"local,omitempty"`
	CreatedAt  time.Time `json:"created_at"`
	PoolID     string    `json:"pool_id"`
	Hive       NodeHive  `json:"hive"`
}

// NodeHive is the state of the hive the queen owns on a node.
type NodeHive struct {
	State    string    `json:"state"`
	Message  string    `json:"message,omitempty"`
	PID      int       `json:"pid,omitempty"` // the local process: ssh, or the local hive
	Since    time.Time `json:"since"`
	Starts   int       `json:"starts"`
	Version  string    `json:"version,omitempty"` // apiary on the node
	NodeAddr string    `json:"node_addr,omitempty"`
}

// NodeList is the answer of GET /api/admin/nodes, by name.
type NodeList struct {
	Nodes []Node `json:"nodes"`
}

// ShutdownRequest is the optional body of POST /api/admin/shutdown.
type ShutdownRequest struct {
	Reason string `json:"reason,omitempty"`
}

// ShutdownResponse answers POST /api/admin/shutdown (202): the queen
// stops the hives it started (each stops its workers first), then exits.
// Hives it did not start are left running.
type ShutdownResponse struct {
	Status string   `json:"status"` // shutting_down
	Hives  []string `json:"hives"`  // the nodes whose hives it stops
}

// PoolHeader on an OpenAI request pins it to one pool (`apiary infer
// --node NAME`: a node's pool id is its name): the queen serves it only
// with workers of that pool, and places a new worker there when none runs.
const PoolHeader = "X-Apiary-Pool"

// Headers of the OpenAI endpoints.
const (
	// SessionHeader pins a conversation to the worker that served it.
	SessionHeader = "X-Session-Id"
	// WorkerHeader names the lifecycle row of the worker that answered.
	WorkerHeader = "X-Apiary-Worker"
	// BatchHeader (value "1") marks a request the queen sends a worker for
	// the Batch API: its prompt yields to interactive requests' prompts.
	BatchHeader = "X-Apiary-Batch"
	// ModelNameHeader, on a request the queen relays to a worker, is the
	// model name the client sent when the queen resolved it (a configured
	// name or alias) to the worker's file: the worker answers with it, as
	// clients match the answer's model against what they asked for.
	ModelNameHeader = "X-Apiary-Model-Name"
	// ActiveQueenHeader, on a standby queen's 503, is the advertised URL
	// of the queen that holds the database.
	ActiveQueenHeader = "X-Apiary-Active-Queen"
	// PrefixTrailer is the trailer of a worker's generation answer that
	// tells the queen what its cache now holds (see FormatPrefixReport);
	// the queen reads it and does not pass it on.
	PrefixTrailer = "X-Apiary-Prefix"
	// RouteHeader, on the queen's answer, says how the request was routed
	// and why (`--routing`).
	RouteHeader = "X-Apiary-Route"
)
