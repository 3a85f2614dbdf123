package hive

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/gpu"
	"github.com/apiary-llm/apiary/internal/lifecycle"
	"github.com/apiary-llm/apiary/internal/procs"
)

// The owner loop with fake effects, in a synctest bubble: the contract's
// default timings, checked to the second without waiting for them.

type fakeProc struct {
	mu      sync.Mutex
	signals []syscall.Signal // guarded by mu
	dieOn   syscall.Signal   // guarded by mu; exit when this signal arrives
	exit    procs.Exit       // guarded by mu
	exited  chan struct{}
	once    sync.Once
}

func newFakeProc() *fakeProc { return &fakeProc{exited: make(chan struct{})} }

func (p *fakeProc) PID() int                 { return 4242 }
func (p *fakeProc) Identity() procs.Identity { return procs.Identity{PID: 4242, PGID: 4242} }
func (p *fakeProc) Exited() <-chan struct{}  { return p.exited }
func (p *fakeProc) Done() <-chan struct{}    { return p.exited }
func (p *fakeProc) Exit() procs.Exit         { <-p.exited; p.mu.Lock(); defer p.mu.Unlock(); return p.exit }
func (p *fakeProc) Kill()                    { _ = p.Signal(syscall.SIGKILL) }
func (p *fakeProc) end(e procs.Exit) {
	p.once.Do(func() { p.mu.Lock(); p.exit = e; p.mu.Unlock(); close(p.exited) })
}
func (p *fakeProc) sent() []syscall.Signal {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]syscall.Signal(nil), p.signals...)
}
func (p *fakeProc) Signal(s syscall.Signal) error {
	p.mu.Lock()
	p.signals = append(p.signals, s)
	die := s == syscall.SIGKILL || s == p.dieOn
	p.mu.Unlock()
	if die {
		p.end(procs.Exit{Code: -1, Signal: s})
	}
	return nil
}

type fakeLauncher struct{ proc *fakeProc }

func (l *fakeLauncher) Launch(context.Context, procs.Spec) (Process, error) { return l.proc, nil }
func (l *fakeLauncher) Close() error                                        { return nil }

// fakeClient answers health checks with health (or err) and shutdowns with
// shutdownErr; a shutdown also ends proc when exitOnShutdown.
type fakeClient struct {
	mu             sync.Mutex
	health         api.WorkerHealth // guarded by mu
	err            error            // guarded by mu
	shutdowns      int              // guarded by mu
	exitOnShutdown bool             // guarded by mu
	proc           *fakeProc
}

func (c *fakeClient) Health(context.Context, string) (api.WorkerHealth, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.health, c.err
}

func (c *fakeClient) Shutdown(context.Context, string, string) error {
	c.mu.Lock()
	c.shutdowns++
	exit := c.exitOnShutdown
	c.mu.Unlock()
	if exit {
		c.proc.end(procs.Exit{Code: 0})
	}
	return nil
}

func (c *fakeClient) set(fn func()) { c.mu.Lock(); defer c.mu.Unlock(); fn() }

type fakeInspector struct{}

func (fakeInspector) Inspect(string, int) (ModelInfo, error) {
	return ModelInfo{Architecture: "llama", MemoryBytes: 10 << 20}, nil
}

// ownerHive is a Hive with fake effects and default timings, not running.
func ownerHive(t *testing.T) (*Hive, *fakeProc, *fakeClient) {
	t.Helper()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "models"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "models", "m.gguf"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := Config{DataDir: dir, WorkerPath: "/bin/false", IdleTimeout: DefaultIdleTimeout,
		Devices: fixedDevices{{ID: 0, Kind: gpu.KindCPU, TotalBytes: 1 << 30, FreeBytes: 1 << 30}},
		Logger:  slog.New(slog.NewTextHandler(io.Discard, nil))}.withDefaults()
	proc := newFakeProc()
	client := &fakeClient{proc: proc, health: api.WorkerHealth{Status: "ready"}}
	h := &Hive{cfg: cfg, log: cfg.Logger, devices: cfg.Devices, launcher: &fakeLauncher{proc: proc},
		client: client, models: fakeInspector{}, reg: newRegistry(cfg.PortMin, cfg.MaxLoaded),
		addr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 9200}}
	h.metrics = newMetrics(h)
	var err error
	if h.data, err = openDataDir(dir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.data.close)
	return h, proc, client
}

func (h *Hive) state(t *testing.T, id string) lifecycle.State {
	t.Helper()
	w, ok := h.reg.get(id, true)
	if !ok {
		t.Fatalf("no worker %s", id)
	}
	return lifecycle.State(h.reg.snapshot(w).Status)
}

func spawnReady(t *testing.T, h *Hive) *worker {
	t.Helper()
	snap, err := h.startWorker(t.Context(), api.StartWorkerRequest{ModelRef: "m"})
	if err != nil {
		t.Fatal(err)
	}
	w, _ := h.reg.get(snap.WorkerID, false)
	if err := w.deliverReady(t.Context(), w.token, api.ReadyCallback{WorkerID: w.id, VRAMBytes: 1 << 20, URI: w.uri}); err != nil {
		t.Fatal(err)
	}
	return w
}

func TestOwnerCallbackTimeoutIsSixtySeconds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, proc, _ := ownerHive(t)
		snap, err := h.startWorker(t.Context(), api.StartWorkerRequest{ModelRef: "m"})
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(59 * time.Second)
		synctest.Wait()
		if st := h.state(t, snap.WorkerID); st != lifecycle.Starting {
			t.Fatalf("at 59s: %s", st)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if st := h.state(t, snap.WorkerID); st != lifecycle.Failed {
			t.Fatalf("at 60s: %s", st)
		}
		if s := proc.sent(); len(s) != 1 || s[0] != syscall.SIGKILL {
			t.Errorf("signals = %v, want SIGKILL", s)
		}
		h.owners.Wait()
	})
}

func TestOwnerThreeHealthMissesFailAtThirtySeconds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, proc, client := ownerHive(t)
		w := spawnReady(t, h)
		client.set(func() { client.err = errors.New("connection refused") })
		for i, want := range []lifecycle.State{lifecycle.Degraded, lifecycle.Degraded, lifecycle.Failed} {
			time.Sleep(10 * time.Second)
			synctest.Wait()
			if st := h.state(t, w.id); st != want {
				t.Fatalf("after miss %d: %s, want %s", i+1, st, want)
			}
		}
		if s := proc.sent(); len(s) != 1 || s[0] != syscall.SIGKILL {
			t.Errorf("signals = %v", s)
		}
		h.owners.Wait()
		if m := h.reg.list(false); len(m) != 0 {
			t.Errorf("failed worker still live: %+v", m)
		}
	})
}

func TestOwnerIdleTimeoutIsFiveMinutes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, _, client := ownerHive(t)
		client.set(func() { client.exitOnShutdown = true })
		w := spawnReady(t, h)
		time.Sleep(5*time.Minute - time.Second)
		synctest.Wait()
		if st := h.state(t, w.id); st != lifecycle.Ready {
			t.Fatalf("at 4m59s: %s", st)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if st := h.state(t, w.id); st != lifecycle.Stopped {
			t.Fatalf("at 5m: %s", st)
		}
		h.owners.Wait()
	})
}

func TestOwnerIdleClockFollowsLastRequest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, _, client := ownerHive(t)
		client.set(func() { client.exitOnShutdown = true })
		w := spawnReady(t, h)
		time.Sleep(4 * time.Minute)
		last := time.Now()
		client.set(func() { client.health.LastRequestAt = &last })
		time.Sleep(4 * time.Minute)
		synctest.Wait()
		if st := h.state(t, w.id); st != lifecycle.Ready {
			t.Fatalf("4m after the last request: %s", st)
		}
		time.Sleep(time.Minute + 10*time.Second)
		synctest.Wait()
		if st := h.state(t, w.id); st != lifecycle.Stopped {
			t.Fatalf("5m10s after the last request: %s", st)
		}
		h.owners.Wait()
	})
}

// A worker that acknowledges the shutdown but never exits gets SIGTERM at
// the stop grace (30s) and SIGKILL --shutdown-ack (5s) later.
func TestOwnerStopEscalatesTermThenKill(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, proc, client := ownerHive(t)
		w := spawnReady(t, h)
		if err := w.requestStop(stopCmd{reason: "test"}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		client.set(func() {
			if client.shutdowns != 1 {
				t.Errorf("shutdown requests = %d", client.shutdowns)
			}
		})
		time.Sleep(30*time.Second - time.Millisecond)
		synctest.Wait()
		if s := proc.sent(); len(s) != 0 {
			t.Fatalf("signalled before the grace: %v", s)
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
		if s := proc.sent(); len(s) != 1 || s[0] != syscall.SIGTERM {
			t.Fatalf("at 30s: %v, want SIGTERM", s)
		}
		time.Sleep(5 * time.Second)
		synctest.Wait()
		if s := proc.sent(); len(s) != 2 || s[1] != syscall.SIGKILL {
			t.Fatalf("at 35s: %v, want SIGKILL", s)
		}
		if st := h.state(t, w.id); st != lifecycle.Stopped {
			t.Errorf("state = %s", st)
		}
		snap := h.reg.snapshot(w)
		if !strings.Contains(snap.Reason, "forced") {
			t.Errorf("reason = %q", snap.Reason)
		}
		h.owners.Wait()
	})
}
