package queen

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/procs"
	"github.com/apiary-llm/apiary/internal/registry"
	"github.com/apiary-llm/apiary/internal/secret"
	"github.com/apiary-llm/apiary/internal/sshnode"
	"github.com/apiary-llm/apiary/internal/store"
	"github.com/apiary-llm/apiary/internal/transport"
	"github.com/apiary-llm/apiary/internal/version"
)

// fleet owns the hives this queen started: one supervisor goroutine per
// node (ownedHive.run), the only writer of that node's state. It starts
// them from the spawner's locked thread, with SIGTERM as their death
// signal: a queen that dies takes its local hive and its ssh sessions with
// it, and each hive cascades to its workers.
type fleet struct {
	q       *Queen
	cfg     OwnershipConfig
	log     *slog.Logger
	spawner *procs.Spawner

	binOnce sync.Once
	bin     sshnode.Binary
	binErr  error

	mu       sync.Mutex
	hives    map[string]*ownedHive // guarded by mu
	stopping bool                  // guarded by mu
	wg       sync.WaitGroup
}

// nodeSpec is what the fleet needs to run a hive on a node.
type nodeSpec struct {
	name       string
	target     *sshnode.Target // nil: this machine
	installDir string
	hivePort   int
	createdAt  time.Time
	tls        nodeTLS
}

// nodeTLS names the files of a node's hive: its certificate and key, and
// the CA it trusts (paths on the node; empty: plain HTTP, system roots).
type nodeTLS struct {
	Cert   string `json:"tls_cert,omitempty"`
	Key    string `json:"tls_key,omitempty"`
	CAFile string `json:"ca_file,omitempty"`
}

// args are the hive's flags for t.
func (t nodeTLS) args() []string {
	var out []string
	if t.Cert != "" {
		out = append(out, "--tls-cert", t.Cert, "--tls-key", t.Key)
	}
	if t.CAFile != "" {
		out = append(out, "--ca-file", t.CAFile)
	}
	return out
}

func (s nodeSpec) local() bool { return s.target == nil }

// nodeMeta is what a node row keeps in its metadata.
type nodeMeta struct {
	HivePort int     `json:"hive_port"`
	TLS      nodeTLS `json:"tls,omitzero"`
}

func newFleet(q *Queen) *fleet {
	cfg := q.cfg.Ownership
	if cfg.SSH.AliveInterval == 0 {
		// A session to a node cut off ends about when its pool turns
		// unhealthy, so the queen tries again soon after.
		cfg.SSH.AliveInterval = max(time.Second, q.cfg.HeartbeatTimeout/3)
	}
	return &fleet{q: q, cfg: cfg, log: q.log, spawner: procs.NewSpawner(), hives: map[string]*ownedHive{}}
}

// binary hashes the apiary that hives run, once.
func (f *fleet) binary() (sshnode.Binary, error) {
	f.binOnce.Do(func() { f.bin, f.binErr = sshnode.LocalBinary(f.cfg.Binary, version.Version) })
	return f.bin, f.binErr
}

// start runs the local hive (if configured) and one hive per stored node.
func (f *fleet) start(nodes []store.Node) {
	if f.cfg.LocalHive {
		if err := f.add(nodeSpec{name: LocalPoolID, createdAt: time.Now()}); err != nil {
			f.log.Error("cannot start the local hive", "err", err)
		}
	}
	for _, n := range nodes {
		spec, err := specOf(n)
		if err != nil {
			f.log.Error("stored node is invalid; not starting its hive", "node", n.Name, "err", err)
			continue
		}
		if err := f.add(spec); err != nil {
			f.log.Error("cannot start the hive of a node", "node", n.Name, "err", err)
		}
	}
}

func specOf(n store.Node) (nodeSpec, error) {
	t, err := sshnode.ParseTarget(n.SSHTarget)
	if err != nil {
		return nodeSpec{}, err
	}
	meta := nodeMeta{HivePort: DefaultHivePort}
	if len(n.Metadata) > 0 {
		if err := jsonUnmarshal(n.Metadata, &meta); err != nil {
			return nodeSpec{}, fmt.Errorf("node metadata: %w", err)
		}
	}
	dir := n.InstallDir
	if dir == "" {
		dir = sshnode.DefaultInstallDir
	}
	return nodeSpec{name: n.Name, target: &t, installDir: dir, hivePort: meta.HivePort, createdAt: n.CreatedAt, tls: meta.TLS}, nil
}

// add starts the supervisor of spec's hive.
func (f *fleet) add(spec nodeSpec) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stopping {
		return fmt.Errorf("%w: not starting a hive on %s", ErrShuttingDown, spec.name)
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
func (f *fleet) stopped() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.stopping
}

// remove stops the hive of node name (its cascade) and forgets it. It
// returns once the hive is gone.
func (f *fleet) remove(name string) bool {
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
func (f *fleet) names() []string {
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
func (f *fleet) stopAll() {
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
func (f *fleet) close() { _ = f.spawner.Close() }

// node is the wire form of one node's entry.
func (f *fleet) node(name string) (api.Node, bool) {
	f.mu.Lock()
	h, ok := f.hives[name]
	f.mu.Unlock()
	if !ok {
		return api.Node{}, false
	}
	return h.wire(), true
}

// localNodes lists the hives that are not stored nodes (the local hive).
func (f *fleet) localNodes() []api.Node {
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
func (f *fleet) hiveArgs(spec nodeSpec, addr string) []string {
	hb := f.q.cfg.HeartbeatTimeout
	interval := min(max(hb/3, 100*time.Millisecond), 10*time.Second)
	args := []string{"hive",
		"--addr", addr,
		"--queen", f.q.URL(),
		"--pool-id", spec.name,
		"--node-id", spec.name,
		"--owner", "queen",
		"--lifeline", "stdin",
		"--lease-timeout", hb.String(),
		"--heartbeat-interval", interval.String(),
		"--log-json",
	}
	if spec.local() {
		args = append(args, "--data-dir", filepath.Join(f.q.cfg.DataDir, "local-hive"))
		// The queen's own machine: its certificate and CA serve the
		// local hive too.
		spec.tls = nodeTLS{Cert: f.q.cfg.TLS.CertFile, Key: f.q.cfg.TLS.KeyFile, CAFile: transport.CAFile()}
	}
	args = append(args, spec.tls.args()...)
	return append(args, f.cfg.HiveArgs...)
}

// lifelineEnv is the preamble a started hive gets on its lifeline.
func (f *fleet) lifelineEnv() []string {
	if tok := f.q.cfg.Tokens.Cluster; tok != "" {
		return []string{"APIARY_CLUSTER_TOKEN=" + tok}
	}
	return nil
}

// childEnviron is the environment of the processes the fleet starts: the
// queen's, without any secret (secret.Scrub). A hive gets the cluster
// token on its lifeline, never in its environment; ssh needs none.
func childEnviron() []string { return secret.Scrub(os.Environ()) }

// reachable checks that a hive on a node with address nodeAddr can reach
// the queen and be reached by it: a loopback queen serves only its own
// machine, and a hive on another needs the cluster token.
func (f *fleet) reachable(name, nodeAddr string) error {
	if nodeAddr == "" || isLoopback(nodeAddr) {
		return nil
	}
	var errs []error
	if host := urlHost(f.q.URL()); isLoopback(host) || host == "0.0.0.0" || host == "::" {
		errs = append(errs, fmt.Errorf("node %s (%s) cannot reach this queen at %s: start the queen with --addr on an address the node reaches and --advertise http://THAT:PORT",
			name, nodeAddr, f.q.URL()))
	}
	if f.q.cfg.Tokens.Cluster == "" {
		errs = append(errs, fmt.Errorf("node %s (%s) is another machine: its hive serves on the network only with a cluster token; start the queen with %s set", name, nodeAddr, ClusterTokenEnv))
	}
	return errors.Join(errs...)
}

// deregister takes a hive's pool offline after the queen stopped it or saw
// it exit, so no request waits for it.
func (f *fleet) deregister(poolID, reason string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := f.q.reg.Deregister(ctx, poolID, registry.ActorQueen, reason); err != nil && !errors.Is(err, registry.ErrNotFound) && !errors.Is(err, registry.ErrClosed) {
		f.log.Warn("cannot take the pool of a stopped hive offline", "pool_id", poolID, "err", err)
	}
}

// audit records a change to a hive the queen owns.
func (f *fleet) audit(action, node, reason string, meta map[string]any) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := f.q.st.Update(ctx, func(tx *store.Tx) error {
		_, err := tx.Append(store.AuditEntry{Actor: registry.ActorQueen, Action: action, Target: "node:" + node, Reason: reason, Metadata: meta})
		return err
	})
	if err != nil {
		f.q.metrics.storeErrors.Inc()
		f.log.Error("cannot audit hive change", "action", action, "node", node, "err", err)
	}
}
