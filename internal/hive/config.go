package hive

import (
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/apiary-llm/apiary/internal/config"
	"github.com/apiary-llm/apiary/internal/datadir"
	"github.com/apiary-llm/apiary/internal/gpu"
	"github.com/apiary-llm/apiary/internal/kube"
	"github.com/apiary-llm/apiary/internal/modelstore"
	"github.com/apiary-llm/apiary/internal/secret"
	"github.com/apiary-llm/apiary/internal/transport"
)

// Config is everything a hive needs. Zero values take the contract's
// defaults (see Default); Validate says what is wrong with the rest.
type Config struct {
	Addr      string // listen address, default 127.0.0.1:9200
	Advertise string // URL others use to reach this hive; default http://Addr
	DataDir   string // holds the hive's records and worker logs
	ModelsDir string // GGUF files; default DataDir/models

	// WorkerPath is the binary run as a worker (default: this executable)
	// with WorkerArgs before the worker flags (default: ["worker"]) and
	// WorkerEnv added to the worker's environment (see PassEnv).
	WorkerPath string
	WorkerArgs []string
	WorkerEnv  []string
	// PassEnv names the variables of the hive's environment that its
	// workers, engine fronts and engines get besides the allow-list of
	// secret.ChildEnv (PATH, HOME, locale, CUDA_*, …): NAME, or PREFIX*
	// for every variable that starts with PREFIX (secret.CheckPassEnv);
	// default none. No secret of apiary's passes, whatever it names.
	PassEnv []string
	// FrontPath is the apiary binary run as an external engine's front
	// (default: this executable), with FrontArgs before its flags
	// (default: ["engine-front"]).
	FrontPath string
	FrontArgs []string
	// Engines are the external engines this hive can run besides the
	// built-in one, by name (LoadEngines reads them from a file); default
	// none.
	Engines map[string]Engine
	// WorkerHost is the address workers bind; default the host of Addr
	// (127.0.0.1 when Addr's host is empty or unspecified).
	WorkerHost string
	// PortMin..PortMax is the range worker ports are taken from.
	PortMin, PortMax int
	// CtxSize is passed to workers as --ctx-size and sizes the memory
	// estimate; 0 lets the worker choose (trained context, at most 4096).
	CtxSize int
	// WorkerThreads is passed to workers as --threads (0: the worker's
	// default, one per CPU). llama.cpp's threads spin-wait for each other,
	// so workers sharing a CPU node should split its cores between them.
	WorkerThreads int
	// SplitMode is how a worker split over several GPUs splits its model:
	// "layer" (default: whole layers on each, in proportion to their free
	// memory) or "row" (each layer's rows; needs CUDA's split buffers).
	SplitMode string
	// WorkerSlots is passed to workers as --slots (0: the worker's
	// default, 1): generations one worker runs at once. A queen routing to
	// these workers should be told the same (its --worker-slots).
	WorkerSlots int

	CallbackTimeout time.Duration // ready callback deadline after spawn
	HealthInterval  time.Duration // /health probe period
	HealthFailures  int           // consecutive misses before failed
	StopGrace       time.Duration // graceful stop budget before SIGTERM
	ShutdownAck     time.Duration // wait for a worker's ack, and SIGTERM → SIGKILL
	IdleTimeout     time.Duration // negative disables the idle timeout
	// LogRetention removes the log files of ended workers last written
	// longer ago, at start and hourly; default DefaultLogRetention,
	// negative keeps them forever.
	LogRetention      time.Duration
	HeartbeatInterval time.Duration
	// PullStallTimeout drops a model pull's connection that sends no byte
	// for this long, and resumes the download from where it was; default
	// modelstore.DefaultStallTimeout (60s).
	PullStallTimeout time.Duration

	QueenURL string // empty: standalone; URL1,URL2…: queens on one database, the active one followed
	// PoolID is the pool the hive registers; default NodeID when NodeID
	// is set, else the host name and a hash of the machine id
	// (defaultPoolID): the host name alone is shared by cloned machines
	// and containers, and a queen refuses a second live hive with the
	// same pool id.
	PoolID       string
	NodeID       string // default: host name
	ClusterToken string // bearer for the queen and for the hive's own API
	// HFToken is the Hugging Face token of the hive's pulls, handed on
	// its lifeline by the queen that started it; default $HF_TOKEN.
	HFToken string

	MaxBodyBytes int64 // request body limit, default 1 MiB

	// TLS, when its files are set, serves HTTPS only, and the workers
	// serve HTTPS with the same certificate; default plain HTTP.
	TLS transport.ServerTLS

	// Owner is who started the hive (see lifeline.go): OwnerOperator
	// (default), OwnerQueen or OwnerKeeper. A hive another process owns
	// shuts down when Lifeline ends or its lease on the queen does.
	Owner string
	// Lifeline, when set, is read until it ends; its end means the parent
	// is gone. The hive closes it when it stops.
	Lifeline io.ReadCloser
	// LeaseTimeout, when positive, ends the hive when no heartbeat to the
	// queen was answered for this long (the queen's --heartbeat-timeout).
	LeaseTimeout time.Duration

	// ReleaseTimeout is how long the hive waits, after a GPU worker ended,
	// for the driver to give its memory back before it marks the device
	// unusable (memory leaked); ReleasePoll is how often it asks the
	// driver meanwhile; ReleaseTolerance is how much more memory than
	// before the worker no process may hold, and still count as back.
	ReleaseTimeout   time.Duration
	ReleasePoll      time.Duration
	ReleaseTolerance uint64

	// CPUMemory caps the memory the CPU device offers workers (0: the
	// machine's), so that a CPU node behaves as a GPU of that size.
	CPUMemory uint64
	// KVCacheDisk bounds, in bytes, the KV caches this hive's workers
	// save under DATA_DIR/hive/kvcache when they stop gracefully (an
	// eviction among them), for the next worker of the model to restore
	// (least recently used saves removed first). Default 0: workers save
	// nothing, and saves left on disk are removed at start; `apiary hive`
	// sets 2 GiB (--kv-cache-disk).
	KVCacheDisk uint64
	// MaxLoaded is the most live workers the hive runs at once (0: no
	// limit but memory); a start past it is refused (ErrMaxLoaded), and
	// the queen, told at registration, evicts idle workers instead.
	MaxLoaded int

	// Kube, when set, runs the workers as Pods of a Kubernetes cluster
	// (package kube): the cluster's nodes are the hive's devices, a
	// worker's Pod its process; default nil, local processes.
	Kube *kube.Config

	Devices gpu.Inventory // default gpu.Detect
	Logger  *slog.Logger  // default slog.Default()
}

// MaxMaxLoaded bounds --max-loaded.
const MaxMaxLoaded = 10000

// Defaults from the contract's timing table.
const (
	DefaultAddr              = "127.0.0.1:9200"
	DefaultCallbackTimeout   = 60 * time.Second
	DefaultHealthInterval    = 10 * time.Second
	DefaultHealthFailures    = 3
	DefaultStopGrace         = 30 * time.Second
	DefaultShutdownAck       = 5 * time.Second
	DefaultIdleTimeout       = 5 * time.Minute
	DefaultLogRetention      = 30 * 24 * time.Hour
	DefaultHeartbeatInterval = 10 * time.Second
	DefaultPortMin           = 8001
	DefaultPortMax           = 8999
	DefaultMaxBodyBytes      = 1 << 20
	DefaultReleaseTimeout    = 30 * time.Second
	DefaultReleasePoll       = 500 * time.Millisecond
	DefaultReleaseTolerance  = 256 << 20
)

// DefaultDataDir is $XDG_DATA_HOME/apiary, or ~/.local/share/apiary.
func DefaultDataDir() string { return datadir.Default() }

// withDefaults returns c with every zero field set to its default. The
// timing fields keep an explicit value; IdleTimeout < 0 disables it.
func (c Config) withDefaults() Config {
	config.Default(&c.Addr, DefaultAddr)
	config.Default(&c.DataDir, DefaultDataDir())
	config.Default(&c.ModelsDir, filepath.Join(c.DataDir, "models"))
	config.Default(&c.SplitMode, "layer")
	if c.WorkerArgs == nil {
		c.WorkerArgs = []string{"worker"}
	}
	if c.FrontArgs == nil {
		c.FrontArgs = []string{"engine-front"}
	}
	if c.PortMin == 0 && c.PortMax == 0 {
		c.PortMin, c.PortMax = DefaultPortMin, DefaultPortMax
	}
	config.Default(&c.CallbackTimeout, DefaultCallbackTimeout)
	config.Default(&c.HealthInterval, DefaultHealthInterval)
	config.Default(&c.StopGrace, DefaultStopGrace)
	config.Default(&c.ShutdownAck, DefaultShutdownAck)
	config.Default(&c.IdleTimeout, DefaultIdleTimeout)
	config.Default(&c.LogRetention, DefaultLogRetention)
	config.Default(&c.HeartbeatInterval, DefaultHeartbeatInterval)
	config.Default(&c.PullStallTimeout, modelstore.DefaultStallTimeout)
	config.Default(&c.HealthFailures, DefaultHealthFailures)
	config.Default(&c.ReleaseTimeout, DefaultReleaseTimeout)
	config.Default(&c.ReleasePoll, DefaultReleasePoll)
	config.Default(&c.ReleaseTolerance, DefaultReleaseTolerance)
	if c.NodeID == "" {
		c.NodeID, _ = os.Hostname()
		if c.NodeID == "" {
			c.NodeID = "localhost"
		}
		config.Default(&c.PoolID, defaultPoolID(c.NodeID, machineID()))
	}
	config.Default(&c.PoolID, c.NodeID)
	config.Default(&c.MaxBodyBytes, DefaultMaxBodyBytes)
	config.Default(&c.Owner, OwnerOperator)
	config.Default(&c.Logger, slog.Default())
	return c
}

// Validate reports every problem with c (after defaults) at once, by
// field (config.FieldError).
func (c Config) Validate() error {
	var p config.Problems
	host, _, err := net.SplitHostPort(c.Addr)
	if err != nil {
		p.Add("Addr", "%q: %v", c.Addr, err)
	} else if c.ClusterToken == "" && !transport.IsLoopback(host) {
		p.Add("Addr", "%q is not a loopback address; set APIARY_CLUSTER_TOKEN to serve on it", c.Addr)
	}
	if err := secret.CheckToken(c.ClusterToken); err != nil {
		p.Add("ClusterToken", "%v", err)
	}
	if c.Kube != nil {
		switch {
		case len(c.Engines) > 0:
			p.Add("Kube", "external engines run as local processes; a hive whose workers are Kubernetes Pods runs only the built-in worker")
		case c.TLS.Enabled():
			p.Add("Kube", "TLS between the hive and worker Pods is not built; run the hive without TLS certificates")
		}
	}
	if err := secret.CheckPassEnv(c.PassEnv); err != nil {
		p.Add("PassEnv", "%v", err)
	}
	if c.SplitMode != "" && c.SplitMode != "layer" && c.SplitMode != "row" {
		p.Add("SplitMode", "%q: layer or row", c.SplitMode)
	}
	if c.Advertise != "" {
		if _, err := transport.CheckBaseURL("", c.Advertise); err != nil {
			p.Add("Advertise", "%s", strings.TrimSpace(err.Error()))
		}
	}
	if c.QueenURL != "" {
		if _, err := transport.BaseURLs("", c.QueenURL); err != nil {
			p.Add("QueenURL", "%s", strings.TrimSpace(err.Error()))
		}
	}
	if err := c.TLS.Validate(); err != nil {
		p.Add("TLS", "%v", err)
	}
	if c.PortMin < 1 || c.PortMax > 65535 || c.PortMin > c.PortMax {
		p.Add("PortMin", "%d-%d is not a range within 1-65535", c.PortMin, c.PortMax)
	}
	for _, d := range []struct {
		field string
		v     time.Duration
	}{{"CallbackTimeout", c.CallbackTimeout}, {"HealthInterval", c.HealthInterval}, {"StopGrace", c.StopGrace},
		{"ShutdownAck", c.ShutdownAck}, {"HeartbeatInterval", c.HeartbeatInterval}, {"PullStallTimeout", c.PullStallTimeout},
		{"ReleaseTimeout", c.ReleaseTimeout}, {"ReleasePoll", c.ReleasePoll}} {
		if d.v <= 0 {
			p.Add(d.field, "must be positive, got %s", d.v)
		}
	}
	if c.HealthFailures < 1 {
		p.Add("HealthFailures", "must be at least 1, got %d", c.HealthFailures)
	}
	for _, n := range []struct {
		field string
		v     int
	}{{"WorkerSlots", c.WorkerSlots}, {"WorkerThreads", c.WorkerThreads}, {"CtxSize", c.CtxSize}} {
		if n.v < 0 {
			p.Add(n.field, "must not be negative, got %d", n.v)
		}
	}
	if err := checkEngines(c.Engines); err != nil {
		p.Nest("", err)
	}
	if c.MaxBodyBytes < 1 {
		p.Add("MaxBodyBytes", "must be positive, got %d", c.MaxBodyBytes)
	}
	if !validOwner(c.Owner) {
		p.Add("Owner", "%q: want %s, %s or %s", c.Owner, OwnerOperator, OwnerQueen, OwnerKeeper)
	}
	switch {
	case c.LeaseTimeout < 0:
		p.Add("LeaseTimeout", "must not be negative, got %s", c.LeaseTimeout)
	case c.LeaseTimeout > 0 && c.QueenURL == "":
		p.Add("LeaseTimeout", "needs {QueenURL}: the lease is on the queen")
	case c.LeaseTimeout > 0 && c.LeaseTimeout <= c.HeartbeatInterval:
		p.Add("LeaseTimeout", "%s must be longer than {HeartbeatInterval} %s", c.LeaseTimeout, c.HeartbeatInterval)
	}
	if c.Owner == OwnerOperator && (c.Lifeline != nil || c.LeaseTimeout > 0) {
		p.Add("Owner", "%s: an operator's hive has no lifeline or lease: they belong to hives a queen or keeper started", c.Owner)
	}
	return p.Err()
}

func hostPort(host string, port int) string { return net.JoinHostPort(host, strconv.Itoa(port)) }

func splitHost(addr string) (host, port string, err error) { return net.SplitHostPort(addr) }

func isUnspecified(host string) bool {
	ip := net.ParseIP(host)
	return ip != nil && ip.IsUnspecified()
}

func mustAtoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}
