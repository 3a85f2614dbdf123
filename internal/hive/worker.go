package hive

import (
	"context"
	"crypto/subtle"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/gpu"
	"github.com/apiary-llm/apiary/internal/kube"
	"github.com/apiary-llm/apiary/internal/lifecycle"
	"github.com/apiary-llm/apiary/internal/procs"
)

// worker is one worker process and its state machine. Exactly one goroutine,
// run, owns the machine and every field below "owned by run": HTTP handlers
// and the hive reach it only through cmds, stating intent (ready, stop)
// rather than acting on a snapshot. run publishes a snapshot to the
// registry after every change.
type worker struct {
	h         *Hive
	log       *slog.Logger
	id        string
	lifecycle string
	modelRef  string
	device    gpu.Device // the worker's device; of a split worker, the first
	// split are, for a worker split over several GPUs, every one (device
	// first), and shares its estimate's share on each (in proportion to
	// what each had available at its start); nil for one device.
	split  []gpu.Device
	shares []uint64
	port   int
	// listener is the worker's socket, bound by admit and handed to the
	// process at spawn (--listen-fd); the hive closes its copy then.
	listener *net.TCPListener
	uri      string // where the worker will listen
	token    string
	estimate uint64
	// driverCounts: the GPU's driver reports each process's memory
	// (CUDA with NVML); baseline is the memory no process held on the
	// device at spawn.
	driverCounts bool
	baseline     uint64
	baselines    []uint64 // of a split worker, baseline on each device
	// engine is the external engine this worker runs behind its front
	// (apiary engine-front); nil: the built-in worker. healthURL is the
	// engine's health path on its loopback port.
	engine    *Engine
	healthURL string
	// idleTimeout stops the worker once it served nothing this long
	// (the start's idle_timeout_ms, else the hive's IdleTimeout);
	// negative: never.
	idleTimeout time.Duration
	spawnedAt   time.Time
	proc        Process
	out         *workerLog

	cmds chan any      // readyCmd, stopCmd
	done chan struct{} // closed when run has returned and the worker is gone

	// owned by run:
	m        *lifecycle.Machine
	reason   string
	vram     uint64
	vramOn   []uint64 // of a split worker, the driver's count on each device
	readyAt  time.Time
	lastReq  *time.Time
	inFlight int
	misses   int
	exit     *procs.Exit
	endedAt  time.Time

	// guarded by registry.mu:
	snap api.Worker
	hold []held // on each of devs()
}

// devs are every device the worker runs on: split, or device alone.
func (w *worker) devs() []gpu.Device {
	if len(w.split) == 0 {
		return []gpu.Device{w.device}
	}
	return w.split
}

// share is the worker's estimate on its i-th device (devs).
func (w *worker) share(i int) uint64 {
	if len(w.shares) == 0 {
		return w.estimate
	}
	return w.shares[i]
}

type readyCmd struct {
	token string
	cb    api.ReadyCallback
	reply chan error
}

type stopCmd struct {
	drain   bool
	grace   time.Duration
	reason  string
	cascade bool
	reply   chan error
}

// ready applies a ready callback: right token, state starting, plausible
// report. An implausible report from the right token fails the worker.
func (w *worker) ready(c readyCmd) error {
	if subtle.ConstantTimeCompare([]byte(c.token), []byte(w.token)) != 1 {
		w.log.Warn("ready callback with a wrong token refused")
		return fmt.Errorf("%w: wrong token for worker %s", ErrUnauthorized, w.id)
	}
	if st := w.m.State(); st != lifecycle.Starting {
		return fmt.Errorf("%w: worker %s is %s", ErrNotStarting, w.id, st)
	}
	err := plausibleVRAM(c.cb.VRAMBytes, w.devs())
	if err == nil {
		err = w.checkURI(c.cb.URI)
	}
	if err != nil {
		if w.transition(lifecycle.Failed, err.Error()) {
			w.proc.Kill()
		}
		return err
	}
	w.vram = c.cb.VRAMBytes // w.uri stays the hive's own: its host and scheme
	if p, ok := w.proc.(*kube.Pod); ok {
		w.uri = podURI(p, c.cb.URI)
	}
	if w.driverCounts {
		// On a GPU the driver's count of the process's memory is the truth.
		var on []uint64
		var used uint64
		listed := false
		for _, d := range w.devs() {
			u, ok := w.h.driverVRAM(context.Background(), d, w.proc.PID())
			on = append(on, u)
			used += u
			listed = listed || ok
		}
		if listed && used > 0 {
			w.vram = used
			if len(w.split) > 0 {
				w.vramOn = on
			}
		} else {
			w.log.Warn("the driver lists no GPU memory for the worker's process; keeping its own report", "pid", w.proc.PID(), "vram_bytes", w.vram)
		}
	}
	w.readyAt = time.Now()
	w.h.metrics.readyLatency.Observe(w.readyAt.Sub(w.spawnedAt).Seconds())
	w.transition(lifecycle.Ready, fmt.Sprintf("ready callback: %s at %s", api.FormatBytes(w.vram), w.uri))
	return nil
}

// checkURI accepts the uri a worker reports only if it points at the port
// the hive gave it. The hive keeps its own uri of the worker either way
// (its host and scheme), so the report cannot send the queen elsewhere.
func (w *worker) checkURI(raw string) error {
	// Only its port counts (the host may be left out: the hive keeps its
	// own); the rest must still be a plain http(s) URL.
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("%w: uri %q is not an http(s) URL of host and port", ErrImplausibleReady, api.Printable(raw, 200))
	}
	if u.Port() != strconv.Itoa(w.port) {
		return fmt.Errorf("%w: uri %q is not on the assigned port %d", ErrImplausibleReady, raw, w.port)
	}
	return nil
}

// observe takes what a successful probe says about the worker's work.
func (w *worker) observe(r probeResult) {
	if r.err != nil {
		return
	}
	w.inFlight = r.health.InFlight
	if r.health.LastRequestAt != nil {
		t := *r.health.LastRequestAt
		w.lastReq = &t
	}
}

// exited records how the process ended (kind: how its stop ended it,
// "graceful" or "forced"), waits until its group and output
// are gone, releases its memory and port, and removes it from the registry.
func (w *worker) exited(kind string) {
	ex := w.proc.Exit()
	w.exit = &ex
	switch st := w.m.State(); {
	case st == lifecycle.Draining:
		w.h.metrics.stops.WithLabelValues(kind).Inc()
		w.transition(lifecycle.Stopped, fmt.Sprintf("%s stop: %s", kind, ex))
	case st.Terminal():
		w.publish() // already failed; record the exit
	default:
		w.h.metrics.crashes.WithLabelValues(exitLabel(ex)).Inc()
		w.transition(lifecycle.Failed, fmt.Sprintf("process exited unexpectedly: %s", ex))
	}
	<-w.proc.Done()
	w.out.close()
	if st := w.m.State(); st == lifecycle.Failed {
		w.log.Error("worker failed", "reason", w.reason, "exit", ex.String(), "last_output", w.out.Tail(20))
	}
	w.endedAt = time.Now()
	w.publish()
	w.h.data.removeRecord(w.id)
	w.h.reg.remove(w)
	w.h.metrics.workers.WithLabelValues(string(w.m.State())).Dec()
	if w.driverCounts {
		for i, d := range w.devs() {
			base := w.baseline
			if len(w.baselines) > 0 {
				base = w.baselines[i]
			}
			w.h.checks.Add(1)
			go w.h.checkRelease(w, d, w.proc.PID(), base)
		}
	}
}

// transition is the only way the worker's state changes: it checks the
// table, records history, publishes the snapshot, logs, counts and tells the
// queen. It reports whether the change happened.
func (w *worker) transition(to lifecycle.State, reason string) bool {
	t, err := w.m.Transition(to, reason, time.Now())
	if err != nil {
		w.log.Error("refused state change", "err", err, "reason", reason)
		return false
	}
	w.reason = reason
	snap := w.publish()
	w.log.Info("worker state", "from", string(t.From), "to", string(t.To), "reason", reason,
		"after", t.InFrom.Round(time.Millisecond).String())
	w.h.metrics.workers.WithLabelValues(string(t.From)).Dec()
	w.h.metrics.workers.WithLabelValues(string(t.To)).Inc()
	ev := api.WorkerEvent{
		WorkerID: w.id, LifecycleID: w.lifecycle,
		From: string(t.From), To: string(t.To), Reason: reason, At: t.At, Worker: snap.Brief(),
	}
	if !t.To.Terminal() {
		ev.WorkerToken = w.token
	}
	w.h.emit(ev)
	return true
}

// publish stores the current snapshot and memory hold in the registry.
func (w *worker) publish() api.Worker {
	st := w.m.State()
	snap := api.Worker{
		WorkerID: w.id, LifecycleID: w.lifecycle, ModelRef: w.modelRef, GPUDevice: w.device.ID,
		VRAMBytes: w.vram, URI: w.uri, Status: string(st), Reason: w.reason, PID: w.proc.PID(),
		InFlight: w.inFlight, StartedAt: w.spawnedAt, IdleTimeoutMS: max(w.idleTimeout, 0).Milliseconds(),
	}
	if !w.readyAt.IsZero() {
		t := w.readyAt
		snap.ReadyAt = &t
	}
	if !w.endedAt.IsZero() {
		t := w.endedAt
		snap.StoppedAt = &t
	}
	if w.exit != nil {
		c := w.exit.Code
		snap.ExitCode = &c
	}
	snap.Transitions = w.m.Total()
	if p, ok := w.proc.(*kube.Pod); ok {
		snap.Pod, snap.Node = p.Ref(), p.Node()
	}
	for _, t := range w.m.History() {
		snap.History = append(snap.History, api.Transition{
			From: string(t.From), To: string(t.To), Reason: t.Reason, At: t.At, DurationMS: t.InFrom.Milliseconds(),
		})
	}
	// Memory is held until the process is gone, whatever the state says.
	devs := w.devs()
	hs := make([]held, len(devs))
	for i := range devs {
		switch {
		case w.exit != nil:
		case w.vram > 0 && len(w.split) == 0:
			hs[i].allocated = w.vram
		case w.vram > 0 && len(w.vramOn) == len(devs):
			hs[i].allocated = w.vramOn[i]
		case w.vram > 0:
			// The worker's own report of a split: each device's share of it.
			hs[i].allocated = w.vram * w.share(i) / max(w.estimate, 1)
		default:
			hs[i].reserved = w.share(i)
		}
	}
	if len(w.split) > 0 {
		for i, d := range devs {
			snap.Devices = append(snap.Devices, api.WorkerDevice{ID: d.ID, VRAMBytes: hs[i].total()})
		}
	}
	w.h.reg.publish(w, snap, hs)
	return snap
}

func exitLabel(ex procs.Exit) string {
	if ex.Code < 0 {
		return "signal_" + strconv.Itoa(int(ex.Signal))
	}
	return strconv.Itoa(ex.Code)
}
