package keeper

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/apiary-llm/apiary/internal/procs"
	"github.com/apiary-llm/apiary/internal/secret"
)

// ephemeral is the queen a keeper starts when none answers (rule 1: the
// keeper owns it, so it stops it). The queen runs with --local-hive: it
// starts the hive on this machine as its own child, so the cascade follows
// ownership: keeper → queen → hive → workers. Every link has a lifeline
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

// start resolves the model, starts the queen and waits until the local
// pool serves. It returns the model ref to ask for. Whatever it started
// is stopped by teardown, also when start fails.
func (e *ephemeral) start(ctx context.Context) (string, error) {
	cfg := e.k.cfg
	dir, err := os.MkdirTemp(cfg.TempDir, "apiary-infer-")
	if err != nil {
		return "", fmt.Errorf("keeper: throwaway data dir: %w", err)
	}
	e.dir = dir
	ref, modelsDir, err := resolveModel(cfg.Model, cfg.ModelsDir, filepath.Join(dir, "models"))
	if err != nil {
		return "", err
	}
	bin := cfg.Binary
	if bin == "" {
		if bin, err = os.Executable(); err != nil {
			return "", fmt.Errorf("keeper: find own executable: %w", err)
		}
	}
	args := []string{"queen",
		"--addr", "127.0.0.1:0",
		"--data-dir", filepath.Join(dir, "queen"),
		"--owner", "keeper",
		"--lifeline", "stdin",
		"--local-hive",
		"--hive-arg=--models-dir=" + modelsDir,
		"--log-json",
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
		return "", fmt.Errorf("keeper: start a queen: %w", err)
	}
	e.k.log.Debug("ephemeral queen started", "pid", e.proc.PID(), "data_dir", dir)
	fmt.Fprintf(cfg.Stderr, "no queen at %s: starting one with a local hive for this prompt…\n", cfg.QueenURL)

	timeout := time.NewTimer(cfg.StartTimeout)
	defer timeout.Stop()
	select {
	case addr := <-e.out.serving:
		e.url = "http://" + addr
	case <-e.proc.Done():
		return "", fmt.Errorf("keeper: the queen it started exited (%s): %s", e.proc.Exit(), e.out.tail())
	case <-ctx.Done():
		return "", context.Cause(ctx)
	case <-timeout.C:
		return "", fmt.Errorf("keeper: the queen it started did not serve within %s: %s", cfg.StartTimeout, e.out.tail())
	}
	if err := e.awaitLocalPool(ctx, timeout.C); err != nil {
		return "", err
	}
	return ref, nil
}

// queenEnviron is the environment of the queen it starts: the keeper's,
// without any secret but the tokens the keeper itself sends (so that the
// queen expects those); a database URL of the environment is not the
// throwaway queen's.
func (e *ephemeral) queenEnviron() []string {
	env := secret.Scrub(os.Environ())
	for name, tok := range map[string]string{secret.APITokenEnv: e.k.cfg.Tokens.API,
		secret.AdminTokenEnv: e.k.cfg.Tokens.Admin, secret.ClusterTokenEnv: e.k.cfg.Tokens.Cluster} {
		if tok != "" {
			env = append(env, name+"="+tok)
		}
	}
	return env
}

// awaitLocalPool waits until the queen's local hive has registered.
func (e *ephemeral) awaitLocalPool(ctx context.Context, deadline <-chan time.Time) error {
	c := NewClient(e.url, e.k.cfg.Tokens.Admin, e.k.cfg.Tokens.Cluster)
	c.SetTimeout(5 * time.Second)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		pools, err := c.Pools(ctx, PoolFilter{Status: "healthy"})
		for _, p := range pools {
			if p.PoolID == "local" {
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
			return fmt.Errorf("keeper: the queen it started exited (%s): %s", e.proc.Exit(), e.out.tail())
		case <-deadline:
			msg := e.out.tail()
			if nodes, err := c.Nodes(context.WithoutCancel(ctx)); err == nil {
				for _, n := range nodes {
					if n.Local && n.Hive.Message != "" {
						msg = n.Hive.Message
					}
				}
			}
			return fmt.Errorf("keeper: the local hive did not register within %s: %s", e.k.cfg.StartTimeout, msg)
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
			err = fmt.Errorf("keeper: the queen it started did not stop within %s; killed it: %s", e.k.cfg.StopTimeout, e.out.tail())
		}
		if serr != nil {
			err = errors.Join(err, fmt.Errorf("keeper: stop the queen it started: %w", serr))
		}
		if x := e.proc.Exit(); err == nil && x.Code != 0 {
			err = fmt.Errorf("keeper: the queen it started exited with %s: %s", x, e.out.tail())
		}
		e.k.log.Debug("ephemeral queen stopped", "took", time.Since(start).Round(time.Millisecond).String(), "exit", e.proc.Exit().String())
	}
	if e.spawner != nil {
		_ = e.spawner.Close()
	}
	if e.dir != "" {
		if rerr := os.RemoveAll(e.dir); rerr != nil {
			err = errors.Join(err, fmt.Errorf("keeper: remove %s: %w", e.dir, rerr))
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
			return "", "", fmt.Errorf("%w: --model %q is neither a model ref nor a path to a .gguf file", ErrUsage, model)
		}
		ref = strings.TrimSuffix(model, ".gguf")
		path := filepath.Join(modelsDir, ref+".gguf")
		if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
			return "", "", fmt.Errorf("%w: model %s is not in %s: pass a path to a .gguf file, or put it there (apiary models pull URL)", ErrUsage, ref, modelsDir)
		} else if err != nil {
			return "", "", fmt.Errorf("keeper: model %s: %w", ref, err)
		}
		return ref, modelsDir, nil
	}
	abs, err := filepath.Abs(model)
	if err != nil {
		return "", "", fmt.Errorf("keeper: --model %q: %w", model, err)
	}
	st, err := os.Stat(abs)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "", "", fmt.Errorf("%w: --model %s: no such file", ErrUsage, model)
	case err != nil:
		return "", "", fmt.Errorf("keeper: --model %s: %w", model, err)
	case !st.Mode().IsRegular():
		return "", "", fmt.Errorf("%w: --model %s is not a regular file", ErrUsage, model)
	}
	ref = strings.TrimSuffix(filepath.Base(abs), ".gguf")
	if !validRef(ref) {
		return "", "", fmt.Errorf("%w: --model %s: the file name %q cannot be a model ref (letters, digits, '.', '_', '+', '-')", ErrUsage, model, ref)
	}
	if err := os.MkdirAll(linkDir, 0o755); err != nil {
		return "", "", fmt.Errorf("keeper: %w", err)
	}
	if err := os.Symlink(abs, filepath.Join(linkDir, ref+".gguf")); err != nil {
		return "", "", fmt.Errorf("keeper: make %s available to the local hive: %w", model, err)
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
