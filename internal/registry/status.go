package registry

import (
	"errors"
	"fmt"
)

// Status is a pool's status at the queen.
type Status string

// The pool statuses of the contract.
const (
	Healthy   Status = "healthy"   // beating within the timeout; placements may use it
	Unhealthy Status = "unhealthy" // missed heartbeats for the timeout; nothing is routed to it
	Draining  Status = "draining"  // an operator drained it: serves what it has, gets nothing new
	Offline   Status = "offline"   // deregistered; removed after the offline retention
)

// Statuses lists every status.
var Statuses = []Status{Healthy, Unhealthy, Draining, Offline}

// transitions is the contract's table widened to what a lease needs: a drained
// pool that misses heartbeats is unhealthy and comes back draining, a
// deregistered pool comes back when its hive registers again, and an
// operator may undrain a draining pool (healthy again).
var transitions = map[Status][]Status{
	Healthy:   {Unhealthy, Draining, Offline},
	Unhealthy: {Healthy, Draining, Offline},
	Draining:  {Healthy, Unhealthy, Offline},
	Offline:   {Healthy},
}

// ErrInvalidTransition is wrapped by every refused status change.
var ErrInvalidTransition = errors.New("invalid pool status transition")

// CanTransition reports whether the table allows from → to.
func CanTransition(from, to Status) bool {
	for _, s := range transitions[from] {
		if s == to {
			return true
		}
	}
	return false
}

func checkTransition(from, to Status) error {
	if from == to || CanTransition(from, to) {
		return nil
	}
	return fmt.Errorf("%w: %s → %s", ErrInvalidTransition, from, to)
}

// ParseStatus turns a name from a query string into a Status.
func ParseStatus(s string) (Status, error) {
	st := Status(s)
	if _, ok := transitions[st]; !ok {
		return "", fmt.Errorf("unknown pool status %q (want healthy, unhealthy, draining or offline)", s)
	}
	return st, nil
}

// live is the status a pool that beats has: draining when an operator
// drained it, healthy otherwise.
func live(drained bool) Status {
	if drained {
		return Draining
	}
	return Healthy
}
