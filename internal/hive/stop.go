package hive

import (
	"fmt"
	"syscall"
	"time"

	"github.com/apiary-llm/apiary/internal/procs"
)

// A worker's stop is a pure step function: stepStop takes where the stop
// stands, one event and the time, and returns where it stands next and
// the effects the owner loop performs. After the drain it is procs'
// escalation (ask, SIGTERM, SIGKILL), driven by the loop's timer instead of
// a blocking procs.Stop because the loop goes on serving other events.

// stopPhase is where a worker's stop stands.
type stopPhase int

const (
	notStopping stopPhase = iota
	drainWait             // drain: waiting for in-flight work
	asked                 // shutdown posted (or refused); waiting for exit
	termSent              // SIGTERM sent to the group
	killSent              // SIGKILL sent to the group
	exited                // the process is gone
)

func (p stopPhase) String() string {
	return [...]string{"not stopping", "drain wait", "asked", "SIGTERM sent", "SIGKILL sent", "exited"}[p]
}

// stopState is a worker's stop.
type stopState struct {
	phase    stopPhase
	grace    time.Duration
	deadline time.Time // start + grace: the drain and the ask share it
	ends     time.Time // when the current phase's wait runs out
	forced   bool      // a signal was needed
}

type stopEventKind int

const (
	evStop  stopEventKind = iota // a stop request; the first one moved the worker to draining
	evProbe                      // a /health probe answered during the stop
	evAck                        // the worker answered the shutdown request
	evTimer                      // the stop timer fired
	evExit                       // the process exited
)

// stopEvent is one event a stop reacts to.
type stopEvent struct {
	kind     stopEventKind
	drain    bool          // evStop: let in-flight work finish first
	cascade  bool          // evStop: the hive is going away
	grace    time.Duration // evStop: zero is the hive's --stop-grace
	inFlight int           // evStop: the worker's last known count; evProbe: what the probe saw
	err      error         // evProbe: the probe failed; evAck: the shutdown was not acknowledged
}

// stopTimes are the hive's settings a stop follows.
type stopTimes struct {
	grace time.Duration // --stop-grace, when a request gives none
	ack   time.Duration // --shutdown-ack: SIGTERM to SIGKILL; the ask once a drain used the grace up
	poll  time.Duration // how often a drain asks the worker what is in flight
}

// stopEffects is what the owner loop does after a step, in this order.
type stopEffects struct {
	warn    string         // log at warn level, with the grace
	warnErr error          // logged with warn: why
	post    bool           // POST /v1/admin/shutdown to the worker; the answer is an evAck
	signal  syscall.Signal // SIGTERM or SIGKILL to the group; 0: none
	probe   bool           // probe /health now (the drain); the answer is an evProbe
	arm     bool           // (re)arm the stop timer
	wait    time.Duration  // with arm: when it fires
	outcome string         // evExit of a stop: "graceful" or "forced"
}

// stepStop is one step of a worker's stop. A first stop request drains
// (waits, polling, until nothing is in flight) or asks at once; the ask
// waits until the grace runs out, then SIGTERM, then SIGKILL after
// --shutdown-ack. A refused ask is followed by SIGTERM at once. A drain
// that used the whole grace still gives the ask --shutdown-ack. A second
// request only matters when it is the hive's cascade during a drain: the
// drain ends. An exit ends the stop at any phase.
func stepStop(s stopState, ev stopEvent, now time.Time, t stopTimes) (stopState, stopEffects) {
	esc := procs.Escalation{TermWait: t.ack}
	var eff stopEffects
	switch ev.kind {
	case evExit:
		if s.phase != notStopping {
			eff.outcome = "graceful"
			if s.forced {
				eff.outcome = "forced"
			}
		}
		s.phase = exited
		return s, eff

	case evStop:
		switch s.phase {
		case notStopping:
			grace := ev.grace
			if grace <= 0 {
				grace = t.grace
			}
			s = stopState{grace: grace, deadline: now.Add(grace)}
			if ev.drain && ev.inFlight > 0 {
				s.phase, s.ends = drainWait, now.Add(t.poll)
				return s, stopEffects{arm: true, wait: t.poll}
			}
			return enterStop(s, procs.Step{Phase: procs.PhaseAsk, Wait: grace}, now, eff)
		case drainWait:
			if ev.cascade {
				return enterStop(s, procs.Step{Phase: procs.PhaseAsk, Wait: max(s.deadline.Sub(now), 0)}, now, eff)
			}
		}

	case evProbe:
		if s.phase == drainWait && (ev.err != nil || ev.inFlight == 0) {
			return enterStop(s, procs.Step{Phase: procs.PhaseAsk, Wait: max(s.deadline.Sub(now), 0)}, now, eff)
		}

	case evAck:
		if s.phase == asked && ev.err != nil {
			eff.warn, eff.warnErr = "worker did not acknowledge shutdown; sending SIGTERM", ev.err
			return enterStop(s, esc.After(procs.PhaseAsk, max(s.ends.Sub(now), 0)), now, eff)
		}

	case evTimer:
		switch s.phase {
		case drainWait:
			if now.Before(s.deadline) {
				s.ends = now.Add(t.poll)
				return s, stopEffects{probe: true, arm: true, wait: t.poll}
			}
			return enterStop(s, procs.Step{Phase: procs.PhaseAsk, Wait: t.ack}, now, eff)
		case asked:
			eff.warn = "worker still running after the stop grace; sending SIGTERM"
			return enterStop(s, esc.After(procs.PhaseAsk, 0), now, eff)
		case termSent:
			eff.warn = "worker ignored SIGTERM; sending SIGKILL"
			return enterStop(s, esc.After(procs.PhaseTerm, 0), now, eff)
		}
	}
	return s, eff
}

// enterStop enters an escalation step: posts the shutdown or sends the
// signal, and arms the timer for the step's wait.
func enterStop(s stopState, step procs.Step, now time.Time, eff stopEffects) (stopState, stopEffects) {
	switch step.Phase {
	case procs.PhaseAsk:
		s.phase, eff.post = asked, true
	case procs.PhaseTerm:
		s.phase, s.forced, eff.signal = termSent, true, syscall.SIGTERM
	case procs.PhaseKill:
		s.phase, s.forced, eff.signal = killSent, true, syscall.SIGKILL
		s.ends = time.Time{}
		return s, eff
	default:
		panic(fmt.Sprintf("hive: no stop phase for %v", step.Phase))
	}
	s.ends = now.Add(step.Wait)
	eff.arm, eff.wait = true, step.Wait
	return s, eff
}
