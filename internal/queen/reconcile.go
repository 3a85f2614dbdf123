package queen

import (
	"fmt"
	"reflect"
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
	plan := reconcilePlan{Misses: map[string]int{}}
	byID := make(map[string]store.Row, len(in.Rows))
	byWorker := make(map[string]string, len(in.Rows))
	for _, r := range in.Rows {
		byID[r.ID] = r
		if r.WorkerID != "" {
			byWorker[r.WorkerID] = r.ID
		}
	}
	seen := map[string]bool{}
	for _, w := range in.Workers {
		state := lifecycle.State(w.Status)
		id := ""
		if _, ok := byID[w.LifecycleID]; ok && w.LifecycleID != "" {
			id = w.LifecycleID
		} else if rid, ok := byWorker[w.WorkerID]; ok && w.WorkerID != "" {
			id = rid
		}
		if id == "" {
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
		seen[id] = true
		plan.Seen = append(plan.Seen, id)
		row := byID[id]
		to := row.Status
		if state.Valid() {
			to = state.Status()
		}
		// A row we are stopping may still show its worker serving for a
		// moment; the stop is on its way, so that is no news.
		if row.Status == rowDraining && to == rowRunning {
			to = rowDraining
		}
		next := row
		copyPtrs(&next)
		fillFromWorker(&next, w)
		if to != row.Status || !reflect.DeepEqual(row, next) {
			plan.Sync = append(plan.Sync, rowSync{ID: id, Worker: w, To: to})
		}
	}
	refused := make(map[string]string, len(in.Refused))
	for _, x := range in.Refused {
		refused[x.WorkerID] = x.Reason
		if checkID("worker_id", x.WorkerID) == nil {
			// Nothing may run that the queen cannot account for.
			plan.Unknown = append(plan.Unknown, unknownWorker{Worker: api.Worker{WorkerID: x.WorkerID},
				Why: "the queen refused the hive's report of it: " + x.Reason})
		}
	}
	for _, r := range in.Rows {
		if seen[r.ID] {
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
			plan.Misses[r.ID] = in.Misses[r.ID] + 1
		}
	}
	return plan
}
