package worker

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/apiary-llm/apiary/internal/config"
	"github.com/apiary-llm/apiary/internal/engine"
	"github.com/apiary-llm/apiary/internal/secret"
	"github.com/apiary-llm/apiary/internal/transport"
)

// TokenEnv is the environment variable the worker's token comes from. It is
// never a flag: command lines are visible to every user of the machine.
const TokenEnv = secret.WorkerTokenEnv

// Defaults applied by Config.Validate to zero fields.
const (
	DefaultSlots            = 1
	DefaultQueuePerSlot     = 4 // QueueSize = 4 × Slots
	DefaultMaxBodyBytes     = 4 << 20
	DefaultShutdownGrace    = 30 * time.Second
	DefaultCallbackAttempts = 5
	DefaultCallbackBackoff  = 200 * time.Millisecond // doubled after each try: 5 tries span ~3 s
	DefaultCallbackTimeout  = 5 * time.Second
	DefaultRetryAfter       = time.Second
	DefaultClaimInterval    = 10 * time.Second
)

// Config configures a Worker. Validate fills defaults and checks it.
type Config struct {
	// WorkerID names this worker in logs and in the ready callback. Required
	// with a CallbackURL; "standalone" otherwise.
	WorkerID string
	// ModelPath is the GGUF file to serve.
	ModelPath string
	// ModelRef is the model id clients use; default: ModelPath's file name
	// without ".gguf".
	ModelRef string
	// Addr is the host:port to listen on; port 0 picks a free one (see
	// Worker.Addr). Without a Token the host must be a loopback address.
	Addr string
	// Listener, when set, is the socket to serve on instead of binding
	// Addr (a hive binds the port and hands it over, so that no other
	// process can take it in between); Addr must then be its address.
	Listener net.Listener
	// CallbackURL, when set, receives the ready callback once the model is
	// loaded; without it the worker serves standalone.
	CallbackURL string
	// QueenURL, when set, makes this a worker run by hand: once the model
	// is loaded it claims a row at the queen (POST /v2/workers/claim,
	// with ClusterToken) instead of a hive's ready callback, and reports
	// its drain and stop there. Not with CallbackURL. Several queens
	// sharing one PostgreSQL database, comma-separated: the worker
	// follows the active one, as a hive does.
	QueenURL string
	// ClaimInterval is how often a worker run by hand (QueenURL) sends
	// its claim again once its row is claimed, so that a restarted queen,
	// which keeps workers' tokens in memory only, learns its token again
	// and routes to it (default 10s).
	ClaimInterval time.Duration
	// ClusterToken authenticates the calls to QueenURL (the queen's
	// APIARY_CLUSTER_TOKEN); "" for a queen without tokens.
	ClusterToken string
	// LifecycleID is the queen's lifecycle row id. With QueenURL it is the
	// row this worker claims (one created with placement operator);
	// without it the queen creates a row for the worker. Otherwise it
	// only appears in logs.
	LifecycleID string
	// Advertise is the URL others reach the worker at, sent in the ready
	// callback or the claim; default the scheme and listening address.
	Advertise string
	// KVCacheDir, when set, is where the worker saves its slots' KV
	// cache when it stops gracefully and restores it from before it
	// serves (see package kvcache); a hive passes DATA_DIR/kvcache.
	// Default "": no save, no restore.
	KVCacheDir string
	// KVCacheDisk bounds the saves under KVCacheDir in bytes: after a
	// save the least recently used ones past it are removed. Required
	// (positive) with a KVCacheDir.
	KVCacheDisk int64
	// CPUBackend is the level of llama.cpp's CPU backend this worker
	// loaded (haswell, skylakex, …; see internal/cpuvariant) and
	// CPUBackendReason why; they are logged at start.
	CPUBackend, CPUBackendReason string
	// Token authenticates the ready callback, and every request but
	// /health must carry it (see Handler). It comes from TokenEnv.
	Token string
	// TLS, when its files are set, serves HTTPS only; default plain HTTP.
	TLS transport.ServerTLS
	// Slots is the number of generations run at once (default 1).
	Slots int
	// QueueSize is how many requests may wait for a slot (default 4 ×
	// Slots); one more is refused with 503 and Retry-After. Negative means
	// no queue.
	QueueSize int
	// MaxBodyBytes bounds request bodies (default 4 MiB); larger → 413.
	MaxBodyBytes int64
	// ShutdownGrace is how long in-flight generations may run after a
	// shutdown began before they are cancelled (default 30s).
	ShutdownGrace time.Duration
	// TestHoldDir is a test knob, off when empty (the default): while a
	// file named ModelRef (or ModelRef@LifecycleID, for this worker
	// alone) exists in it, every generation waits before each
	// piece of text after the first it sent, at most MaxTestHold in all
	// (the tokens stay in the answer), so that a test
	// holds a stream open as long as it needs whatever the CPU's speed.
	// cmd/apiary takes it from $APIARY_TEST_HOLD_DIR (TestHoldEnv); it is
	// never for production.
	TestHoldDir string
	// CallbackAttempts, CallbackBackoff and CallbackTimeout bound the ready
	// callback: tries, the first pause between tries (doubled each time),
	// and the time one try may take.
	CallbackAttempts int
	CallbackBackoff  time.Duration
	CallbackTimeout  time.Duration
	// RetryAfter is sent with 503 answers (queue full, model loading).
	RetryAfter time.Duration
	// Engine configures the model load; ModelPath and Slots are copied from
	// the fields above.
	Engine engine.Options
	// Logger receives the worker's logs; worker_id is added to every line.
	Logger *slog.Logger
}

// Validate fills defaults and reports the first problem. Errors wrap
// ErrInvalidConfig.
func (c *Config) Validate() error {
	if c.ModelPath == "" {
		return fmt.Errorf("%w: the model path is required", ErrInvalidConfig)
	}
	config.Default(&c.ModelRef, strings.TrimSuffix(filepath.Base(c.ModelPath), ".gguf"))
	config.Default(&c.Engine.Projector, PairedProjector(c.ModelPath))
	if c.KVCacheDir != "" && c.KVCacheDisk <= 0 {
		return fmt.Errorf("%w: a KV cache directory needs a positive disk budget", ErrInvalidConfig)
	}
	if c.CallbackURL != "" {
		if _, err := transport.CheckURL("callback URL", c.CallbackURL); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
		if c.WorkerID == "" {
			return fmt.Errorf("%w: a worker id is required with a callback URL", ErrInvalidConfig)
		}
	}
	if c.QueenURL != "" {
		if c.CallbackURL != "" {
			return fmt.Errorf("%w: a worker reports to its hive (callback URL) or claims a row at the queen (queen URL), not both", ErrInvalidConfig)
		}
		if _, err := transport.BaseURLs("queen URL", c.QueenURL); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
	}
	if c.Advertise != "" {
		if _, err := transport.CheckBaseURL("advertised URL", c.Advertise); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
	}
	if c.WorkerID == "" && c.QueenURL != "" {
		c.WorkerID = "hand-run"
	}
	config.Default(&c.WorkerID, "standalone")
	if c.Addr == "" {
		return fmt.Errorf("%w: the listen address is required", ErrInvalidConfig)
	}
	host, _, err := net.SplitHostPort(c.Addr)
	if err != nil {
		return fmt.Errorf("%w: listen address %q: %w", ErrInvalidConfig, c.Addr, err)
	}
	if c.Token == "" && !transport.IsLoopback(host) {
		return fmt.Errorf("%w: without %s the worker binds loopback only; %q is not a loopback address", ErrInvalidConfig, TokenEnv, host)
	}
	for _, tok := range []struct{ env, v string }{{TokenEnv, c.Token}, {secret.ClusterTokenEnv, c.ClusterToken}} {
		if err := secret.CheckToken(tok.v); err != nil {
			return fmt.Errorf("%w: %s %w", ErrInvalidConfig, tok.env, err)
		}
	}
	if err := c.TLS.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	config.Default(&c.Slots, DefaultSlots)
	if c.Slots < 0 {
		return fmt.Errorf("%w: slots must be at least 1, got %d", ErrInvalidConfig, c.Slots)
	}
	switch {
	case c.QueueSize == 0:
		c.QueueSize = DefaultQueuePerSlot * c.Slots
	case c.QueueSize < 0:
		c.QueueSize = 0
	}
	config.Default(&c.MaxBodyBytes, DefaultMaxBodyBytes)
	config.Default(&c.ShutdownGrace, DefaultShutdownGrace)
	config.Default(&c.CallbackAttempts, DefaultCallbackAttempts)
	config.Default(&c.CallbackBackoff, DefaultCallbackBackoff)
	config.Default(&c.CallbackTimeout, DefaultCallbackTimeout)
	config.Default(&c.RetryAfter, DefaultRetryAfter)
	config.Default(&c.ClaimInterval, DefaultClaimInterval)
	if c.MaxBodyBytes < 0 || c.ShutdownGrace < 0 || c.CallbackAttempts < 0 || c.CallbackBackoff < 0 || c.CallbackTimeout < 0 || c.RetryAfter < 0 ||
		c.ClaimInterval < 0 {
		return fmt.Errorf("%w: sizes, durations and attempts must not be negative", ErrInvalidConfig)
	}
	if c.Engine.CtxSize < 0 || c.Engine.Threads < 0 {
		return fmt.Errorf("%w: context size and threads must not be negative", ErrInvalidConfig)
	}
	c.Engine.ModelPath = c.ModelPath
	c.Engine.Slots = c.Slots
	config.Default(&c.Logger, slog.New(slog.DiscardHandler))
	return nil
}

// PairedProjector is the vision projector that goes with the model at
// path by name: mmproj-M.gguf beside M.gguf, "" when there is none.
func PairedProjector(path string) string {
	p := filepath.Join(filepath.Dir(path), "mmproj-"+filepath.Base(path))
	if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
		return p
	}
	return ""
}

// ErrInvalidConfig wraps every Validate error.
var ErrInvalidConfig = errors.New("invalid configuration")
