package lifecycle

import (
	"slices"
	"time"
	"unicode/utf8"
)

// Transition is one entry of a worker's history.
type Transition struct {
	From   State
	To     State
	Reason string
	At     time.Time
	// InFrom is the time the worker spent in From before this change.
	InFrom time.Duration
}

// Bounds of a machine's history: a worker that alternates between ready
// and busy for weeks must not grow it (it is shown in every snapshot).
const (
	// HistoryLimit is the most transitions kept; older ones are dropped
	// and only counted (Total).
	HistoryLimit = 32
	// MaxReasonLen bounds one transition's reason, in bytes.
	MaxReasonLen = 1024
)

// Machine is one worker's state with its recent history. It is not safe
// for concurrent use: it belongs to the single owner of the worker, which
// is the only code that may change it.
type Machine struct {
	state   State
	entered time.Time
	history []Transition // the last HistoryLimit transitions at most
	total   int          // every transition made
}

// NewMachine returns a machine in state starting, entered at now.
func NewMachine(now time.Time) *Machine {
	return &Machine{state: Starting, entered: now}
}

// State is the current state.
func (m *Machine) State() State { return m.state }

// Entered is when the current state began.
func (m *Machine) Entered() time.Time { return m.entered }

// Transition moves the machine to `to` for `reason` at time now, if the table
// allows it, and returns the history entry. A change the table refuses
// returns a *TransitionError and leaves the machine as it was.
func (m *Machine) Transition(to State, reason string, now time.Time) (Transition, error) {
	if !CanTransition(m.state, to) {
		return Transition{}, &TransitionError{From: m.state, To: to}
	}
	t := Transition{From: m.state, To: to, Reason: reason, At: now, InFrom: now.Sub(m.entered)}
	if t.InFrom < 0 {
		t.InFrom = 0
	}
	if len(t.Reason) > MaxReasonLen {
		cut := MaxReasonLen
		for cut > 0 && !utf8.RuneStart(t.Reason[cut]) {
			cut--
		}
		t.Reason = t.Reason[:cut] + "…"
	}
	if len(m.history) == HistoryLimit {
		// Shift in place: the slice never grows past the limit.
		copy(m.history, m.history[1:])
		m.history = m.history[:HistoryLimit-1]
	}
	m.history = append(m.history, t)
	m.total++
	m.state, m.entered = to, now
	return t, nil
}

// History is a copy of the last transitions (HistoryLimit at most), oldest
// first.
func (m *Machine) History() []Transition { return slices.Clone(m.history) }

// Total counts every transition made, those dropped from History included.
func (m *Machine) Total() int { return m.total }
