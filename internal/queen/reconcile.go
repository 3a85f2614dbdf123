package queen

import (
	"fmt"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/lifecycle"
	"github.com/apiary-llm/apiary/internal/store"
)

// lostAfterMisses is how many heartbeats in a row may lack a live row's
// worker before the row is FAILED: one miss is a heartbeat that crossed a
// start or an event in flight, two is a worker that is gone.
const lostAfterMisses = 2

// reconcileInput is everything reconcile decides from: one heartbeat and
// the pool's live rows.
type reconcileInput struct {
	// FullInventory: the first heartbeat since the hive registered (or the
	// queen loaded the pool): rows older than the registration whose
	// workers it lacks are gone at once.
	FullInventory bool
	RegisteredAt  time.Time
	Workers       []api.Worker // what the hive runs
	// Refused are entries of the heartbeat the queen refused: their rows
	// are lost at once, with the refusal as the reason (the queen cannot
	// route to, or account for, a worker it cannot read).
	Refused []api.RefusedWorker
	Rows    []store.Row // the pool's live rows
	Misses  map[string]int
	// Seen, when given, is the buffer the plan's Seen is appended to: a
	// caller's array keeps a beat from allocating.
	Seen []string
}

// rowSync is a row to bring in line with its worker.
type rowSync struct {
	ID     string
	Worker api.Worker
	To     lifecycle.Status
}

// lostRow is a live row whose worker is gone.
type lostRow struct {
	ID, Reason string
}

// unknownWorker is a live worker with no live row.
type unknownWorker struct {
	Worker api.Worker
	Why    string
}

// reconcilePlan is what reconcile decided.
type reconcilePlan struct {
	Seen    []string       // rows whose worker is in the heartbeat
	Sync    []rowSync      // rows to update from their worker (adoption)
	Lost    []lostRow      // rows to fail with reason lost
	Misses  map[string]int // new miss counts of rows still waiting
	Unknown []unknownWorker
}

// reconcile matches a hive's workers with the pool's live rows. It is pure:
// it decides, the caller acts.
//   - A worker that matches a row (by lifecycle id, else by worker id) is
//     adopted: the row takes the worker's status and facts.
//   - A row whose worker is missing is lost at once on a full inventory
//     (when it is older than the registration), else after
//     lostAfterMisses heartbeats; a row whose start the hive has not
//     answered yet (no worker id) waits.
//   - A live worker with no live row is unknown: the caller stops it.
//   - A worker whose entry the queen refused loses its row at once and is
//     stopped (when its id can be named).
func reconcile(in reconcileInput) reconcilePlan {
	plan := reconcilePlan{Seen: in.Seen[:0]}
	find := newRowFinder(in.Rows)
	seen := make([]bool, len(in.Rows))
	for _, w := range in.Workers {
		state := lifecycle.State(w.Status)
		i, ok := find.lifecycle(w.LifecycleID)
		if !ok {
			i, ok = find.worker(w.WorkerID)
		}
		if !ok {
			if state.Terminal() {
				continue // ended, nothing to stop
			}
			why := "no lifecycle row"
			if w.LifecycleID != "" {
				why = fmt.Sprintf("lifecycle row %s is not live", w.LifecycleID)
			}
			plan.Unknown = append(plan.Unknown, unknownWorker{Worker: w, Why: why})
			continue
		}
		row := in.Rows[i]
		seen[i] = true
		plan.Seen = append(plan.Seen, row.ID)
		to := row.Status
		if state.Valid() {
			to = state.Status()
		}
		// A row we are stopping may still show its worker serving for a
		// moment; the stop is on its way, so that is no news.
		if row.Status == rowDraining && to == rowRunning {
			to = rowDraining
		}
		next := row // fillFromWorker replaces pointers, never writes through them
		if changed := fillFromWorker(&next, w); to != row.Status || changed {
			plan.Sync = append(plan.Sync, rowSync{ID: row.ID, Worker: w, To: to})
		}
	}
	var refused map[string]string
	if len(in.Refused) > 0 {
		refused = make(map[string]string, len(in.Refused))
	}
	for _, x := range in.Refused {
		refused[x.WorkerID] = x.Reason
		if checkID("worker_id", x.WorkerID) == nil {
			// Nothing may run that the queen cannot account for.
			plan.Unknown = append(plan.Unknown, unknownWorker{Worker: api.Worker{WorkerID: x.WorkerID},
				Why: "the queen refused the hive's report of it: " + x.Reason})
		}
	}
	for i, r := range in.Rows {
		if seen[i] {
			continue
		}
		if why, ok := refused[r.WorkerID]; ok && r.WorkerID != "" {
			plan.Lost = append(plan.Lost, lostRow{ID: r.ID, Reason: "refused: the hive's report of this worker: " + why})
			continue
		}
		old := r.CreatedAt.Before(in.RegisteredAt)
		switch {
		case in.FullInventory && old:
			plan.Lost = append(plan.Lost, lostRow{ID: r.ID, Reason: "lost: the hive's inventory after it registered does not have this worker"})
		case r.WorkerID == "":
			// The hive has not answered the start yet.
		case in.Misses[r.ID]+1 >= lostAfterMisses:
			plan.Lost = append(plan.Lost, lostRow{ID: r.ID, Reason: fmt.Sprintf("lost: missing from %d heartbeats in a row", in.Misses[r.ID]+1)})
		default:
			if plan.Misses == nil {
				plan.Misses = map[string]int{}
			}
			plan.Misses[r.ID] = in.Misses[r.ID] + 1
		}
	}
	return plan
}

// rowFinder finds a pool's rows by lifecycle id or worker id: a scan of
// the few rows a pool usually has, maps when it has many.
type rowFinder struct {
	rows           []store.Row
	byID, byWorker map[string]int // nil when scanning
}

// rowFinderScan is how many rows are scanned rather than indexed.
const rowFinderScan = 16

func newRowFinder(rows []store.Row) rowFinder {
	f := rowFinder{rows: rows}
	if len(rows) <= rowFinderScan {
		return f
	}
	f.byID, f.byWorker = make(map[string]int, len(rows)), make(map[string]int, len(rows))
	for i, r := range rows {
		f.byID[r.ID] = i
		if r.WorkerID != "" {
			f.byWorker[r.WorkerID] = i
		}
	}
	return f
}

// lifecycle returns the index of the row id ("" finds none).
func (f rowFinder) lifecycle(id string) (int, bool) {
	if id == "" {
		return 0, false
	}
	if f.byID != nil {
		i, ok := f.byID[id]
		return i, ok
	}
	for i := range f.rows {
		if f.rows[i].ID == id {
			return i, true
		}
	}
	return 0, false
}

// worker returns the index of the row of hive worker id ("" finds none);
// the last one when several name it, as the map would.
func (f rowFinder) worker(id string) (int, bool) {
	if id == "" {
		return 0, false
	}
	if f.byWorker != nil {
		i, ok := f.byWorker[id]
		return i, ok
	}
	for i := len(f.rows) - 1; i >= 0; i-- {
		if f.rows[i].WorkerID == id {
			return i, true
		}
	}
	return 0, false
}
