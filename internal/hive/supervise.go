package hive

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/kube"
	"github.com/apiary-llm/apiary/internal/lifecycle"
)

// supervisor is the state of a worker's owner loop besides the worker's
// own: its timers, the probe and shutdown request in flight, and the stop.
// Only run's goroutine touches it.
type supervisor struct {
	w     *worker
	cfg   *Config
	times stopTimes

	callback *time.Timer
	health   *time.Ticker // nil until ready
	healthC  <-chan time.Time
	idle     timer
	stopT    timer
	stop     stopState
	probing  bool

	probes chan probeResult // one probe at a time
	acks   chan error       // the one shutdown request of a stop

	ctx    context.Context // ends the probes and requests in flight when run returns
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// timer is a time.Timer whose channel is nil until it is armed and once
// it is disarmed, so that a select on it waits.
type timer struct {
	t *time.Timer
	c <-chan time.Time
}

func (t *timer) arm(d time.Duration) {
	if t.t == nil {
		t.t = time.NewTimer(d)
	} else {
		t.t.Reset(d)
	}
	t.c = t.t.C
}

func (t *timer) disarm() {
	if t.t != nil {
		t.t.Stop()
	}
	t.c = nil
}

// run is the owner loop: it dispatches each event to a method, and the
// stop's events to stepStop. It returns once the process is reaped, its
// group killed, its memory released and its entry moved out of the
// registry.
func (w *worker) run() {
	defer close(w.done)
	s := newSupervisor(w)
	defer s.close()
	if w.m.State().Serving() {
		s.serving() // adopted (hive/kube.go)
	}
	for {
		select {
		case <-w.proc.Exited():
			s.onExit()
			return
		case <-w.h.leave:
			// A hive that leaves its worker Pods (hive/kube.go) stops
			// supervising them, and says nothing of them to anyone.
			return
		case c := <-w.cmds:
			s.onCmd(c)
		case <-s.callback.C:
			s.onCallbackTimeout()
		case <-s.healthC:
			s.onHealthTick()
		case <-s.idle.c:
			s.onIdle()
		case r := <-s.probes:
			s.onProbe(r)
		case err := <-s.acks:
			s.step(stopEvent{kind: evAck, err: err})
		case <-s.stopT.c:
			s.step(stopEvent{kind: evTimer})
		}
	}
}

func newSupervisor(w *worker) *supervisor {
	cfg := &w.h.cfg
	s := &supervisor{
		w:   w,
		cfg: cfg,
		times: stopTimes{grace: cfg.StopGrace, ack: cfg.ShutdownAck,
			poll: min(cfg.HealthInterval, 200*time.Millisecond)},
		callback: time.NewTimer(cfg.CallbackTimeout),
		probes:   make(chan probeResult, 1),
		acks:     make(chan error, 1),
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	return s
}

// close ends what is in flight and stops the timers.
func (s *supervisor) close() {
	s.cancel()
	s.wg.Wait()
	s.callback.Stop()
	s.stopHealth()
	s.idle.disarm()
	s.stopT.disarm()
}

func (s *supervisor) onExit() {
	_, eff := stepStop(s.stop, stopEvent{kind: evExit}, time.Now(), s.times)
	s.w.exited(eff.outcome)
}

func (s *supervisor) onCmd(c any) {
	w := s.w
	switch c := c.(type) {
	case readyCmd:
		err := w.ready(c)
		c.reply <- err
		if err == nil {
			s.serving()
		}
	case stopCmd:
		switch st := w.m.State(); {
		case st == lifecycle.Starting:
			s.fail("stopped before it was ready: " + c.reason)
		case st == lifecycle.Draining:
			s.step(stopEvent{kind: evStop, drain: c.drain, cascade: c.cascade, grace: c.grace})
		case st.Terminal():
		default:
			s.beginStop(c)
		}
		c.reply <- nil
	}
}

// serving starts the health probes and the idle timer of a worker that
// has just become ready.
func (s *supervisor) serving() {
	s.callback.Stop()
	s.stopHealth()
	s.health = time.NewTicker(s.cfg.HealthInterval)
	s.healthC = s.health.C
	s.armIdle()
}

func (s *supervisor) onCallbackTimeout() {
	if s.w.m.State() != lifecycle.Starting {
		return
	}
	s.w.h.metrics.callbackTimeouts.Inc()
	if s.w.engine != nil {
		// Its front calls back once the engine's health path answers 200.
		reason := fmt.Sprintf("%s did not answer 200 within %s", s.w.healthURL, s.cfg.CallbackTimeout)
		if tail := strings.TrimSpace(s.w.out.Tail(5)); tail != "" {
			reason += "; last output: " + api.Printable(tail, 1000)
		}
		s.fail(reason)
		return
	}
	reason := fmt.Sprintf("no ready callback within %s", s.cfg.CallbackTimeout)
	if p, ok := s.w.proc.(*kube.Pod); ok {
		reason += " from " + p.Where()
	}
	s.fail(reason)
}

func (s *supervisor) onHealthTick() {
	if s.w.m.State().Serving() {
		s.probe(false, s.cfg.HealthInterval)
	}
}

func (s *supervisor) onIdle() {
	if s.w.m.State() == lifecycle.Ready {
		// Ask the worker first: a request may have come since the last
		// probe.
		s.probe(true, s.cfg.HealthInterval)
	}
}

// onProbe takes a probe's answer: to the stop while stopping, else to the
// health rules (decideHealth) and the idle rule (idleFor).
func (s *supervisor) onProbe(r probeResult) {
	w, cfg := s.w, s.cfg
	s.probing = false
	if s.stop.phase != notStopping {
		s.step(stopEvent{kind: evProbe, err: r.err, inFlight: r.health.InFlight})
		return
	}
	if !w.m.State().Serving() {
		return
	}
	w.observe(r)
	d := decideHealth(w.m.State(), w.misses, cfg.HealthFailures, r)
	w.misses = d.misses
	if d.to == lifecycle.Failed {
		w.h.metrics.healthKills.Inc()
		s.fail(d.reason)
		return
	}
	if d.to != "" {
		w.transition(d.to, d.reason)
	} else {
		w.publish()
	}
	if r.err != nil {
		return
	}
	if idle, _ := idleFor(w.m.State(), w.inFlight, lastActivity(w.readyAt, w.lastReq), r.at, w.idleTimeout); idle && r.idle {
		s.beginStop(stopCmd{reason: fmt.Sprintf("idle for %s", w.idleTimeout)})
		w.h.metrics.idleStops.Inc()
		return
	}
	s.armIdle()
}

// beginStop moves a serving worker to draining and starts its stop.
func (s *supervisor) beginStop(c stopCmd) {
	if !s.w.transition(lifecycle.Draining, c.reason) {
		return
	}
	s.stopHealth()
	s.idle.disarm()
	s.step(stopEvent{kind: evStop, drain: c.drain, cascade: c.cascade, grace: c.grace, inFlight: s.w.inFlight})
}

// step applies one event to the stop and performs the effects.
func (s *supervisor) step(ev stopEvent) {
	next, eff := stepStop(s.stop, ev, time.Now(), s.times)
	s.stop = next
	if eff.warn != "" {
		args := []any{"grace", next.grace.String()}
		if eff.warnErr != nil {
			args = append(args, "err", eff.warnErr)
		}
		s.w.log.Warn(eff.warn, args...)
	}
	if eff.post {
		s.postShutdown()
	}
	switch eff.signal {
	case syscall.SIGTERM:
		_ = s.w.proc.Signal(syscall.SIGTERM)
	case syscall.SIGKILL:
		s.w.proc.Kill()
	}
	if eff.probe {
		s.probe(false, s.cfg.HealthInterval)
	}
	if eff.arm {
		s.stopT.arm(eff.wait)
	}
}

func (s *supervisor) fail(reason string) {
	if s.w.transition(lifecycle.Failed, reason) {
		s.w.proc.Kill()
	}
}

// probe asks the worker's /health unless a probe is in flight; the answer
// arrives on probes.
func (s *supervisor) probe(idle bool, timeout time.Duration) {
	if s.probing {
		return
	}
	s.probing = true
	s.wg.Go(func() {
		ctx, cancel := context.WithTimeout(s.ctx, timeout)
		defer cancel()
		h, err := s.w.h.client.Health(ctx, s.w.uri)
		s.probes <- probeResult{err: err, health: h, at: time.Now(), idle: idle}
	})
}

// postShutdown asks the worker to shut down; the answer arrives on acks.
func (s *supervisor) postShutdown() {
	s.wg.Go(func() {
		ctx, cancel := context.WithTimeout(s.ctx, s.cfg.ShutdownAck)
		defer cancel()
		s.acks <- s.w.h.client.Shutdown(ctx, s.w.uri, s.w.token)
	})
}

// armIdle arms the idle timer for when a ready worker could be idle.
func (s *supervisor) armIdle() {
	w := s.w
	idle, wait := idleFor(w.m.State(), w.inFlight, lastActivity(w.readyAt, w.lastReq), time.Now(), w.idleTimeout)
	if wait < 0 {
		return
	}
	if idle {
		wait = 0
	}
	s.idle.arm(wait)
}

func (s *supervisor) stopHealth() {
	if s.health != nil {
		s.health.Stop()
	}
	s.healthC = nil
}
