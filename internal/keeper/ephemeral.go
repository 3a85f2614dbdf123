package keeper

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/procs"
	"github.com/apiary-llm/apiary/internal/secret"
	"github.com/apiary-llm/apiary/internal/sshnode"
	"github.com/apiary-llm/apiary/internal/transport"
)

// ephemeral is the queen a keeper starts when none answers (rule 1: the
// keeper owns it, so it stops it). The queen runs with --local-hive: it
// starts the hive on this machine as its own child, so the cascade follows
// ownership: keeper → queen → hive → workers. With a node (--node --ssh)
// it runs without one, on the address of this machine the node reaches,
// and the keeper adds the node: the queen starts the node's hive over SSH,
// the session its lifeline. Every link has a lifeline
// (stdin) and SIGTERM as its death signal, so a keeper killed with SIGKILL
// still takes the tree down, gracefully.
type ephemeral struct {
	k       *Infer
	dir     string // throwaway data dir, removed by teardown
	spawner *procs.Spawner
	proc    *procs.Process
	line    *procs.Lifeline
	out     *queenOutput
	url     string
}

// start resolves the model, starts the queen and waits until the pool
// that serves the prompt (the local hive's, or the node's) is healthy. It
// returns the model ref to ask for. Whatever it started is stopped by
// teardown, also when start fails.
func (e *ephemeral) start(ctx context.Context) (string, error) {
	cfg := e.k.cfg
	dir, err := os.MkdirTemp(cfg.TempDir, "apiary-infer-")
	if err != nil {
		return "", fmt.Errorf("throwaway data dir: %w", err)
	}
	e.dir = dir
	bin := cfg.Binary
	if bin == "" {
		if bin, err = os.Executable(); err != nil {
			return "", fmt.Errorf("find own executable: %w", err)
		}
	}
	timeout := time.NewTimer(cfg.StartTimeout)
	defer timeout.Stop()
	args := []string{"queen",
		"--data-dir", filepath.Join(dir, "queen"),
		"--owner", "keeper",
		"--lifeline", "stdin",
		"--log-json",
	}
	var ref, pool string
	var node *nodeStart
	if cfg.Node == "" {
		var modelsDir string
		if ref, modelsDir, err = resolveModel(cfg.Model, cfg.ModelsDir, filepath.Join(dir, "models")); err != nil {
			return "", err
		}
		pool = "local"
		args = append(args, "--addr", "127.0.0.1:0", "--local-hive", "--hive-arg=--models-dir="+modelsDir)
	} else {
		if ref, err = nodeRef(cfg.Model, cfg.Node); err != nil {
			return "", err
		}
		if node, err = e.probeNode(ctx, timeout.C); err != nil {
			return "", err
		}
		pool = cfg.Node
		args = append(args, "--addr", net.JoinHostPort(node.listen, "0"))
		if cfg.SSHConfig != "" {
			args = append(args, "--ssh-config", cfg.SSHConfig)
		}
	}
	if cfg.WorkerThreads > 0 {
		args = append(args, "--hive-arg=--worker-threads="+strconv.Itoa(cfg.WorkerThreads))
	}
	args = append(args, cfg.QueenArgs...)

	if e.line, err = procs.NewLifeline(nil); err != nil {
		return "", err
	}
	e.out = newQueenOutput()
	e.spawner = procs.NewSpawner()
	e.proc, err = e.spawner.Start(ctx, procs.Spec{Path: bin, Args: args, Env: e.queenEnviron(), Stdin: e.line.Child,
		Output: e.out, DeathSignal: syscall.SIGTERM, WaitDelay: 2 * time.Second})
	e.line.CloseChildEnd()
	if err != nil {
		return "", fmt.Errorf("start a queen: %w", err)
	}
	e.k.log.Debug("ephemeral queen started", "pid", e.proc.PID(), "data_dir", dir)
	why := fmt.Sprintf("no queen at %s: starting one", cfg.QueenURL)
	if cfg.Ephemeral {
		why = "--ephemeral: starting a queen"
	}
	if node == nil {
		fmt.Fprintf(cfg.Stderr, "%s with a local hive for this prompt…\n", why)
	} else {
		fmt.Fprintf(cfg.Stderr, "%s that starts a hive on node %s (%s) over SSH for this prompt…\n", why, cfg.Node, cfg.SSH)
	}

	select {
	case addr := <-e.out.serving:
		e.url = "http://" + addr
	case <-e.proc.Done():
		return "", fmt.Errorf("the queen it started exited (%s): %s", e.proc.Exit(), e.out.tail())
	case <-ctx.Done():
		return "", context.Cause(ctx)
	case <-timeout.C:
		return "", fmt.Errorf("the queen it started did not serve within %s: %s", cfg.StartTimeout, e.out.tail())
	}
	if node != nil {
		if err := e.addNode(ctx, timeout.C); err != nil {
			return "", err
		}
	}
	if err := e.awaitPool(ctx, pool, timeout.C); err != nil {
		return "", err
	}
	return ref, nil
}

// nodeRef is the ref to ask a node's hive for: a path is refused, as the
// hive there serves models by ref from its own models dir.
func nodeRef(model, node string) (string, error) {
	if looksLikePath(model) {
		ref := strings.TrimSuffix(filepath.Base(model), ".gguf")
		return "", usagef("--model %s is a path, but the prompt runs on node %s: its hive serves models by ref from its models dir "+
			"and cannot load a file of this machine. Use the ref (--model %s: %s.gguf in the node's models dir, see apiary models pull there)",
			model, node, ref, ref)
	}
	if !validRef(model) {
		return "", usagef("--model %q is not a model ref", model)
	}
	return model, nil
}

// nodeStart is what the keeper learnt about the node before it starts a
// queen for it.
type nodeStart struct {
	listen string // the address of this machine the node reaches
}

// probeNode connects to the node over SSH once, before any queen runs: a
// node ssh cannot reach is a clear error with nothing to stop; and the
// connection says which address of this machine the node sees, where the
// queen must listen for the node's hive to reach it.
func (e *ephemeral) probeNode(ctx context.Context, deadline <-chan time.Time) (*nodeStart, error) {
	cfg := e.k.cfg
	target, err := sshnode.ParseTarget(cfg.SSH)
	if err != nil {
		return nil, usagef("--ssh: %w", err)
	}
	dir := cfg.InstallDir
	if dir == "" {
		dir = sshnode.DefaultInstallDir
	}
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-deadline:
			cancel()
		case <-pctx.Done():
		}
	}()
	probe, err := sshnode.Client{ConfigFile: cfg.SSHConfig}.Probe(pctx, target, dir)
	if err != nil {
		if ctx.Err() != nil {
			return nil, context.Cause(ctx)
		}
		return nil, fmt.Errorf("node %s: %w", cfg.Node, err)
	}
	if probe.ClientAddr == "" {
		return nil, fmt.Errorf("node %s (%s) did not say which address it sees this machine at ($SSH_CONNECTION is empty there); "+
			"start a queen on an address it reaches and add the node to it (apiary queen --addr, apiary nodes add)", cfg.Node, cfg.SSH)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(probe.ClientAddr, "0"))
	if err != nil {
		return nil, fmt.Errorf("node %s sees this machine at %s, which is no address of this machine (a ProxyJump or NAT in between?): "+
			"start a queen on an address the node reaches and add the node to it (apiary queen --addr --advertise, apiary nodes add): %w", cfg.Node, probe.ClientAddr, err)
	}
	ln.Close()
	// The queen listens beyond loopback: it needs all three tokens. The
	// keeper makes up those it has none of; it is the only client.
	for _, tok := range []*string{&e.k.cfg.Tokens.API, &e.k.cfg.Tokens.Admin, &e.k.cfg.Tokens.Cluster} {
		if *tok == "" && !transport.IsLoopback(probe.ClientAddr) {
			*tok = rand.Text()
		}
	}
	e.k.log.Debug("node probed", "node", cfg.Node, "node_addr", probe.NodeAddr, "listen", probe.ClientAddr)
	return &nodeStart{listen: probe.ClientAddr}, nil
}

// addNode has the queen add the node and start its hive there (POST
// /api/admin/nodes, as `apiary nodes add`).
func (e *ephemeral) addNode(ctx context.Context, deadline <-chan time.Time) error {
	cfg := e.k.cfg
	c := NewClient(e.url, cfg.Tokens.Admin, cfg.Tokens.Cluster)
	c.SetTimeout(cfg.StartTimeout)
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-deadline:
			cancel()
		case <-e.proc.Done():
			cancel()
		case <-actx.Done():
		}
	}()
	port := 0 // any free port: a hive of another queen may hold the default
	_, err := c.AddNode(actx, api.AddNodeRequest{Name: cfg.Node, SSH: cfg.SSH, InstallDir: cfg.InstallDir, HivePort: &port,
		Reason: "apiary infer --node (ephemeral)"})
	if err != nil {
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		return fmt.Errorf("start a hive on node %s over SSH: %w", cfg.Node, err)
	}
	return nil
}

// queenEnviron is the environment of the queen it starts: the keeper's,
// without any secret but the tokens the keeper itself sends (so that the
// queen expects those) and HF_TOKEN (the queen hands it to its local hive
// for pulls); a database URL of the environment is not the throwaway
// queen's. The queen acts for the operator, as the keeper does (it runs
// ssh for --node, which needs the agent and what the operator's ssh
// config reads), so it keeps the rest (secret.Scrub); the hives it
// starts get the allow-list (secret.ChildEnv).
func (e *ephemeral) queenEnviron() []string {
	env := secret.Scrub(os.Environ())
	for name, tok := range map[string]string{secret.APITokenEnv: e.k.cfg.Tokens.API,
		secret.AdminTokenEnv: e.k.cfg.Tokens.Admin, secret.ClusterTokenEnv: e.k.cfg.Tokens.Cluster,
		secret.HFTokenEnv: os.Getenv(secret.HFTokenEnv)} {
		if tok != "" {
			env = append(env, name+"="+tok)
		}
	}
	return env
}

// awaitPool waits until the hive of pool id (the queen's local hive, or
// the node's) has registered and is healthy.
func (e *ephemeral) awaitPool(ctx context.Context, id string, deadline <-chan time.Time) error {
	c := NewClient(e.url, e.k.cfg.Tokens.Admin, e.k.cfg.Tokens.Cluster)
	c.SetTimeout(5 * time.Second)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		pools, err := c.Pools(ctx, PoolFilter{Status: "healthy"})
		for _, p := range pools {
			if p.PoolID == id {
				return nil
			}
		}
		if err != nil && ctx.Err() == nil {
			e.k.log.Debug("pools not listed yet", "err", err)
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-e.proc.Done():
			return fmt.Errorf("the queen it started exited (%s): %s", e.proc.Exit(), e.out.tail())
		case <-deadline:
			msg := e.out.tail()
			if nodes, err := c.Nodes(context.WithoutCancel(ctx)); err == nil {
				for _, n := range nodes {
					if n.PoolID == id && n.Hive.Message != "" {
						msg = n.Hive.Message
					}
				}
			}
			return fmt.Errorf("the hive of pool %s did not register within %s: %s", id, e.k.cfg.StartTimeout, msg)
		case <-tick.C:
		}
	}
}

// teardown stops the queen this keeper started (its lifeline ends and it
// gets SIGTERM: it stops its hive, which stops its workers), waits for it,
// kills it after StopTimeout, and removes the throwaway data dir.
func (e *ephemeral) teardown(interrupted bool) error {
	var err error
	if e.proc != nil {
		if interrupted {
			fmt.Fprintln(e.k.cfg.Stderr, "interrupted: stopping the queen, hive and workers this command started…")
		}
		start := time.Now()
		e.line.Cut()
		phase, serr := procs.Stop(context.Background(), e.proc, procs.Escalation{TermWait: e.k.cfg.StopTimeout})
		<-e.proc.Done()
		if phase == procs.PhaseKill {
			err = fmt.Errorf("the queen it started did not stop within %s; killed it: %s", e.k.cfg.StopTimeout, e.out.tail())
		}
		if serr != nil {
			err = errors.Join(err, fmt.Errorf("stop the queen it started: %w", serr))
		}
		if x := e.proc.Exit(); err == nil && x.Code != 0 {
			err = fmt.Errorf("the queen it started exited with %s: %s", x, e.out.tail())
		}
		e.k.log.Debug("ephemeral queen stopped", "took", time.Since(start).Round(time.Millisecond).String(), "exit", e.proc.Exit().String())
	}
	if e.spawner != nil {
		_ = e.spawner.Close()
	}
	if e.dir != "" {
		if rerr := os.RemoveAll(e.dir); rerr != nil {
			err = errors.Join(err, fmt.Errorf("remove %s: %w", e.dir, rerr))
		}
	}
	return err
}

// resolveModel turns --model into a ref and the models dir the local hive
// reads: a ref must be in modelsDir; a path to a .gguf file is linked into
// linkDir under its own name.
func resolveModel(model, modelsDir, linkDir string) (ref, dir string, err error) {
	if !looksLikePath(model) {
		if !validRef(model) {
			return "", "", usagef("--model %q is neither a model ref nor a path to a .gguf file", model)
		}
		ref = strings.TrimSuffix(model, ".gguf")
		path := filepath.Join(modelsDir, ref+".gguf")
		if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
			return "", "", usagef("model %s is not in %s: pass a path to a .gguf file, or put it there (apiary models pull URL)", ref, modelsDir)
		} else if err != nil {
			return "", "", fmt.Errorf("model %s: %w", ref, err)
		}
		return ref, modelsDir, nil
	}
	abs, err := filepath.Abs(model)
	if err != nil {
		return "", "", fmt.Errorf("--model %q: %w", model, err)
	}
	st, err := os.Stat(abs)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "", "", usagef("--model %s: no such file", model)
	case err != nil:
		return "", "", fmt.Errorf("--model %s: %w", model, err)
	case !st.Mode().IsRegular():
		return "", "", usagef("--model %s is not a regular file", model)
	}
	ref = strings.TrimSuffix(filepath.Base(abs), ".gguf")
	if !validRef(ref) {
		return "", "", usagef("--model %s: the file name %q cannot be a model ref (letters, digits, '.', '_', '+', '-')", model, ref)
	}
	if err := os.MkdirAll(linkDir, 0o755); err != nil {
		return "", "", err
	}
	if err := os.Symlink(abs, filepath.Join(linkDir, ref+".gguf")); err != nil {
		return "", "", fmt.Errorf("make %s available to the local hive: %w", model, err)
	}
	return ref, linkDir, nil
}

// queenOutput reads the ephemeral queen's JSON log: it learns the address
// the queen serves on, and keeps the last lines for error messages.
type queenOutput struct {
	*procs.Lines
	serving chan string // receives the address once

	mu   sync.Mutex
	last []string // guarded by mu
	sent bool     // guarded by mu
}

func newQueenOutput() *queenOutput {
	o := &queenOutput{serving: make(chan string, 1)}
	o.Lines = procs.NewLines(o.line)
	return o
}

func (o *queenOutput) line(line string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	var rec struct {
		Msg   string `json:"msg"`
		Addr  string `json:"addr"`
		Level string `json:"level"`
		Err   string `json:"err"`
	}
	if json.Unmarshal([]byte(line), &rec) == nil {
		if rec.Msg == "queen serving" && !o.sent {
			o.sent = true
			o.serving <- rec.Addr
		}
		if rec.Level != "WARN" && rec.Level != "ERROR" {
			return
		}
		line = rec.Msg
		if rec.Err != "" {
			line += ": " + rec.Err
		}
	}
	o.last = append(o.last, strings.TrimSpace(line))
	if len(o.last) > 3 {
		o.last = o.last[1:]
	}
}

func (o *queenOutput) tail() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.last) == 0 {
		return "(no warning or error in its log)"
	}
	return strings.Join(o.last, "; ")
}
