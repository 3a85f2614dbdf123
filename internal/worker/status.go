package worker

import (
	"fmt"
	"time"
)

// Status is the worker's lifecycle state, as GET /health reports it.
type Status string

// Statuses. The worker moves loading → ready → draining → stopped, or to
// failed when the model cannot be loaded or the ready callback is refused.
// StatusBusy is never stored: /health reports it for a ready worker whose
// every slot is generating (more requests will queue).
const (
	StatusLoading  Status = "loading"
	StatusReady    Status = "ready"
	StatusBusy     Status = "busy"
	StatusDraining Status = "draining"
	StatusStopped  Status = "stopped"
	StatusFailed   Status = "failed"
)

// transitions lists the allowed moves between stored statuses.
var transitions = map[Status][]Status{
	StatusLoading:  {StatusReady, StatusDraining, StatusFailed},
	StatusReady:    {StatusDraining, StatusFailed},
	StatusDraining: {StatusStopped, StatusFailed},
}

func allowed(from, to Status) bool {
	for _, s := range transitions[from] {
		if s == to {
			return true
		}
	}
	return false
}

// transitionLocked moves the worker to status to, checking the table and
// logging the reason and the time spent in the old status. It is the only
// place the status changes. Callers hold w.mu.
func (w *Worker) transitionLocked(to Status, reason string) error {
	from := w.status
	if !allowed(from, to) {
		return fmt.Errorf("%w: %s → %s (%s)", ErrBadTransition, from, to, reason)
	}
	now := time.Now()
	w.log.Info("worker status changed", "from", string(from), "to", string(to), "reason", reason,
		"after_ms", now.Sub(w.statusSince).Milliseconds())
	w.status, w.statusSince = to, now
	if to == StatusDraining {
		w.checkIdleLocked()
	}
	return nil
}
