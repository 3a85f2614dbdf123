package worker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/apiary-llm/apiary/internal/engine"
	"github.com/apiary-llm/apiary/internal/gguf"
	"github.com/apiary-llm/apiary/internal/rpc"
	"github.com/apiary-llm/apiary/internal/transport"
)

// Sentinel errors.
var (
	// ErrModelFile means the model path does not exist or is not a GGUF file.
	ErrModelFile = errors.New("unusable model file")
	// ErrLoad means the engine could not load the model.
	ErrLoad = errors.New("model load failed")
	// ErrCallbackRefused means the ready callback was answered with a 4xx.
	ErrCallbackRefused = errors.New("ready callback refused")
	// ErrCallbackFailed means the ready callback never got an answer it
	// could accept within the allowed attempts.
	ErrCallbackFailed = errors.New("ready callback failed")
	// ErrBadTransition means a status change the table does not allow.
	ErrBadTransition = errors.New("status transition not allowed")
	// ErrShutdown is the cause given to generations cancelled because the
	// shutdown grace period ran out.
	ErrShutdown = errors.New("shut down before the generation finished")
)

// Loader loads the model; the worker calls it once, after it listens, with
// its own logger (worker_id on every line). Production wraps llamacpp.Load,
// tests return a fake engine.
type Loader func(ctx context.Context, opts engine.Options, log *slog.Logger) (engine.Engine, error)

// cancelWait bounds the wait for cancelled generations to return, after the
// grace period, before the engine is closed under them.
const cancelWait = 5 * time.Second

// Worker serves one model over the OpenAI-compatible HTTP API.
type Worker struct {
	cfg  Config
	load Loader
	log  *slog.Logger

	created   time.Time
	started   atomic.Bool   // Run was called
	listening chan struct{} // closed once the listener is open
	ready     chan struct{} // closed once the model is loaded
	slots     chan struct{} // one element per generation running

	// quitCtx ends on RequestShutdown. drainCtx ends when draining starts:
	// queued requests give up. hardCtx ends when the grace period ran out:
	// generations are cancelled.
	quitCtx, drainCtx, hardCtx          context.Context
	requestQuit, startDrain, cancelHard context.CancelFunc

	queens *rpc.Queens // with QueenURL: the queens and the one spoken to; else nil

	mu            sync.Mutex
	status        Status           // guarded by mu; changed only by transitionLocked
	statusSince   time.Time        // guarded by mu
	addr          net.Addr         // guarded by mu; set once listening
	eng           engine.Engine    // guarded by mu; set once ready
	info          engine.ModelInfo // guarded by mu; set once ready
	inFlight      int              // guarded by mu
	queued        int              // guarded by mu
	lastRequestAt time.Time        // guarded by mu; zero until the first request
	idle          chan struct{}    // guarded by mu; closed when draining and nothing is in flight or queued

	templates templates // the model's chat template, compiled on first use
}

// New checks cfg and returns a worker that will load the model with load
// when Run is called.
func New(cfg Config, load Loader) (*Worker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if load == nil {
		return nil, fmt.Errorf("%w: no model loader", ErrInvalidConfig)
	}
	log := cfg.Logger.With("worker_id", cfg.WorkerID)
	if cfg.LifecycleID != "" {
		log = log.With("lifecycle_id", cfg.LifecycleID)
	}
	w := &Worker{
		queens:      queensOf(cfg.QueenURL),
		cfg:         cfg,
		load:        load,
		log:         log,
		created:     time.Now(),
		listening:   make(chan struct{}),
		ready:       make(chan struct{}),
		slots:       make(chan struct{}, cfg.Slots),
		status:      StatusLoading,
		statusSince: time.Now(),
		idle:        make(chan struct{}),
	}
	w.quitCtx, w.requestQuit = context.WithCancel(context.Background())
	w.drainCtx, w.startDrain = context.WithCancel(context.Background())
	w.hardCtx, w.cancelHard = context.WithCancel(context.Background())
	return w, nil
}

// Listening is closed once the worker accepts connections (Addr is set).
func (w *Worker) Listening() <-chan struct{} { return w.listening }

// Ready is closed once the model is loaded and requests are served.
func (w *Worker) Ready() <-chan struct{} { return w.ready }

// Addr is the address the worker listens on; nil before Listening.
func (w *Worker) Addr() net.Addr {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.addr
}

// URL is the worker's base URL, http://host:port; empty before Listening.
func (w *Worker) URL() string {
	addr := w.Addr()
	if addr == nil {
		return ""
	}
	return "http://" + addr.String()
}

// RequestShutdown starts a graceful shutdown, as cancelling Run's context
// does. It returns at once; it is safe to call more than once.
func (w *Worker) RequestShutdown() { w.requestQuit() }

// Run serves until ctx ends or a shutdown is requested, then drains. In
// order:
//
//  1. check that the model file is a readable GGUF (ErrModelFile);
//  2. listen (status loading: inference answers 503 model_loading);
//  3. load the model (status ready);
//  4. with a CallbackURL, report ready; a refusal or no answer stops the
//     worker with ErrCallbackRefused or ErrCallbackFailed. With a
//     QueenURL, claim a row at the queen instead (ErrClaimRefused,
//     ErrClaimFailed);
//  5. serve until ctx ends or RequestShutdown; with a claimed row, send
//     the claim again every ClaimInterval (see reclaim): a queen that
//     no longer has the row stops the worker (ErrClaimRefused);
//  6. drain (see drain) and return nil; with a claimed row, the queen is
//     told DRAINING before and STOPPED after.
//
// A shutdown requested while the model loads is clean too (nil).
func (w *Worker) Run(ctx context.Context) error {
	if !w.started.CompareAndSwap(false, true) {
		return errors.New("Run called twice")
	}
	if err := checkModelFile(w.cfg.ModelPath); err != nil {
		return err
	}
	ln := w.cfg.Listener
	if ln == nil {
		var err error
		if ln, err = net.Listen("tcp", w.cfg.Addr); err != nil {
			return fmt.Errorf("listen on %s: %w", w.cfg.Addr, err)
		}
	}
	addr := ln.Addr()
	ln, err := w.cfg.TLS.Listen(ln)
	if err != nil {
		return err
	}
	srv := transport.Serve(ln, w.Handler(), w.log)
	w.mu.Lock()
	w.addr = addr
	w.mu.Unlock()
	close(w.listening)
	w.log.Info("listening", "addr", ln.Addr().String(), "model", w.cfg.ModelRef, "model_path", w.cfg.ModelPath,
		"cpu_backend", w.cfg.CPUBackend, "cpu_backend_reason", w.cfg.CPUBackendReason)

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(w.quitCtx, cancel)()

	eng, err := w.loadModel(runCtx)
	if err != nil {
		srv.Stop(w.log, cancelWait)
		if runCtx.Err() != nil {
			w.setStatus(StatusDraining, "shutdown requested while loading")
			w.setStatus(StatusStopped, "shut down before the model was loaded")
			return nil
		}
		w.setStatus(StatusFailed, err.Error())
		return err
	}

	var report error
	var rowID string // the queen's row this worker claimed (QueenURL)
	switch {
	case w.cfg.CallbackURL != "":
		report = w.reportReady(runCtx)
	case w.cfg.QueenURL != "":
		rowID, report = w.claim(runCtx)
	}
	if report != nil && runCtx.Err() == nil {
		w.setStatus(StatusFailed, report.Error())
		srv.Stop(w.log, cancelWait)
		w.closeEngine(eng)
		return report
	}

	var lost error // the queen no longer has the claimed row (reclaim)
	var reclaims sync.WaitGroup
	if rowID != "" {
		reclaims.Go(func() { lost = w.reclaim(runCtx, rowID) })
	}
	why := "shutdown requested"
	select {
	case <-runCtx.Done():
	case <-srv.Done(): // the listener failed under us: nothing can reach the worker
		w.log.Error("http server stopped", "err", srv.Err())
		why = "the worker's HTTP server stopped"
	}
	cancel()
	reclaims.Wait()
	if lost != nil {
		why = lost.Error()
	}
	w.report(rowID, "DRAINING", why)
	err = w.drain(srv, eng)
	w.report(rowID, "STOPPED", "the worker drained and stopped: "+why)
	return cmp.Or(err, lost)
}

// checkModelFile makes sure path is a GGUF file before anything is loaded,
// so that a wrong path gets a clear message rather than llama.cpp's.
func checkModelFile(path string) error {
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: model file %s does not exist", ErrModelFile, path)
	} else if err != nil {
		return fmt.Errorf("%w: %w", ErrModelFile, err)
	}
	if _, err := gguf.Open(path); err != nil {
		return fmt.Errorf("%w: %s is not a usable GGUF model: %w", ErrModelFile, path, err)
	}
	return nil
}

// loadModel runs the loader and makes the worker ready.
func (w *Worker) loadModel(ctx context.Context) (engine.Engine, error) {
	start := time.Now()
	eng, err := w.load(ctx, w.cfg.Engine, w.log)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrLoad, w.cfg.ModelPath, err)
	}
	w.restoreKV(ctx, eng)
	info := eng.Info()
	w.mu.Lock()
	w.eng, w.info = eng, info
	err = w.transitionLocked(StatusReady, "model loaded")
	w.mu.Unlock()
	if err != nil { // a shutdown raced the load
		w.closeEngine(eng)
		return nil, err
	}
	close(w.ready)
	w.log.Info("serving", "load_ms", time.Since(start).Milliseconds(), "ctx_per_slot", info.CtxSize,
		"vram_bytes", info.MemoryBytes, "slots", w.cfg.Slots, "queue", w.cfg.QueueSize)
	return eng, nil
}

// setStatus is transitionLocked for callers not holding mu; a refused
// transition is logged, not returned (it is a bug, not a runtime failure).
func (w *Worker) setStatus(to Status, reason string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.transitionLocked(to, reason); err != nil {
		w.log.Error("status transition refused", "err", err)
	}
}

// drain shuts the worker down gracefully:
//
//  1. status draining: new requests get 503 draining, queued ones give up;
//  2. in-flight generations run on, for up to ShutdownGrace;
//  3. the ones still running are cancelled (a stream gets a final error
//     event) and given cancelWait to return;
//  4. the HTTP server stops;
//  5. with a KVCacheDir, the slots' KV cache is saved (see saveKV);
//  6. the engine is closed, unloading the model; status stopped.
func (w *Worker) drain(srv *transport.Server, eng engine.Engine) error {
	w.mu.Lock()
	if err := w.transitionLocked(StatusDraining, "shutdown requested"); err != nil {
		w.log.Error("status transition refused", "err", err)
	}
	idle, inFlight, queued := w.idle, w.inFlight, w.queued
	w.mu.Unlock()
	w.startDrain()
	w.log.Info("draining", "in_flight", inFlight, "queued", queued, "grace_ms", w.cfg.ShutdownGrace.Milliseconds())

	grace := time.NewTimer(w.cfg.ShutdownGrace)
	defer grace.Stop()
	select {
	case <-idle:
	case <-grace.C:
		w.log.Warn("shutdown grace period over; cancelling generations", "in_flight", w.inFlightNow())
		w.cancelHard()
		backstop := time.NewTimer(cancelWait)
		defer backstop.Stop()
		select {
		case <-idle:
		case <-backstop.C:
			w.log.Error("generations did not end after cancellation; closing the engine under them",
				"in_flight", w.inFlightNow())
		}
	}
	srv.Stop(w.log, cancelWait)
	w.saveKV(eng)
	w.closeEngine(eng)
	w.setStatus(StatusStopped, "drained")
	return nil
}

func (w *Worker) inFlightNow() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.inFlight
}

func (w *Worker) closeEngine(eng engine.Engine) {
	start := time.Now()
	if err := eng.Close(); err != nil {
		w.log.Error("closing the engine failed", "err", err)
		return
	}
	w.log.Info("model unloaded", "unload_ms", time.Since(start).Milliseconds())
}
