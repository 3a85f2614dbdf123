package hive

import (
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

func TestStepStop(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	times := stopTimes{grace: 30 * time.Second, ack: 5 * time.Second, poll: 200 * time.Millisecond}
	refused := errors.New("refused")

	// States a stop begun at t0 with a 30s grace passes through.
	draining := stopState{phase: drainWait, grace: 30 * time.Second, deadline: at(30 * time.Second), ends: at(200 * time.Millisecond)}
	asking := stopState{phase: asked, grace: 30 * time.Second, deadline: at(30 * time.Second), ends: at(30 * time.Second)}
	termed := stopState{phase: termSent, grace: 30 * time.Second, deadline: at(30 * time.Second), ends: at(35 * time.Second), forced: true}
	killed := stopState{phase: killSent, grace: 30 * time.Second, deadline: at(30 * time.Second), forced: true}
	with := func(s stopState, fn func(*stopState)) stopState { fn(&s); return s }
	stopReq := stopEvent{kind: evStop}
	timerEv := stopEvent{kind: evTimer}
	exitEv := stopEvent{kind: evExit}

	tests := []struct {
		name     string
		s        stopState
		ev       stopEvent
		now      time.Time
		want     stopState
		wantEff  stopEffects
		wantNote string // the warning, when there is one
	}{
		// The first request.
		{"stop asks at once and waits the grace", stopState{}, stopReq, t0,
			asking, stopEffects{post: true, arm: true, wait: 30 * time.Second}, ""},
		{"the request's grace wins", stopState{}, stopEvent{kind: evStop, grace: 2 * time.Second}, t0,
			stopState{phase: asked, grace: 2 * time.Second, deadline: at(2 * time.Second), ends: at(2 * time.Second)},
			stopEffects{post: true, arm: true, wait: 2 * time.Second}, ""},
		{"drain with nothing in flight asks at once", stopState{}, stopEvent{kind: evStop, drain: true}, t0,
			asking, stopEffects{post: true, arm: true, wait: 30 * time.Second}, ""},
		{"drain waits for in-flight work", stopState{}, stopEvent{kind: evStop, drain: true, inFlight: 2}, t0,
			draining, stopEffects{arm: true, wait: 200 * time.Millisecond}, ""},

		// The drain.
		{"drain polls while the grace lasts", draining, timerEv, at(time.Second),
			with(draining, func(s *stopState) { s.ends = at(1200 * time.Millisecond) }),
			stopEffects{probe: true, arm: true, wait: 200 * time.Millisecond}, ""},
		{"drain goes on while work is in flight", draining, stopEvent{kind: evProbe, inFlight: 1}, at(time.Second),
			draining, stopEffects{}, ""},
		{"drain ends when nothing is in flight: the ask gets the rest of the grace", draining, stopEvent{kind: evProbe}, at(10 * time.Second),
			asking, stopEffects{post: true, arm: true, wait: 20 * time.Second}, ""},
		{"drain ends when the probe fails", draining, stopEvent{kind: evProbe, err: refused}, at(10 * time.Second),
			asking, stopEffects{post: true, arm: true, wait: 20 * time.Second}, ""},
		{"drain that used the grace up gives the ask --shutdown-ack", draining, timerEv, at(30 * time.Second),
			with(asking, func(s *stopState) { s.ends = at(35 * time.Second) }),
			stopEffects{post: true, arm: true, wait: 5 * time.Second}, ""},
		{"the hive's cascade ends the drain", draining, stopEvent{kind: evStop, cascade: true}, at(5 * time.Second),
			asking, stopEffects{post: true, arm: true, wait: 25 * time.Second}, ""},
		{"a second request does not end the drain", draining, stopEvent{kind: evStop, drain: false}, at(5 * time.Second),
			draining, stopEffects{}, ""},

		// The ask.
		{"a second request while asked changes nothing", asking, stopEvent{kind: evStop, cascade: true}, at(time.Second),
			asking, stopEffects{}, ""},
		{"an acknowledged ask waits for the exit", asking, stopEvent{kind: evAck}, at(time.Second),
			asking, stopEffects{}, ""},
		{"a probe answer while asked changes nothing", asking, stopEvent{kind: evProbe}, at(time.Second),
			asking, stopEffects{}, ""},
		{"a refused ask: SIGTERM at once, SIGKILL when the grace runs out", asking, stopEvent{kind: evAck, err: refused}, at(time.Second),
			with(termed, func(s *stopState) { s.ends = at(30 * time.Second) }),
			stopEffects{warnErr: refused, signal: syscall.SIGTERM, arm: true, wait: 29 * time.Second},
			"worker did not acknowledge shutdown; sending SIGTERM"},
		{"a refused ask late in the grace: SIGKILL after --shutdown-ack", asking, stopEvent{kind: evAck, err: refused}, at(28 * time.Second),
			with(termed, func(s *stopState) { s.ends = at(33 * time.Second) }),
			stopEffects{warnErr: refused, signal: syscall.SIGTERM, arm: true, wait: 5 * time.Second},
			"worker did not acknowledge shutdown; sending SIGTERM"},
		{"SIGTERM after the grace", asking, timerEv, at(30 * time.Second),
			termed, stopEffects{signal: syscall.SIGTERM, arm: true, wait: 5 * time.Second},
			"worker still running after the stop grace; sending SIGTERM"},

		// The signals.
		{"SIGKILL after --shutdown-ack", termed, timerEv, at(35 * time.Second),
			killed, stopEffects{signal: syscall.SIGKILL}, "worker ignored SIGTERM; sending SIGKILL"},
		{"an ask refused after SIGTERM changes nothing", termed, stopEvent{kind: evAck, err: refused}, at(31 * time.Second),
			termed, stopEffects{}, ""},
		{"a second request after SIGTERM changes nothing", termed, stopEvent{kind: evStop, cascade: true}, at(31 * time.Second),
			termed, stopEffects{}, ""},
		{"nothing comes after SIGKILL", killed, timerEv, at(time.Minute),
			killed, stopEffects{}, ""},
		{"a stray timer of no stop does nothing", stopState{}, timerEv, t0,
			stopState{}, stopEffects{}, ""},

		// The exit, at any phase.
		{"exit without a stop is no stop's", stopState{}, exitEv, t0,
			stopState{phase: exited}, stopEffects{}, ""},
		{"exit during the drain is graceful", draining, exitEv, at(time.Second),
			with(draining, func(s *stopState) { s.phase = exited }), stopEffects{outcome: "graceful"}, ""},
		{"exit after the ask is graceful", asking, exitEv, at(time.Second),
			with(asking, func(s *stopState) { s.phase = exited }), stopEffects{outcome: "graceful"}, ""},
		{"exit after SIGTERM is forced", termed, exitEv, at(31 * time.Second),
			with(termed, func(s *stopState) { s.phase = exited }), stopEffects{outcome: "forced"}, ""},
		{"exit after SIGKILL is forced", killed, exitEv, at(36 * time.Second),
			with(killed, func(s *stopState) { s.phase = exited }), stopEffects{outcome: "forced"}, ""},
	}

	// Every move stepStop can make; the table must exercise each.
	type move struct{ from, to stopPhase }
	moves := map[move]bool{
		{notStopping, notStopping}: false, {notStopping, drainWait}: false, {notStopping, asked}: false, {notStopping, exited}: false,
		{drainWait, drainWait}: false, {drainWait, asked}: false, {drainWait, exited}: false,
		{asked, asked}: false, {asked, termSent}: false, {asked, exited}: false,
		{termSent, termSent}: false, {termSent, killSent}: false, {termSent, exited}: false,
		{killSent, killSent}: false, {killSent, exited}: false,
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, eff := stepStop(tt.s, tt.ev, tt.now, times)
			if diff := cmp.Diff(tt.want, got, cmp.AllowUnexported(stopState{})); diff != "" {
				t.Errorf("state (-want +got)\n%s", diff)
			}
			tt.wantEff.warn = tt.wantNote
			if diff := cmp.Diff(tt.wantEff, eff, cmp.AllowUnexported(stopEffects{}), cmpopts.EquateErrors()); diff != "" {
				t.Errorf("effects (-want +got)\n%s", diff)
			}
			m := move{tt.s.phase, got.phase}
			if _, ok := moves[m]; !ok {
				t.Errorf("move %s → %s is not one a stop makes", m.from, m.to)
			}
			moves[m] = true
		})
	}
	for m, seen := range moves {
		if !seen {
			t.Errorf("no case moves %s → %s", m.from, m.to)
		}
	}
}
