// Package lifecycle is the vocabulary of a worker's life that the hive and
// the queen share: the states a worker passes through, the table of allowed
// transitions between them, and a Machine that enforces that table and keeps
// the history of every change with the time spent in the state it left.
//
// The package decides nothing and starts nothing; it only says which change
// is legal and remembers what happened. Whoever owns a worker (one goroutine
// in the hive) drives its Machine.
package lifecycle

import (
	"errors"
	"fmt"
	"slices"
)

// State is a worker's live state as the hive and the worker report it.
type State string

// The worker states of the contract's lifecycle vocabulary.
const (
	Starting State = "starting" // process spawned, waiting for its ready callback
	Ready    State = "ready"    // loaded and serving, no request in flight
	Busy     State = "busy"     // serving at least one request
	Degraded State = "degraded" // missed a health check; still alive
	Draining State = "draining" // asked to stop; finishing or cancelling its work
	Stopped  State = "stopped"  // exited after being asked to (terminal)
	Failed   State = "failed"   // crashed, timed out or was killed for misbehaving (terminal)
)

// States lists every state in lifecycle order.
var States = []State{Starting, Ready, Busy, Degraded, Draining, Stopped, Failed}

// transitions is the contract's table: starting → ready ⇄ busy,
// ready|busy → degraded → ready, ready|busy|degraded → draining → stopped,
// any non-terminal → failed.
var transitions = map[State][]State{
	Starting: {Ready, Failed},
	Ready:    {Busy, Degraded, Draining, Failed},
	Busy:     {Ready, Degraded, Draining, Failed},
	Degraded: {Ready, Draining, Failed},
	Draining: {Stopped, Failed},
	Stopped:  nil,
	Failed:   nil,
}

// ErrInvalidTransition is wrapped by every *TransitionError.
var ErrInvalidTransition = errors.New("invalid transition")

// ErrUnknownState is returned by ParseState for a name outside the vocabulary.
var ErrUnknownState = errors.New("unknown state")

// TransitionError names a change the table does not allow.
type TransitionError struct {
	From, To State
}

func (e *TransitionError) Error() string {
	return fmt.Sprintf("invalid transition %s → %s", e.From, e.To)
}

// Unwrap lets errors.Is(err, ErrInvalidTransition) match.
func (e *TransitionError) Unwrap() error { return ErrInvalidTransition }

// CanTransition reports whether the table allows from → to.
func CanTransition(from, to State) bool {
	for _, s := range transitions[from] {
		if s == to {
			return true
		}
	}
	return false
}

// Terminal reports whether no transition leaves s (stopped, failed).
func (s State) Terminal() bool { return s == Stopped || s == Failed }

// Serving reports whether a worker in s answers inference requests
// (ready, busy, degraded).
func (s State) Serving() bool { return s == Ready || s == Busy || s == Degraded }

// Valid reports whether s is one of the vocabulary's states.
func (s State) Valid() bool {
	_, ok := transitions[s]
	return ok
}

func (s State) String() string { return string(s) }

// ParseState turns a name from the wire into a State.
func ParseState(name string) (State, error) {
	s := State(name)
	if !s.Valid() {
		return "", fmt.Errorf("%w: %q", ErrUnknownState, name)
	}
	return s, nil
}

// Status is a lifecycle row's persisted status at the queen.
type Status string

// The queen's row statuses.
const (
	StatusStarting Status = "STARTING"
	StatusRunning  Status = "RUNNING"
	StatusDraining Status = "DRAINING"
	StatusStopped  Status = "STOPPED"
	StatusFailed   Status = "FAILED"
)

// statusTransitions is the table of row statuses, the queen's view of a
// worker: STARTING → RUNNING, RUNNING → DRAINING → STOPPED, a start may be
// stopped before it is ready, and any live row may fail. STOPPED and
// FAILED are terminal.
var statusTransitions = map[Status][]Status{
	StatusStarting: {StatusRunning, StatusDraining, StatusFailed},
	StatusRunning:  {StatusDraining, StatusFailed},
	StatusDraining: {StatusStopped, StatusFailed},
	StatusStopped:  nil,
	StatusFailed:   nil,
}

// CanTransition reports whether a row may go from s to to.
func (s Status) CanTransition(to Status) bool { return slices.Contains(statusTransitions[s], to) }

// Valid reports whether s is one of the row statuses.
func (s Status) Valid() bool {
	_, ok := statusTransitions[s]
	return ok
}

// Terminal reports whether a row in s has ended (STOPPED or FAILED).
func (s Status) Terminal() bool { return s == StatusStopped || s == StatusFailed }

// Status maps a live state onto the queen's row status: ready, busy and
// degraded are all RUNNING.
func (s State) Status() Status {
	switch s {
	case Starting:
		return StatusStarting
	case Ready, Busy, Degraded:
		return StatusRunning
	case Draining:
		return StatusDraining
	case Stopped:
		return StatusStopped
	default:
		return StatusFailed
	}
}
