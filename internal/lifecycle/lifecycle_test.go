package lifecycle

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestTransitionTable(t *testing.T) {
	allowed := map[[2]State]bool{
		{Starting, Ready}: true, {Starting, Failed}: true,
		{Ready, Busy}: true, {Busy, Ready}: true,
		{Ready, Degraded}: true, {Busy, Degraded}: true, {Degraded, Ready}: true,
		{Ready, Draining}: true, {Busy, Draining}: true, {Degraded, Draining}: true,
		{Draining, Stopped}: true,
		{Ready, Failed}:     true, {Busy, Failed}: true, {Degraded, Failed}: true, {Draining, Failed}: true,
	}
	for _, from := range States {
		for _, to := range States {
			want := allowed[[2]State{from, to}]
			if got := CanTransition(from, to); got != want {
				t.Errorf("CanTransition(%s, %s) = %v, want %v", from, to, got, want)
			}
		}
	}
}

func TestTerminalStatesHaveNoWayOut(t *testing.T) {
	for _, s := range States {
		if !s.Terminal() {
			if !CanTransition(s, Failed) {
				t.Errorf("non-terminal %s cannot fail", s)
			}
			continue
		}
		for _, to := range States {
			if CanTransition(s, to) {
				t.Errorf("terminal %s → %s allowed", s, to)
			}
		}
	}
}

func TestMachineRecordsHistoryWithDurations(t *testing.T) {
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	m := NewMachine(t0)
	steps := []struct {
		to     State
		reason string
		after  time.Duration
	}{
		{Ready, "ready callback", 2 * time.Second},
		{Busy, "health: busy", 5 * time.Second},
		{Ready, "health: ready", time.Second},
		{Draining, "stop requested", 10 * time.Second},
		{Stopped, "exited 0", 500 * time.Millisecond},
	}
	now := t0
	var want []Transition
	from := Starting
	for _, s := range steps {
		now = now.Add(s.after)
		got, err := m.Transition(s.to, s.reason, now)
		if err != nil {
			t.Fatalf("Transition(%s): %v", s.to, err)
		}
		w := Transition{From: from, To: s.to, Reason: s.reason, At: now, InFrom: s.after}
		if diff := cmp.Diff(w, got); diff != "" {
			t.Errorf("Transition(%s) mismatch (-want +got):\n%s", s.to, diff)
		}
		want = append(want, w)
		from = s.to
	}
	if diff := cmp.Diff(want, m.History()); diff != "" {
		t.Errorf("History mismatch (-want +got):\n%s", diff)
	}
	if m.State() != Stopped || !m.Entered().Equal(now) {
		t.Errorf("state %s entered %v, want stopped at %v", m.State(), m.Entered(), now)
	}
}

func TestMachineRefusesInvalidTransition(t *testing.T) {
	m := NewMachine(time.Unix(0, 0))
	_, err := m.Transition(Busy, "skip ready", time.Unix(1, 0))
	var te *TransitionError
	if !errors.As(err, &te) || !errors.Is(err, ErrInvalidTransition) {
		t.Fatalf("err = %v, want *TransitionError wrapping ErrInvalidTransition", err)
	}
	if te.From != Starting || te.To != Busy {
		t.Errorf("TransitionError = %+v", te)
	}
	if m.State() != Starting || len(m.History()) != 0 {
		t.Errorf("refused transition changed the machine: %s, %d entries", m.State(), len(m.History()))
	}
}

func TestStatusMapping(t *testing.T) {
	want := map[State]Status{
		Starting: StatusStarting, Ready: StatusRunning, Busy: StatusRunning, Degraded: StatusRunning,
		Draining: StatusDraining, Stopped: StatusStopped, Failed: StatusFailed,
	}
	for s, st := range want {
		if got := s.Status(); got != st {
			t.Errorf("%s.Status() = %s, want %s", s, got, st)
		}
	}
}

func TestParseState(t *testing.T) {
	for _, s := range States {
		got, err := ParseState(string(s))
		if err != nil || got != s {
			t.Errorf("ParseState(%q) = %q, %v", s, got, err)
		}
	}
	if _, err := ParseState("idle"); !errors.Is(err, ErrUnknownState) {
		t.Errorf("ParseState(idle) err = %v, want ErrUnknownState", err)
	}
}

// A worker that alternates between ready and busy for weeks keeps a
// bounded history (unbounded, it reached 1 MiB in a day
// and every heartbeat of its hive was refused); the total still counts
// every change, and a long reason is cut.
func TestHistoryIsBounded(t *testing.T) {
	now := time.Unix(0, 0)
	m := NewMachine(now)
	if _, err := m.Transition(Ready, "ready", now); err != nil {
		t.Fatal(err)
	}
	for i := range 100_000 {
		now = now.Add(10 * time.Second)
		to := Busy
		if i%2 == 1 {
			to = Ready
		}
		if _, err := m.Transition(to, strings.Repeat("r", 5000), now); err != nil {
			t.Fatal(err)
		}
	}
	h := m.History()
	if len(h) != HistoryLimit || m.Total() != 100_001 || cap(m.history) > 2*HistoryLimit {
		t.Fatalf("history %d entries (cap %d), total %d", len(h), cap(m.history), m.Total())
	}
	if last := h[len(h)-1]; !last.At.Equal(now) || len(last.Reason) > MaxReasonLen+len("…") {
		t.Errorf("last entry %v with a %d-byte reason", last.At, len(last.Reason))
	}
}

func TestStatusTransitionTable(t *testing.T) {
	all := []Status{StatusStarting, StatusRunning, StatusDraining, StatusStopped, StatusFailed}
	allowed := map[[2]Status]bool{
		{StatusStarting, StatusRunning}: true, {StatusStarting, StatusDraining}: true, {StatusStarting, StatusFailed}: true,
		{StatusRunning, StatusDraining}: true, {StatusRunning, StatusFailed}: true,
		{StatusDraining, StatusStopped}: true, {StatusDraining, StatusFailed}: true,
	}
	for _, from := range all {
		if !from.Valid() {
			t.Errorf("%s is not valid", from)
		}
		if from.Terminal() != (from == StatusStopped || from == StatusFailed) {
			t.Errorf("%s terminal: %v", from, from.Terminal())
		}
		for _, to := range all {
			if got := from.CanTransition(to); got != allowed[[2]Status{from, to}] {
				t.Errorf("%s → %s: %v", from, to, got)
			}
		}
	}
	if Status("RUNNNING").Valid() {
		t.Error("a made-up status is valid")
	}
}
