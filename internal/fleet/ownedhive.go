package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/procs"
	"github.com/apiary-llm/apiary/internal/sshnode"
)

// ownedHive supervises the hive the queen runs on one node: it prepares
// the node (probe, copy apiary), starts the hive with a lifeline, restarts
// it with a growing pause when it ends, and on stop (ctx) cascades it.
type ownedHive struct {
	f      *Fleet
	spec   Spec
	log    *slog.Logger
	ctx    context.Context // cancelled to stop the hive
	cancel context.CancelFunc
	done   chan struct{}

	mu sync.Mutex
	st api.NodeHive // guarded by mu
}

// errExternal: a hive the queen did not start serves the pool.
var errExternal = errors.New("another hive serves the pool")

func (h *ownedHive) set(state, msg string, fn func(*api.NodeHive)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.st.State != state {
		h.st.Since = time.Now()
	}
	h.st.State, h.st.Message = state, msg
	if fn != nil {
		fn(&h.st)
	}
}

func (h *ownedHive) wire() api.Node {
	h.mu.Lock()
	st := h.st
	h.mu.Unlock()
	n := api.Node{Name: h.spec.name, HivePort: h.spec.hivePort, Local: h.spec.local(), CreatedAt: h.spec.createdAt.UTC(),
		PoolID: h.spec.name, Hive: st}
	n.Hive.Since = n.Hive.Since.UTC()
	if h.spec.target != nil {
		n.SSH, n.InstallDir = h.spec.target.String(), h.spec.installDir
	}
	return n
}

// run is the supervisor loop; it returns once the hive is stopped.
func (h *ownedHive) run() {
	defer close(h.done)
	cfg := h.f.cfg
	pause := cfg.RestartMin
	for {
		began := time.Now()
		err := h.once()
		if h.ctx.Err() != nil {
			h.set(api.HiveStopped, "stopped by the queen", func(s *api.NodeHive) { s.PID = 0 })
			return
		}
		wait := pause
		if errors.Is(err, errExternal) {
			wait = min(h.f.cfg.HeartbeatTimeout, cfg.RestartMax)
		} else {
			if time.Since(began) > time.Minute {
				pause = cfg.RestartMin
			}
			wait = pause
			pause = min(2*pause, cfg.RestartMax)
			h.set(api.HiveRetrying, fmt.Sprintf("%v; next try in %s", err, wait), func(s *api.NodeHive) { s.PID = 0 })
			h.log.Warn("hive of the queen not running; will try again", "err", err, "pause", wait.String())
		}
		t := time.NewTimer(wait)
		select {
		case <-h.ctx.Done():
			t.Stop()
		case <-t.C:
		}
	}
}

// once prepares the node, starts the hive and waits until it ends or the
// queen stops it.
func (h *ownedHive) once() error {
	h.set(api.HiveConnecting, "", nil)
	path, args, err := h.prepare()
	if err != nil {
		return err
	}
	if err := h.awaitPool(); err != nil {
		return err
	}
	sess, err := h.launch(path, args)
	if err != nil {
		return err
	}
	h.set(api.HiveRunning, "", func(s *api.NodeHive) { s.PID = sess.proc.PID(); s.Starts++ })
	h.log.Info("hive started", "pid", sess.proc.PID(), "local", h.spec.local())
	h.f.audit("hive.start", h.spec.name, "the queen starts the hive of its node", map[string]any{"pid": sess.proc.PID(), "local": h.spec.local()})

	select {
	case <-sess.proc.Done():
		exit := sess.proc.Exit()
		why := fmt.Sprintf("hive exited (%s)", exit)
		if tail := sess.out.tail(); tail != "" {
			why += ": " + tail
		}
		h.f.audit("hive.exit", h.spec.name, why, map[string]any{"exit": exit.String()})
		if h.workersOutlive() {
			h.f.vacate(h.spec.name, "the hive the queen started on node "+h.spec.name+" exited; its worker pods stay, for the next one")
		} else {
			h.f.deregister(h.spec.name, "the hive the queen started on node "+h.spec.name+" exited")
		}
		return errors.New(why)
	case <-h.ctx.Done():
		h.set(api.HiveStopping, "the hive stops its workers, then exits", nil)
		start := time.Now()
		how := h.stopSession(sess)
		h.log.Info("hive stopped", "how", how, "took", time.Since(start).Round(time.Millisecond).String(), "exit", sess.proc.Exit().String())
		h.f.audit("hive.stop", h.spec.name, "the queen stops the hive it started: "+how, map[string]any{"exit": sess.proc.Exit().String()})
		h.f.deregister(h.spec.name, "the queen stopped the hive it started on node "+h.spec.name)
		return h.ctx.Err()
	}
}

// workersOutlive: this hive's workers outlive it (the local hive's
// Kubernetes Pods); its pool stays, for the next hive to reconcile.
func (h *ownedHive) workersOutlive() bool { return h.spec.local() && h.f.cfg.LocalWorkersOutlive }

// Pacing of awaitPool.
const (
	pingTimeout = 5 * time.Second        // one ping of a pool's endpoint
	pingEvery   = 250 * time.Millisecond // while a hive that is not this queen's answers there
)

// awaitPool returns nil once no hive holds the node's pool (holder.go),
// having taken offline a pool whose hive is gone; errExternal when an
// operator's hive serves it; the stop's error when the queen stops the
// node meanwhile. While a hive that has not spoken to this queen answers
// at the pool's endpoint (the previous queen's, stopping with its
// lifeline) it waits, asking again every pingEvery, for at most a
// heartbeat timeout plus the hive stop timeout after the queen started.
func (h *ownedHive) awaitPool() error {
	patience := h.f.cfg.HeartbeatTimeout + h.f.cfg.HiveStopTimeout
	var waitedSince time.Time
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-h.ctx.Done():
			return h.ctx.Err()
		case <-t.C:
		}
		p, ok := h.f.queen.Pool(h.spec.name)
		d := holderOf(p, ok, h.f.started, time.Now(), patience, notAsked)
		if d == holderAsk {
			ctx, cancel := context.WithTimeout(h.ctx, pingTimeout)
			a := answerOf(h.f.queen.PingHive(ctx, p.Endpoint))
			cancel()
			d = holderOf(p, ok, h.f.started, time.Now(), patience, a)
		}
		switch d {
		case holderExternal:
			msg := fmt.Sprintf("pool %s is served by a hive this queen did not start (%s); leaving it alone", p.ID, p.Endpoint)
			h.set(api.HiveExternal, msg, nil)
			h.log.Info("a hive the queen did not start serves the node's pool; not starting one", "pool_id", p.ID, "endpoint", p.Endpoint)
			return errExternal
		case holderWait:
			if waitedSince.IsZero() {
				waitedSince = time.Now()
				msg := fmt.Sprintf("a hive this queen did not start answers at %s for pool %s and has not registered here "+
					"(the one a previous queen started stops with its lifeline; an operator's registers): leaving it alone, asking again", p.Endpoint, p.ID)
				h.set(api.HiveExternal, msg, nil)
				h.log.Info("a hive that has not registered with this queen answers for the node's pool; waiting until it registers or ends",
					"pool_id", p.ID, "endpoint", p.Endpoint)
			}
			t.Reset(pingEvery)
			continue
		case holderGone:
			h.log.Info("nothing answers at the endpoint of the node's pool, which has not spoken to this queen: its hive is gone",
				"pool_id", p.ID, "endpoint", p.Endpoint, "status", string(p.Status), "workers_outlive", h.workersOutlive())
			why := fmt.Sprintf("nothing answers at %s: the hive that held the pool before this queen started is gone", p.Endpoint)
			if h.workersOutlive() {
				h.f.vacate(p.ID, why+"; its worker pods stay, for the next one")
			} else {
				h.f.deregister(p.ID, why)
			}
		}
		if !waitedSince.IsZero() {
			h.log.Info("starting the node's hive after waiting for the one that answered", "pool_id", p.ID,
				"waited", time.Since(waitedSince).Round(time.Millisecond).String())
			h.set(api.HiveConnecting, "", nil)
		}
		return nil
	}
}

// prepare returns the command that runs the hive: apiary itself for the
// local hive; ssh for a node, after probing it and copying apiary there
// when it has none or another build.
func (h *ownedHive) prepare() (string, []string, error) {
	bin, err := h.f.Binary()
	if err != nil {
		return "", nil, err
	}
	if h.spec.local() {
		return bin.Path, h.f.hiveArgs(h.spec, "127.0.0.1:0"), nil
	}
	ctx, cancel := context.WithTimeout(h.ctx, h.f.cfg.ProbeTimeout)
	defer cancel()
	t := *h.spec.target
	probe, copied, err := h.f.cfg.SSH.Ensure(ctx, t, h.spec.installDir, bin)
	if err != nil {
		return "", nil, err
	}
	if copied {
		h.log.Info("copied apiary to the node", "install_dir", probe.InstallDir, "version", bin.Version)
		h.f.audit("node.install", h.spec.name, "copied apiary "+bin.Version+" to "+probe.InstallDir, map[string]any{"sha256": bin.SHA256})
	}
	h.set(api.HiveConnecting, "", func(s *api.NodeHive) { s.Version, s.NodeAddr = probe.Version, probe.NodeAddr })
	if err := h.f.Reachable(h.spec.name, probe.NodeAddr); err != nil {
		return "", nil, err
	}
	host := probe.NodeAddr
	if host == "" {
		host = "127.0.0.1"
	}
	remote, err := sshnode.ApiaryCommand(h.spec.installDir, h.f.hiveArgs(h.spec, net.JoinHostPort(host, strconv.Itoa(h.spec.hivePort)))...)
	if err != nil {
		return "", nil, err
	}
	path, args := h.f.cfg.SSH.Command(t, remote)
	return path, args, nil
}

// session is a running hive: the local process (the hive, or ssh holding
// the session to it) and its lifeline.
type session struct {
	proc *procs.Process
	line *procs.Lifeline
	out  *hiveOutput
}

func (h *ownedHive) launch(path string, args []string) (*session, error) {
	line, err := procs.NewLifeline(h.f.lifelineEnv())
	if err != nil {
		return nil, err
	}
	out := newHiveOutput(h.log)
	proc, err := h.f.spawner.Start(h.ctx, procs.Spec{Path: path, Args: args, Env: h.f.childEnviron(h.spec.local()), Stdin: line.Child,
		Output: out, DeathSignal: syscall.SIGTERM, WaitDelay: 2 * time.Second})
	line.CloseChildEnd()
	if err != nil {
		line.Cut()
		return nil, err
	}
	return &session{proc: proc, line: line, out: out}, nil
}

// stopSession cascades the hive: its lifeline ends (over SSH: the session's
// stdin), so it stops its workers and exits; a hive that does not finish
// in HiveStopTimeout gets SIGTERM (for ssh: the session ends), then
// SIGKILL. It says how the hive ended.
func (h *ownedHive) stopSession(s *session) string {
	phase, err := procs.Stop(context.Background(), s.proc, procs.Escalation{
		Ask:     func(context.Context) error { s.line.Stop(); return nil },
		AskWait: h.f.cfg.HiveStopTimeout, TermWait: 5 * time.Second,
	})
	s.line.Cut() // also when the hive was gone before the ask
	<-s.proc.Done()
	if err != nil {
		h.log.Warn("stopping the hive", "err", err)
	}
	if phase >= procs.PhaseTerm {
		h.log.Warn("hive did not finish its cascade in time", "timeout", h.f.cfg.HiveStopTimeout.String(), "sent", phase.String())
	}
	switch phase {
	case procs.PhaseTerm:
		return "SIGTERM after the stop timeout"
	case procs.PhaseKill:
		return "SIGKILL after the stop timeout"
	}
	return "lifeline closed, hive cascaded"
}

// hiveOutput relays a started hive's log lines (JSON) into the queen's log
// with the node's name, and keeps the last few for error messages.
type hiveOutput struct {
	*procs.Lines
	log *slog.Logger

	mu   sync.Mutex
	last []string // guarded by mu
}

const hiveOutputTail = 5

func newHiveOutput(log *slog.Logger) *hiveOutput {
	o := &hiveOutput{log: log}
	o.Lines = procs.NewLines(o.line)
	return o
}

func (o *hiveOutput) line(line string) {
	if strings.TrimSpace(line) == "" {
		return
	}
	o.mu.Lock()
	o.last = append(o.last, line)
	if len(o.last) > hiveOutputTail {
		o.last = o.last[1:]
	}
	o.mu.Unlock()
	var m map[string]any
	if json.Unmarshal([]byte(line), &m) != nil {
		o.log.Info("hive: " + line)
		return
	}
	level := slog.LevelInfo
	if s, ok := m["level"].(string); ok {
		_ = level.UnmarshalText([]byte(s))
	}
	msg, _ := m["msg"].(string)
	delete(m, "level")
	delete(m, "msg")
	delete(m, "time")
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	attrs := make([]any, 0, 2*len(keys))
	for _, k := range keys {
		attrs = append(attrs, slog.Any("hive_"+k, m[k]))
	}
	o.log.Log(context.Background(), level, "hive: "+msg, attrs...)
}

// tail is the last lines the hive wrote, the most useful first: an error
// line if there is one.
func (o *hiveOutput) tail() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	for i := len(o.last) - 1; i >= 0; i-- {
		var m map[string]any
		if json.Unmarshal([]byte(o.last[i]), &m) == nil {
			if lvl, _ := m["level"].(string); lvl == "ERROR" {
				msg, _ := m["msg"].(string)
				if e, ok := m["err"].(string); ok {
					msg += ": " + e
				}
				return msg
			}
			continue
		}
		return o.last[i] // plain text: apiary's one-line error, or ssh's
	}
	if n := len(o.last); n > 0 {
		return o.last[n-1]
	}
	return ""
}

// urlHost is the host of a URL, without port and brackets.
func urlHost(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return ""
	}
	return p.Hostname()
}
