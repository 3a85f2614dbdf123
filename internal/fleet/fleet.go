package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/config"
	"github.com/apiary-llm/apiary/internal/openai"
	"github.com/apiary-llm/apiary/internal/procs"
	"github.com/apiary-llm/apiary/internal/registry"
	"github.com/apiary-llm/apiary/internal/secret"
	"github.com/apiary-llm/apiary/internal/sshnode"
	"github.com/apiary-llm/apiary/internal/store"
	"github.com/apiary-llm/apiary/internal/transport"
	"github.com/apiary-llm/apiary/internal/version"
)

// Fleet owns the hives a queen started: one supervisor goroutine per
// node (ownedHive.run), the only writer of that node's state. It starts
// them from the spawner's locked thread, with SIGTERM as their death
// signal: a queen that dies takes its local hive and its ssh sessions with
// it, and each hive cascades to its workers.
type Fleet struct {
	queen   Queen
	cfg     Config
	log     *slog.Logger
	spawner *procs.Spawner
	// started is when the fleet was made (as the queen started): a pool
	// that has not spoken to the queen since is as the store kept it.
	started time.Time

	binOnce sync.Once
	bin     sshnode.Binary
	binErr  error

	mu       sync.Mutex
	hives    map[string]*ownedHive // guarded by mu
	stopping bool                  // guarded by mu
	wg       sync.WaitGroup
}

// Queen is what the fleet needs of the queen that owns it.
type Queen interface {
	// URL is the queen's base URL for its hives.
	URL() string
	// Pool returns the registered pool id (a node's pool id is its name).
	Pool(id string) (registry.Pool, bool)
	// Deregister takes a pool offline: its hive stopped or exited.
	Deregister(ctx context.Context, poolID, reason string) error
	// Vacate takes a pool offline whose workers outlive its hive, for
	// the next hive to register and reconcile them.
	Vacate(ctx context.Context, poolID, reason string) error
	// PingHive asks the hive at endpoint (a pool's) whether it answers:
	// nil for any HTTP answer, an error wrapping syscall.ECONNREFUSED
	// when nothing listens there (holder.go).
	PingHive(ctx context.Context, endpoint string) error
	// Audit appends an entry to the audit log; a failure is the queen's
	// to log and count.
	Audit(ctx context.Context, e store.AuditEntry)
}

// Hives is how the queen runs the hives it owns: the operator's settings
// (queen.OwnershipConfig embeds them).
type Hives struct {
	// LocalHive starts a hive on this machine as the queen's child (pool
	// LocalPoolID), with its data in DataDir/local-hive.
	LocalHive bool
	// LocalWorkersOutlive says that the local hive's workers outlive it
	// (Kubernetes Pods, internal/kube): a local hive gone is no worker
	// gone, so its pool is not taken offline (its rows failed); the next
	// local hive adopts the Pods and its first heartbeat reconciles them.
	// Default false.
	LocalWorkersOutlive bool
	// HiveArgs are added to the command line of every hive the queen
	// starts (e.g. --worker-threads=1, --models-dir=DIR); they come after
	// the queen's own flags, so they override them.
	HiveArgs []string
	// PassEnv names the variables of the queen's environment that its
	// local hive gets besides the allow-list of secret.ChildEnv (NAME or
	// PREFIX*, secret.CheckPassEnv); every hive the queen starts gets
	// them as its own --pass-env, so that its workers and engines get
	// them from its environment too. Default none.
	PassEnv []string
	// Binary is the apiary run locally and copied to nodes; default this
	// executable.
	Binary string
	// SSH runs the system ssh client (ConfigFile is --ssh-config).
	SSH sshnode.Client
	// HiveStopTimeout bounds the wait for one hive's cascade when the
	// queen stops it; then its process (or SSH session) is killed.
	HiveStopTimeout time.Duration
	// RestartMin and RestartMax bound the pause before a hive of the
	// queen's is started again after it ended or could not start.
	RestartMin, RestartMax time.Duration
	// ProbeTimeout bounds each SSH probe and copy.
	ProbeTimeout time.Duration
}

// Defaults of Hives.
const (
	DefaultHiveStopTimeout = 60 * time.Second
	DefaultRestartMin      = time.Second
	DefaultRestartMax      = 30 * time.Second
	DefaultProbeTimeout    = 2 * time.Minute
)

// WithDefaults fills h's zero fields.
func (h Hives) WithDefaults() Hives {
	config.Default(&h.HiveStopTimeout, DefaultHiveStopTimeout)
	config.Default(&h.RestartMin, DefaultRestartMin)
	config.Default(&h.RestartMax, DefaultRestartMax)
	config.Default(&h.ProbeTimeout, DefaultProbeTimeout)
	return h
}

// Validate reports every problem with h (after defaults), by field.
func (h Hives) Validate() error {
	var p config.Problems
	for _, a := range h.HiveArgs {
		if !strings.HasPrefix(a, "--") || strings.ContainsAny(a, "\x00\r\n") {
			p.Add("HiveArgs", "%q: want one --flag or --flag=value", a)
		}
	}
	if err := secret.CheckPassEnv(h.PassEnv); err != nil {
		p.Add("PassEnv", "%v", err)
	}
	for _, d := range []struct {
		field string
		v     time.Duration
	}{{"HiveStopTimeout", h.HiveStopTimeout}, {"RestartMin", h.RestartMin}, {"ProbeTimeout", h.ProbeTimeout}} {
		if d.v <= 0 {
			p.Add(d.field, "must be positive, got %s", d.v)
		}
	}
	if h.RestartMax < h.RestartMin {
		p.Add("RestartMax", "%s is shorter than {RestartMin} %s", h.RestartMax, h.RestartMin)
	}
	return p.Err()
}

// Config is how the fleet runs hives: the operator's settings and the
// queen's own.
type Config struct {
	Hives
	DataDir string // the local hive's data is in DataDir/local-hive
	// HeartbeatTimeout is the queen's: a hive's lease on the queen, and
	// how long a node cut off is waited for.
	HeartbeatTimeout time.Duration
	// TLS is the queen's own certificate, which the local hive serves too.
	TLS transport.ServerTLS
	// ClusterToken reaches every hive on its lifeline.
	ClusterToken string
	Logger       *slog.Logger
}

// Defaults a node takes.
const (
	DefaultHivePort = 9200
	// LocalPoolID is the pool id (and node name) of the queen's local hive.
	LocalPoolID = "local"
)

// ErrStopping: the fleet is stopping and starts no hive.
var ErrStopping = openai.Sentinel(http.StatusServiceUnavailable, "shutting_down", "the queen is stopping")

// Spec is what the fleet needs to run a hive on a node.
type Spec struct {
	name       string
	target     *sshnode.Target // nil: this machine
	installDir string
	hivePort   int
	createdAt  time.Time
	tls        TLS
}

// TLS names the files of a node's hive: its certificate and key, and
// the CA it trusts (paths on the node; empty: plain HTTP, system roots).
type TLS struct {
	Cert   string `json:"tls_cert,omitempty"`
	Key    string `json:"tls_key,omitempty"`
	CAFile string `json:"ca_file,omitempty"`
}

// args are the hive's flags for t.
func (t TLS) args() []string {
	var out []string
	if t.Cert != "" {
		out = append(out, "--tls-cert", t.Cert, "--tls-key", t.Key)
	}
	if t.CAFile != "" {
		out = append(out, "--ca-file", t.CAFile)
	}
	return out
}

func (s Spec) local() bool { return s.target == nil }

// Meta is what a node row keeps in its metadata.
type Meta struct {
	HivePort int `json:"hive_port"`
	TLS      TLS `json:"tls,omitzero"`
}

// New builds the fleet of queen; Start runs its hives.
func New(cfg Config, queen Queen) *Fleet {
	if cfg.SSH.AliveInterval == 0 {
		// A session to a node cut off ends about when its pool turns
		// unhealthy, so the queen tries again soon after.
		cfg.SSH.AliveInterval = max(time.Second, cfg.HeartbeatTimeout/3)
	}
	return &Fleet{queen: queen, cfg: cfg, log: cfg.Logger, spawner: procs.NewSpawner(), started: time.Now(), hives: map[string]*ownedHive{}}
}

// binary hashes the apiary that hives run, once.
func (f *Fleet) Binary() (sshnode.Binary, error) {
	f.binOnce.Do(func() { f.bin, f.binErr = sshnode.LocalBinary(f.cfg.Binary, version.Version) })
	return f.bin, f.binErr
}

// start runs the local hive (if configured) and one hive per stored node.
func (f *Fleet) Start(nodes []store.Node) {
	if f.cfg.LocalHive {
		if err := f.Add(Spec{name: LocalPoolID, createdAt: time.Now()}); err != nil {
			f.log.Error("cannot start the local hive", "err", err)
		}
	}
	for _, n := range nodes {
		spec, err := SpecOf(n)
		if err != nil {
			f.log.Error("stored node is invalid; not starting its hive", "node", n.Name, "err", err)
			continue
		}
		if err := f.Add(spec); err != nil {
			f.log.Error("cannot start the hive of a node", "node", n.Name, "err", err)
		}
	}
}

func SpecOf(n store.Node) (Spec, error) {
	t, err := sshnode.ParseTarget(n.SSHTarget)
	if err != nil {
		return Spec{}, err
	}
	meta := Meta{HivePort: DefaultHivePort}
	if len(n.Metadata) > 0 {
		if err := json.Unmarshal(n.Metadata, &meta); err != nil {
			return Spec{}, fmt.Errorf("node metadata: %w", err)
		}
	}
	dir := n.InstallDir
	if dir == "" {
		dir = sshnode.DefaultInstallDir
	}
	return Spec{name: n.Name, target: &t, installDir: dir, hivePort: meta.HivePort, createdAt: n.CreatedAt, tls: meta.TLS}, nil
}

// add starts the supervisor of spec's hive.
func (f *Fleet) Add(spec Spec) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stopping {
		return fmt.Errorf("%w: not starting a hive on %s", ErrStopping, spec.name)
	}
	if _, ok := f.hives[spec.name]; ok {
		return fmt.Errorf("%w: node %s", store.ErrExists, spec.name)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := &ownedHive{f: f, spec: spec, ctx: ctx, cancel: cancel, done: make(chan struct{}),
		log: f.log.With("node", spec.name)}
	h.st = api.NodeHive{State: api.HiveConnecting, Since: time.Now()}
	f.hives[spec.name] = h
	f.wg.Go(h.run)
	return nil
}

// stopped reports whether the fleet takes no more hives (the queen is
// shutting down).
func (f *Fleet) Stopped() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.stopping
}

// remove stops the hive of node name (its cascade) and forgets it. It
// returns once the hive is gone.
func (f *Fleet) Remove(name string) bool {
	f.mu.Lock()
	h, ok := f.hives[name]
	delete(f.hives, name)
	f.mu.Unlock()
	if ok {
		h.cancel()
		<-h.done
	}
	return ok
}

// names lists the nodes whose hives the fleet runs.
func (f *Fleet) Names() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]string, 0, len(f.hives))
	for n := range f.hives {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// stopAll stops every hive the queen started, in parallel, and waits
// until each has cascaded and exited (or was killed after the stop
// timeout). No hive starts after it.
func (f *Fleet) StopAll() {
	f.mu.Lock()
	f.stopping = true
	hives := make([]*ownedHive, 0, len(f.hives))
	for _, h := range f.hives {
		hives = append(hives, h)
	}
	f.mu.Unlock()
	if len(hives) > 0 {
		f.log.Info("stopping the hives this queen started", "hives", len(hives))
	}
	for _, h := range hives {
		h.cancel()
	}
	f.wg.Wait()
}

// close ends the spawner thread; only after stopAll.
func (f *Fleet) Close() { _ = f.spawner.Close() }

// node is the wire form of one node's entry.
func (f *Fleet) Node(name string) (api.Node, bool) {
	f.mu.Lock()
	h, ok := f.hives[name]
	f.mu.Unlock()
	if !ok {
		return api.Node{}, false
	}
	return h.wire(), true
}

// localNodes lists the hives that are not stored nodes (the local hive).
func (f *Fleet) LocalNodes() []api.Node {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []api.Node
	for _, h := range f.hives {
		if h.spec.local() {
			out = append(out, h.wire())
		}
	}
	return out
}

// hiveArgs is the command line of a hive the queen starts on spec's node,
// its node address being addr (the hive binds it).
func (f *Fleet) hiveArgs(spec Spec, addr string) []string {
	hb := f.cfg.HeartbeatTimeout
	interval := min(max(hb/3, 100*time.Millisecond), 10*time.Second)
	args := []string{"hive",
		"--addr", addr,
		"--queen", f.queen.URL(),
		"--pool-id", spec.name,
		"--node-id", spec.name,
		"--owner", "queen",
		"--lifeline", "stdin",
		"--lease-timeout", hb.String(),
		"--heartbeat-interval", interval.String(),
		"--log-json",
	}
	if len(f.cfg.PassEnv) > 0 {
		args = append(args, "--pass-env", strings.Join(f.cfg.PassEnv, ","))
	}
	if spec.local() {
		args = append(args, "--data-dir", filepath.Join(f.cfg.DataDir, "local-hive"))
		// The queen's own machine: its certificate and CA serve the
		// local hive too.
		spec.tls = TLS{Cert: f.cfg.TLS.CertFile, Key: f.cfg.TLS.KeyFile, CAFile: transport.CAFile()}
	}
	args = append(args, spec.tls.args()...)
	return append(args, f.cfg.HiveArgs...)
}

// lifelineEnv is the preamble a started hive gets on its lifeline: the
// cluster token, and the queen's HF_TOKEN for the hive's pulls (no
// environment of the queen's children holds it).
func (f *Fleet) lifelineEnv() []string {
	var env []string
	if tok := f.cfg.ClusterToken; tok != "" {
		env = append(env, secret.ClusterTokenEnv+"="+tok)
	}
	if tok := os.Getenv(secret.HFTokenEnv); tok != "" {
		env = append(env, secret.HFTokenEnv+"="+tok)
	}
	return env
}

// childEnviron is the environment of a process the fleet starts. The
// local hive gets the allow-list of the queen's environment and what
// the operator named (secret.ChildEnv with PassEnv); ssh, which acts for
// the operator (its agent's SSH_AUTH_SOCK, what a ProxyCommand reads),
// the queen's without any secret (secret.Scrub), which an ssh config's
// SendEnv cannot send. A hive gets the cluster token on its lifeline,
// never in its environment.
func (f *Fleet) childEnviron(local bool) []string {
	if local {
		return secret.ChildEnv(os.Environ(), f.cfg.PassEnv)
	}
	return secret.Scrub(os.Environ())
}

// reachable checks that a hive on a node with address nodeAddr can reach
// the queen and be reached by it: a loopback queen serves only its own
// machine, and a hive on another needs the cluster token.
func (f *Fleet) Reachable(name, nodeAddr string) error {
	if nodeAddr == "" || transport.IsLoopback(nodeAddr) {
		return nil
	}
	var errs []error
	if host := urlHost(f.queen.URL()); transport.IsLoopback(host) || host == "0.0.0.0" || host == "::" {
		errs = append(errs, fmt.Errorf("node %s (%s) cannot reach this queen at %s: start the queen with --addr on an address the node reaches and --advertise http://THAT:PORT",
			name, nodeAddr, f.queen.URL()))
	}
	if f.cfg.ClusterToken == "" {
		errs = append(errs, fmt.Errorf("node %s (%s) is another machine: its hive serves on the network only with a cluster token; start the queen with %s set", name, nodeAddr, secret.ClusterTokenEnv))
	}
	return errors.Join(errs...)
}

// deregister takes a hive's pool offline after the queen stopped it or saw
// it exit, so no request waits for it.
func (f *Fleet) vacate(poolID, reason string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := f.queen.Vacate(ctx, poolID, reason); err != nil {
		f.log.Warn("cannot take the pool of a hive that is gone offline", "pool_id", poolID, "err", err)
	}
}

func (f *Fleet) deregister(poolID, reason string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := f.queen.Deregister(ctx, poolID, reason); err != nil {
		f.log.Warn("cannot take the pool of a stopped hive offline", "pool_id", poolID, "err", err)
	}
}

// audit records a change to a hive the queen owns.
func (f *Fleet) audit(action, node, reason string, meta map[string]any) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	f.queen.Audit(ctx, store.AuditEntry{Actor: registry.ActorQueen, Action: action, Target: "node:" + node, Reason: reason, Metadata: meta})
}

// HivePort is the port the node's hive listens on.
func (s Spec) HivePort() int { return s.hivePort }
