// Package hive is apiary's pool manager: one daemon per node that spawns,
// watches and stops the node's worker processes, keeps their registry and
// lifecycle history, reports the node's devices, and tells the queen about
// all of it.
//
// Every worker is owned by one goroutine (worker.run) that drives its
// lifecycle.Machine; policy (health, idle, memory fit) is pure and lives in
// policy.go; effects (processes, worker HTTP, GGUF headers) are behind the
// interfaces of effects.go.
package hive

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/gpu"
	"github.com/apiary-llm/apiary/internal/kube"
	"github.com/apiary-llm/apiary/internal/modelstore"
	"github.com/apiary-llm/apiary/internal/version"
)

// Hive is a running pool manager. Create it with New, run it with Run.
type Hive struct {
	cfg      Config
	log      *slog.Logger
	devices  gpu.Inventory
	launcher Launcher
	client   WorkerClient
	models   ModelInspector
	metrics  *metrics
	reg      *registry
	data     *dataDir
	queen    *queenClient // nil when standalone
	// pods is the Kubernetes cluster that runs the workers (Config.Kube);
	// nil: local processes. leave is closed when the hive leaves its
	// worker Pods running as it stops (hive/kube.go); leaving says it
	// should.
	pods    *kube.Cluster
	leave   chan struct{}
	leaving atomic.Bool
	// lifelineEnded is closed once the lifeline's watcher has read its
	// end (and said, with leaving, whether the owner died).
	lifelineEnded chan struct{}
	// queenEpoch is the newest fencing epoch of a queen this hive has
	// seen (fence.go).
	queenEpoch atomic.Int64
	pulls      *pulls // model pulls (POST /v2/models/pull)
	digests    *modelstore.Digests
	// onEvent, when set before Run (tests), sees every worker event
	// synchronously, in order, from the worker's owner.
	onEvent func(api.WorkerEvent)

	owners sync.WaitGroup // one per worker owner goroutine
	// checks are the memory release checks of ended GPU workers
	// (checkRelease); checkCtx ends them when the hive stops.
	checks     sync.WaitGroup
	checkCtx   context.Context
	stopChecks context.CancelFunc
	lease      chan struct{} // renewals of the lease on the queen; nil without one

	ready    chan struct{}
	settled  chan struct{} // closed after the first registration try (or at ready without a queen)
	done     chan struct{}
	shutdown chan struct{} // closed to ask Run to cascade and return
	addr     net.Addr      // set before ready is closed

	shutdownOnce sync.Once
	settleOnce   sync.Once
	closeOnce    sync.Once
	runOnce      sync.Once
}

// New checks cfg (after filling defaults) and prepares a hive. Nothing is
// bound or spawned until Run.
func New(cfg Config) (*Hive, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.FrontPath == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("find own executable for engine fronts: %w", err)
		}
		cfg.FrontPath = exe
	}
	if cfg.WorkerPath == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("find own executable for workers: %w", err)
		}
		cfg.WorkerPath = exe
	}
	if cfg.WorkerHost == "" {
		host, _, _ := net.SplitHostPort(cfg.Addr)
		ip := net.ParseIP(host)
		if host == "" || (ip != nil && ip.IsUnspecified()) {
			host = "127.0.0.1"
		}
		cfg.WorkerHost = host
	}
	h := &Hive{
		cfg:           cfg,
		log:           cfg.Logger.With("component", "hive", "pool_id", cfg.PoolID),
		devices:       cfg.Devices,
		launcher:      newSpawner(),
		client:        newHTTPWorkerClient(),
		models:        ggufInspector{},
		reg:           newRegistry(cfg.PortMin, cfg.MaxLoaded),
		ready:         make(chan struct{}),
		settled:       make(chan struct{}),
		done:          make(chan struct{}),
		shutdown:      make(chan struct{}),
		leave:         make(chan struct{}),
		lifelineEnded: make(chan struct{}),
	}
	if cfg.Kube != nil {
		if err := h.openKube(); err != nil {
			return nil, err
		}
	}
	if h.devices == nil {
		h.devices = gpu.Detect(h.log)
	}
	if cfg.CPUMemory > 0 {
		h.devices = gpu.CapCPU(h.devices, cfg.CPUMemory)
	}
	h.checkCtx, h.stopChecks = context.WithCancel(context.Background())
	h.metrics = newMetrics(h)
	h.pulls = newPulls(h)
	h.digests = modelstore.NewDigests()
	if cfg.LeaseTimeout > 0 {
		h.lease = make(chan struct{}, 1)
	}
	if cfg.QueenURL != "" {
		h.queen = newQueenClient(h)
	}
	return h, nil
}

// Ready is closed once the hive serves.
func (h *Hive) Ready() <-chan struct{} { return h.ready }

// Done is closed once Run has returned.
func (h *Hive) Done() <-chan struct{} { return h.done }

// Addr is the address the hive listens on; valid after Ready.
func (h *Hive) Addr() net.Addr { return h.addr }

// URL is the hive's base URL for others (--advertise, or its listen
// address); valid after Ready.
func (h *Hive) URL() string {
	if h.cfg.Advertise != "" {
		return h.cfg.Advertise
	}
	return h.cfg.TLS.Scheme() + "://" + h.addr.String()
}

// Shutdown asks a running hive to stop all workers and return from Run.
// It does not wait; see Done.
func (h *Hive) Shutdown() {
	h.shutdownOnce.Do(func() { close(h.shutdown) })
}

// Run serves until ctx ends or Shutdown is called, then cascades. A
// cancelled ctx is a clean exit (nil). Run may be called once.
//
//  1. lock the data dir and kill what a previous hive left alive
//  2. listen, serve, register with the queen
//  3. on ctx end or Shutdown: refuse new workers, stop every worker in
//     parallel (shutdown ack, SIGTERM, SIGKILL), wait until all are reaped
//  4. deliver the last events to the queen, stop serving, release the rest
func (h *Hive) Run(ctx context.Context) (err error) {
	ran := false
	h.runOnce.Do(func() { ran = true })
	if !ran {
		return errors.New("Run called twice")
	}
	defer close(h.done)
	defer h.release()

	if h.data, err = openDataDir(h.cfg.DataDir); err != nil {
		return err
	}
	if killed, err := h.data.reapSurvivors(h.log, 10*time.Second); err != nil {
		return err
	} else if len(killed) > 0 {
		h.log.Warn("previous hive left workers running; killed them", "pids", killed)
	}
	if h.pods != nil {
		if err := h.pods.Start(ctx); err != nil {
			return err
		}
		if err := h.adoptPods(ctx); err != nil {
			return err
		}
	}
	ln, err := net.Listen("tcp", h.cfg.Addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", h.cfg.Addr, err)
	}
	h.addr = ln.Addr()
	if ln, err = h.cfg.TLS.Listen(ln); err != nil {
		return err
	}
	srv := &http.Server{
		Handler:           h.routes(),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute, // idle keep-alive connections are closed: they cost a socket each
		ErrorLog:          slog.NewLogLogger(h.log.Handler(), slog.LevelWarn),
	}

	serveCtx, stopServe := context.WithCancel(context.Background())
	defer stopServe()
	g, gctx := errgroup.WithContext(serveCtx)
	g.Go(func() error {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("serve: %w", err)
		}
		return nil
	})
	queenCtx, stopQueen := context.WithCancel(context.Background())
	defer stopQueen()
	if h.queen != nil {
		g.Go(func() error { h.queen.run(queenCtx); return nil })
	}
	stopOwnerLoops := h.ownerLoops(func(fn func()) { g.Go(func() error { fn(); return nil }) }, queenCtx)
	h.pruneKVCache()
	g.Go(func() error { h.pruneLogsLoop(queenCtx); return nil })
	g.Go(func() error { h.digests.Run(queenCtx); return nil })
	h.log.Info("hive serving", "addr", h.addr.String(), "url", h.URL(), "data_dir", h.cfg.DataDir, "models_dir", h.cfg.ModelsDir,
		"version", version.Version, "owner", h.cfg.Owner)
	close(h.ready)
	if h.queen == nil {
		h.settle()
	}

	var cause error
	select {
	case <-ctx.Done():
		h.log.Info("hive shutting down", "cause", context.Cause(ctx))
		if h.pods != nil && h.cfg.Lifeline != nil {
			// A parent that dies sends its death signal (SIGTERM) a
			// moment before its end of the lifeline closes: the
			// lifeline says whether it died (worker Pods stay) or
			// asked for the stop.
			select {
			case <-h.lifelineEnded:
			case <-time.After(2 * time.Second):
			}
		}
	case <-h.shutdown:
		h.log.Info("hive shutting down", "cause", "shutdown requested")
	case <-gctx.Done():
		cause = errors.New("server stopped")
	}

	start := time.Now()
	h.cascade()
	h.stopChecks() // the workers' memory release checks end with the hive
	h.checks.Wait()
	h.log.Info("all workers stopped", "took", time.Since(start).Round(time.Millisecond).String())
	h.pulls.close() // a pull under way stops; its partial files stay, for the next pull to resume

	stopQueen() // the queen client flushes pending events before it returns
	stopOwnerLoops()
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	stopServe()
	if err := g.Wait(); err != nil {
		return err
	}
	return cause
}

// cascade stops every worker in parallel and waits until each is gone;
// a hive whose worker Pods outlive it (leaving) stops watching them
// instead.
func (h *Hive) cascade() {
	if h.pods != nil && h.leaving.Load() {
		ws := h.reg.close()
		close(h.leave)
		h.owners.Wait()
		h.log.Warn("the hive's owner is gone: its worker pods keep running, for the next hive of the installation to adopt", "pods", len(ws))
		return
	}
	for _, w := range h.reg.close() {
		w.requestStop(stopCmd{reason: "hive shutting down", cascade: true})
	}
	h.owners.Wait()
}

// release frees what New and Run took; it runs once, at the end of Run.
func (h *Hive) release() {
	h.closeOnce.Do(func() {
		h.owners.Wait()
		h.stopChecks()
		h.checks.Wait()
		h.pulls.close()
		if h.launcher != nil {
			_ = h.launcher.Close()
		}
		if c, ok := h.client.(*httpWorkerClient); ok {
			c.close()
		}
		if h.devices != nil {
			_ = h.devices.Close()
		}
		if h.data != nil {
			h.data.close()
		}
		if h.cfg.Lifeline != nil {
			_ = h.cfg.Lifeline.Close()
		}
	})
}

// Close shuts a running hive down and waits for Run to return; on a hive
// that never ran it frees what New took. It is idempotent. The order:
//
//  1. refuse new workers
//  2. stop every worker in parallel: POST /v1/admin/shutdown (ack within
//     ShutdownAck), exit awaited for StopGrace, then SIGTERM to its group,
//     then SIGKILL ShutdownAck later; wait until each is reaped
//  3. deliver the last worker events to the queen (2s at most)
//  4. stop the HTTP server, the spawner thread, NVML; unlock the data dir;
//     close the lifeline (the parent's pipe, if any)
func (h *Hive) Close() error {
	neverRan := false
	h.runOnce.Do(func() { neverRan = true })
	if neverRan {
		h.release()
		return nil
	}
	h.Shutdown()
	<-h.done
	return nil
}

// emit hands a worker transition to the queen client, if any.
func (h *Hive) emit(ev api.WorkerEvent) {
	ev.PoolID = h.cfg.PoolID
	if h.onEvent != nil {
		h.onEvent(ev)
	}
	if h.queen != nil {
		h.queen.enqueue(ev)
	}
}

// gpus is the device inventory joined with what workers hold.
func (h *Hive) gpus(ctx context.Context) ([]api.GPU, error) {
	devs, err := h.devices.Devices(ctx)
	if err != nil {
		return nil, err
	}
	return h.reg.devices(devs), nil
}
