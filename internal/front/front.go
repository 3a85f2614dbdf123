// Package front runs an external inference server (llama.cpp's
// llama-server, vLLM, any OpenAI-compatible server) behind apiary's worker
// contract, so that a hive supervises it exactly as its built-in worker.
// The hive starts `apiary engine-front` on the worker's port; the front
// starts the engine as its child on a loopback port, waits for the
// engine's health path to answer 200, sends the hive the worker's ready
// callback, and then relays every request to the engine unchanged but
// for the bearer: it checks the worker's token itself and sends the
// engine its own key, if any. Because every request passes through it,
// it reports what the built-in worker reports on /health (requests in
// flight, when the last one was served), which the hive's idle timeout
// and drain read, and it drains as the built-in worker does: on
// POST /v1/admin/shutdown or SIGTERM new requests get 503 draining and
// those in flight get the shutdown grace to finish before the engine is
// stopped (SIGTERM, then SIGKILL).
package front

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/config"
	"github.com/apiary-llm/apiary/internal/procs"
	"github.com/apiary-llm/apiary/internal/rpc"
	"github.com/apiary-llm/apiary/internal/secret"
	"github.com/apiary-llm/apiary/internal/transport"
)

// Defaults.
const (
	DefaultShutdownGrace = 30 * time.Second
	DefaultStopWait      = 5 * time.Second
	DefaultHealthPath    = "/health"
	// ReadyPoll is how often a starting engine's health path is asked:
	// every FastPoll for its first FastPollFor (a small engine is up in
	// tens of milliseconds, and a refused loopback connect costs
	// microseconds), then every ReadyPoll.
	ReadyPoll   = 10 * time.Millisecond
	FastPoll    = 2 * time.Millisecond
	FastPollFor = time.Second
)

// ErrInvalidConfig means Config.Validate found a problem.
var ErrInvalidConfig = errors.New("invalid config")

// Config is one front.
type Config struct {
	WorkerID string
	ModelRef string // reported on /health
	// Listener is the socket to serve on (the hive's, inherited);
	// required.
	Listener net.Listener
	// Token is the worker's token: every request but GET (or HEAD) /health must
	// carry it as a bearer. Without one the front answers only requests
	// addressed to a loopback host, as the built-in worker does.
	Token string
	// CallbackURL receives the ready callback; "" serves standalone.
	CallbackURL string
	// Engine is what to run; EngineURL is where it serves (a loopback
	// base URL, http://127.0.0.1:PORT), HealthPath its health path
	// (default /health).
	Engine     Command
	EngineURL  string
	HealthPath string
	// EngineKey is sent to the engine as the bearer of every request it
	// is relayed; "" sends none.
	EngineKey string
	// MemoryBytes is the vram_bytes of the ready callback; 0 reports the
	// engine's resident set (the CPU device).
	MemoryBytes uint64
	// Slots is reported on /health; default 1.
	Slots int
	// ShutdownGrace is what requests in flight get to finish once a
	// shutdown begins; default DefaultShutdownGrace.
	ShutdownGrace time.Duration
	// StopWait is SIGTERM to SIGKILL of the engine; default
	// DefaultStopWait.
	StopWait time.Duration
	// CallbackTimeout bounds each ready callback attempt (three, a
	// second apart); default 10s.
	CallbackTimeout time.Duration
	TLS             transport.ServerTLS
	Logger          *slog.Logger // default slog.Default()
}

func (c Config) withDefaults() Config {
	config.Default(&c.HealthPath, DefaultHealthPath)
	config.Default(&c.Slots, 1)
	config.Default(&c.ShutdownGrace, DefaultShutdownGrace)
	config.Default(&c.StopWait, DefaultStopWait)
	config.Default(&c.CallbackTimeout, 10*time.Second)
	config.Default(&c.Logger, slog.Default())
	return c
}

// Validate reports every problem of c by field.
func (c Config) Validate() error {
	var p config.Problems
	if c.Listener == nil {
		p.Add("Listener", "is required: the socket the front serves on")
	}
	if c.Engine.Path == "" {
		p.Add("Engine", "is empty: the front needs an engine to run")
	}
	u, err := url.Parse(c.EngineURL)
	if err != nil || u.Scheme != "http" || u.Host == "" || !transport.IsLoopback(u.Hostname()) || (u.Path != "" && u.Path != "/") {
		p.Add("EngineURL", "%q must be http://LOOPBACK-HOST:PORT: the engine serves only the front", c.EngineURL)
	}
	if !strings.HasPrefix(c.HealthPath, "/") {
		p.Add("HealthPath", "%q must be a path starting with /", c.HealthPath)
	}
	if c.CallbackURL != "" && c.WorkerID == "" {
		p.Add("WorkerID", "is required with a callback URL")
	}
	for _, d := range []struct {
		field string
		v     time.Duration
	}{{"ShutdownGrace", c.ShutdownGrace}, {"StopWait", c.StopWait}, {"CallbackTimeout", c.CallbackTimeout}} {
		if d.v <= 0 {
			p.Add(d.field, "must be positive, got %s", d.v)
		}
	}
	if c.Slots < 1 {
		p.Add("Slots", "must be at least 1, got %d", c.Slots)
	}
	for _, tok := range []struct{ field, v string }{{"Token", c.Token}, {"EngineKey", c.EngineKey}} {
		if err := secret.CheckToken(tok.v); err != nil {
			p.Add(tok.field, "%v", err)
		}
	}
	if err := p.Err(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return nil
}

// Status is the front's state, as /health reports it.
type Status string

const (
	StatusLoading  Status = "loading"  // the engine is starting
	StatusReady    Status = "ready"    // serving, nothing in flight
	StatusBusy     Status = "busy"     // serving, requests in flight (reported only)
	StatusDraining Status = "draining" // shutting down
)

// Front is one engine's front.
type Front struct {
	cfg    Config
	log    *slog.Logger
	target *url.URL
	proxy  *httputil.ReverseProxy
	prober *http.Client // asks the engine's health path

	quit     chan struct{} // closed by RequestShutdown
	quitOnce sync.Once
	// hardCtx ends when the shutdown grace ran out: requests still in
	// flight are cut.
	hardCtx    context.Context
	cancelHard context.CancelFunc
	started    atomic.Bool

	mu            sync.Mutex
	status        Status    // guarded by mu
	inFlight      int       // guarded by mu
	lastRequestAt time.Time // guarded by mu; zero until the first request
	idle          chan struct{}
	idleClosed    bool // guarded by mu; idle is closed: draining and nothing in flight
}

// New checks cfg (after defaults) and returns a front that starts the
// engine when Run is called.
func New(cfg Config) (*Front, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	target, _ := url.Parse(strings.TrimSuffix(cfg.EngineURL, "/"))
	log := cfg.Logger.With("worker_id", cfg.WorkerID)
	f := &Front{
		cfg: cfg, log: log, target: target,
		prober: &http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}},
		quit:   make(chan struct{}), status: StatusLoading, idle: make(chan struct{}),
	}
	f.hardCtx, f.cancelHard = context.WithCancel(context.Background())
	f.proxy = &httputil.ReverseProxy{
		Rewrite: f.rewrite,
		// A connection of its own per request: an engine may close a
		// kept-alive connection just as the next request goes out on it
		// (llama-server does, after streamed answers), and a POST that
		// was sent cannot be sent again. A loopback connect is cheap.
		Transport:     &http.Transport{Proxy: nil, DisableKeepAlives: true},
		FlushInterval: -1, // every write reaches the client at once: streams stay token by token
		ErrorHandler:  f.proxyError,
		ErrorLog:      slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	return f, nil
}

// RequestShutdown starts a graceful shutdown, as the end of Run's
// context does; it returns at once and may be called more than once.
func (f *Front) RequestShutdown() { f.quitOnce.Do(func() { close(f.quit) }) }

// Run runs the engine behind the front until ctx ends, a shutdown is
// requested, or the engine exits. In order:
//
//  1. start the engine (ErrEngineStart) and serve (status loading: relayed
//     requests answer 503 model_loading);
//  2. ask the engine's health path (see ReadyPoll) until it answers 200
//     (status ready);
//  3. with a CallbackURL, send the ready callback; a refusal stops the
//     engine and returns the error;
//  4. serve until ctx ends or RequestShutdown (then drain, see drain, and
//     return nil) or the engine exits (then return *EngineExitError at
//     once).
//
// An engine that exits before it is ready ends Run with *EngineExitError
// too; a shutdown while it starts stops it and returns nil.
func (f *Front) Run(ctx context.Context) error {
	if !f.started.CompareAndSwap(false, true) {
		return errors.New("Run called twice")
	}
	ln, err := f.cfg.TLS.Listen(f.cfg.Listener)
	if err != nil {
		f.cfg.Listener.Close()
		return err
	}
	eng, err := startEngine(f.cfg.Engine)
	if err != nil {
		ln.Close()
		return err
	}
	f.log.Info("engine started", "pid", eng.pid, "engine", f.cfg.Engine.Path, "health_url", f.healthURL(),
		"listen", f.cfg.Listener.Addr().String())
	srv := transport.Serve(ln, f.Handler(), f.log)
	defer srv.Stop(f.log, time.Second) // by then nothing is in flight, or what is must be cut

	defer context.AfterFunc(ctx, f.RequestShutdown)()

	start := time.Now()
	if err := f.waitHealthy(eng); err != nil {
		return f.endStarting(eng, err)
	}
	f.setStatus(StatusReady)
	f.log.Info("engine healthy", "after_ms", time.Since(start).Milliseconds())
	if f.cfg.CallbackURL != "" {
		if err := f.reportReady(eng); err != nil {
			eng.stop(f.cfg.StopWait)
			return err
		}
	}
	select {
	case <-eng.exited:
		f.log.Error("the engine exited", "exit", eng.exit.String())
		return &EngineExitError{Exit: eng.exit}
	case <-f.quit:
	case <-srv.Done():
		f.log.Error("http server stopped", "err", srv.Err())
	}
	f.drain(eng)
	return nil
}

// errQuit ends waitHealthy when a shutdown is requested.
var errQuit = errors.New("shutdown requested while the engine started")

// endStarting ends a Run whose engine never became healthy.
func (f *Front) endStarting(eng *engineProc, err error) error {
	if errors.Is(err, errQuit) {
		how := eng.stop(f.cfg.StopWait)
		f.log.Info("stopped before the engine was ready", "stop", how)
		return nil
	}
	f.log.Error("the engine exited before it was healthy", "exit", eng.exit.String())
	return &EngineExitError{Exit: eng.exit}
}

// waitHealthy asks the engine's health path until it answers 200. It
// returns errQuit on a shutdown, and an error once the engine exited.
func (f *Front) waitHealthy(eng *engineProc) error {
	start := time.Now()
	t := time.NewTimer(FastPoll)
	defer t.Stop()
	var last string
	for {
		err := f.probe(context.Background(), time.Second)
		if err == nil {
			return nil
		}
		if msg := err.Error(); msg != last && !isRefused(err) {
			f.log.Info("engine not healthy yet", "err", msg)
			last = msg
		}
		select {
		case <-eng.exited:
			return errors.New("exited")
		case <-f.quit:
			return errQuit
		case <-t.C:
		}
		if time.Since(start) < FastPollFor {
			t.Reset(FastPoll)
		} else {
			t.Reset(ReadyPoll)
		}
	}
}

// isRefused is a connection refused: the engine has not bound its port
// yet, which is not worth a line of the log every ReadyPoll.
func isRefused(err error) bool { return strings.Contains(err.Error(), "connection refused") }

// probe asks the engine's health path once: nil on a 200.
func (f *Front) probe(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return rpc.Do(ctx, f.prober, rpc.Call{Method: http.MethodGet, URL: f.healthURL(), MaxAnswer: 64 << 10})
}

func (f *Front) healthURL() string { return f.target.String() + f.cfg.HealthPath }

// reportReady posts the ready callback, up to three attempts a second
// apart; a 4xx answer is final.
func (f *Front) reportReady(eng *engineProc) error {
	vram := f.cfg.MemoryBytes
	how := "given"
	if vram == 0 {
		how = "resident set"
		if rss, err := procs.ReadRSS(eng.pid); err == nil {
			vram = rss
		}
	}
	cb := api.ReadyCallback{WorkerID: f.cfg.WorkerID, VRAMBytes: vram,
		URI: f.cfg.TLS.Scheme() + "://" + f.cfg.Listener.Addr().String()}
	client := transport.NewClient(nil, f.cfg.CallbackTimeout)
	defer client.CloseIdleConnections()
	var err error
	for attempt := 1; attempt <= 3; attempt++ {
		err = rpc.Do(context.Background(), client, rpc.Call{Method: http.MethodPost, URL: f.cfg.CallbackURL,
			Token: f.cfg.Token, In: cb, MaxAnswer: 64 << 10})
		var se *rpc.StatusError
		if err == nil {
			f.log.Info("ready callback accepted", "uri", cb.URI, "vram_bytes", vram, "vram_from", how)
			return nil
		}
		if errors.As(err, &se) && se.Status >= 400 && se.Status < 500 {
			break
		}
		select {
		case <-eng.exited:
			return &EngineExitError{Exit: eng.exit}
		case <-time.After(time.Second):
		}
	}
	return fmt.Errorf("ready callback to %s: %w", f.cfg.CallbackURL, err)
}

// drain shuts the front down gracefully:
//
//  1. status draining: new requests get 503 draining;
//  2. requests in flight run on, for up to ShutdownGrace;
//  3. those still running are cut (a stream ends without its last event);
//  4. the engine is stopped: SIGTERM, SIGKILL after StopWait.
//
// The HTTP server stops when Run returns.
func (f *Front) drain(eng *engineProc) {
	f.mu.Lock()
	f.status = StatusDraining
	f.checkIdleLocked()
	inFlight := f.inFlight
	f.mu.Unlock()
	f.log.Info("draining", "in_flight", inFlight, "grace_ms", f.cfg.ShutdownGrace.Milliseconds())
	grace := time.NewTimer(f.cfg.ShutdownGrace)
	defer grace.Stop()
	select {
	case <-f.idle:
	case <-eng.exited:
	case <-grace.C:
		f.log.Warn("shutdown grace over; cutting the requests in flight", "in_flight", f.inFlightNow())
		f.cancelHard()
	}
	how := eng.stop(f.cfg.StopWait)
	f.log.Info("engine stopped", "stop", how, "exit", eng.exit.String())
}

func (f *Front) setStatus(s Status) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.status = s
}

func (f *Front) inFlightNow() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.inFlight
}

// checkIdleLocked closes idle once a draining front has nothing in
// flight.
func (f *Front) checkIdleLocked() {
	if f.status == StatusDraining && f.inFlight == 0 && !f.idleClosed {
		f.idleClosed = true
		close(f.idle)
	}
}
