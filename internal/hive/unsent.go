package hive

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/apiary-llm/apiary/internal/api"
)

// Worker events the queen did not take because it could not be reached
// (it stopped with the hive, or restarted meanwhile) are not given up:
// they wait in order in an unsent list, are sent before the next
// heartbeat once the queen answers (after a registration too, so before
// the inventory that would otherwise mark their rows lost), and a hive
// that stops with events still unsent keeps them in its data dir
// (hive/unsent-events.json) and sends them when it next registers. A
// worker that stopped cleanly while its queen was away is then recorded
// STOPPED with the hive's reason, not FAILED as lost.

// maxUnsent bounds the unsent list; beyond it the oldest are dropped.
const maxUnsent = eventQueue

// unsent is the hive's list of events the queen did not take, oldest
// first. One mutex: the event deliverer adds to it, the heartbeat loop
// sends it.
type unsent struct {
	mu     sync.Mutex
	events []api.WorkerEvent // guarded by mu
}

// add appends events (in order), dropping the oldest beyond maxUnsent.
func (u *unsent) add(evs ...api.WorkerEvent) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.events = append(u.events, evs...)
	if n := len(u.events) - maxUnsent; n > 0 {
		u.events = append([]api.WorkerEvent(nil), u.events[n:]...)
	}
}

// pending reports whether events wait.
func (u *unsent) pending() bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.events) > 0
}

// take empties the list and returns what it held.
func (u *unsent) take() []api.WorkerEvent {
	u.mu.Lock()
	defer u.mu.Unlock()
	evs := u.events
	u.events = nil
	return evs
}

// putBack returns evs, not sent, to the head of the list.
func (u *unsent) putBack(evs []api.WorkerEvent) {
	if len(evs) == 0 {
		return
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	u.events = append(append([]api.WorkerEvent(nil), evs...), u.events...)
	if n := len(u.events) - maxUnsent; n > 0 {
		u.events = u.events[n:]
	}
}

func (d *dataDir) unsentPath() string { return filepath.Join(d.root, "hive", "unsent-events.json") }

// loadUnsent reads the events a previous hive left unsent (none when
// there is no file) and removes the file: they are the list's now.
func (d *dataDir) loadUnsent() ([]api.WorkerEvent, error) {
	b, err := os.ReadFile(d.unsentPath())
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the unsent worker events: %w", err)
	}
	var evs []api.WorkerEvent
	if err := json.Unmarshal(b, &evs); err != nil {
		_ = os.Remove(d.unsentPath())
		return nil, fmt.Errorf("the unsent worker events in %s cannot be read (removed): %w", d.unsentPath(), err)
	}
	return evs, os.Remove(d.unsentPath())
}

// saveUnsent writes evs for the next hive (atomically); none removes the
// file.
func (d *dataDir) saveUnsent(evs []api.WorkerEvent) error {
	if len(evs) == 0 {
		if err := os.Remove(d.unsentPath()); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		return nil
	}
	b, err := json.Marshal(evs)
	if err != nil {
		return err
	}
	tmp := d.unsentPath() + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("save the unsent worker events: %w", err)
	}
	if err := os.Rename(tmp, d.unsentPath()); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("save the unsent worker events: %w", err)
	}
	return nil
}

// sendUnsent sends the unsent events in order; it stops at the first the
// queen does not take because it cannot be reached (that one and those
// after wait for the next try). One the queen refuses (4xx) is dropped,
// as any event it refuses.
func (q *queenClient) sendUnsent(ctx context.Context) error {
	evs := q.unsent.take()
	for i, ev := range evs {
		err := q.post(ctx, "/v2/internal/workers/events", ev)
		if err == nil {
			continue
		}
		if unreachable(err) {
			q.unsent.putBack(evs[i:])
			return err
		}
		q.h.metrics.queenEventsDrop.Inc()
		q.log.Warn("queen event dropped: the queen refused it", "worker_id", ev.WorkerID, "to", ev.To, "err", err)
	}
	if len(evs) > 0 {
		q.log.Info("unsent worker events delivered", "events", len(evs))
	}
	return nil
}

// unreachable says whether err means the queen did not take an event for
// now (no answer, or a 5xx: stopping, standing by) rather than refusing it
// (4xx): such an event is sent again later.
func unreachable(err error) bool {
	var qa *queenAnswer
	return !errors.As(err, &qa) || qa.status/100 != 4
}
