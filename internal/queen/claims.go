package queen

// Workers run by hand: `apiary worker --queen URL` started by an operator
// anywhere that reaches the queen. Such a worker claims a row once its
// model is loaded (POST /v2/workers/claim): the STARTING row an operator
// created with placement operator (its --lifecycle-id), or, without a
// lifecycle id, a row the queen creates for it. The queen checks the
// worker (it answers at its uri, serves the row's model, takes its
// token), adopts it (RUNNING, its uri and memory), routes to it like any
// worker, checks its health itself, and fails its row when it stops
// answering. Its rows are in the pool HandRunPool, which no hive may
// register; the queen never stops such a worker on its own shutdown.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/lifecycle"
	"github.com/apiary-llm/apiary/internal/registry"
	"github.com/apiary-llm/apiary/internal/routing"
	"github.com/apiary-llm/apiary/internal/rpc"
	"github.com/apiary-llm/apiary/internal/store"
	"github.com/apiary-llm/apiary/internal/transport"
)

// HandRunPool is the pool id of the rows of workers run by hand. A hive
// cannot register under it. A hand-run worker's worker_id is its row's
// lifecycle id.
const HandRunPool = "manual"

// maxHandRun bounds the live rows of workers run by hand.
const maxHandRun = maxWorkers

// claimCheckTimeout bounds each call the queen makes to a claiming worker.
const claimCheckTimeout = 5 * time.Second

// handRun keeps what the queen needs of each worker run by hand that
// claimed a live row: where it is and its token, to relay to it, and its
// health checks. Memory only: the token is never stored (a restarted
// queen checks the health of the RUNNING rows it finds, by their uri, and
// routes to them again once their workers claim them again: see
// refreshClaim). Bounded by the live hand-run rows (maxHandRun):
// an entry goes when its row ends.
type handRun struct {
	mu    sync.Mutex
	byRow map[string]*handRunWorker // guarded by mu; by lifecycle id
	fails map[string]int            // guarded by mu; health checks failed in a row, by lifecycle id
}

type handRunWorker struct {
	uri, token string
	inFlight   int // from its last health check
}

func newHandRun() *handRun {
	return &handRun{byRow: map[string]*handRunWorker{}, fails: map[string]int{}}
}

func (h *handRun) put(id, uri, token string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.byRow[id] = &handRunWorker{uri: uri, token: token}
	delete(h.fails, id)
}

func (h *handRun) forget(id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.byRow, id)
	delete(h.fails, id)
}

func (h *handRun) get(id string) (handRunWorker, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	w, ok := h.byRow[id]
	if !ok {
		return handRunWorker{}, false
	}
	return *w, true
}

// keep drops the entries of rows that are no longer live (rows ended by
// another path: routing found the worker lost).
func (h *handRun) keep(live []store.Row) {
	ids := make(map[string]bool, len(live))
	for _, r := range live {
		ids[r.ID] = true
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for id := range h.byRow {
		if !ids[id] {
			delete(h.byRow, id)
		}
	}
	for id := range h.fails {
		if !ids[id] {
			delete(h.fails, id)
		}
	}
}

// checked records a health check of row id and returns how many failed
// in a row.
func (h *handRun) checked(id string, err error, inFlight int) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err == nil {
		delete(h.fails, id)
		if w, ok := h.byRow[id]; ok {
			w.inFlight = inFlight
		}
		return 0
	}
	h.fails[id]++
	return h.fails[id]
}

// handRunRows returns copies of the live rows of workers run by hand.
func (b *rowBook) handRunRows() []store.Row {
	b.mu.RLock()
	none := len(b.byPool[HandRunPool]) == 0 // routing asks at every request
	b.mu.RUnlock()
	if none {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	rows, _ := b.poolRowsLocked(HandRunPool, true)
	return rows
}

// createOperatorRow writes a STARTING row of placement operator: no pool
// chosen, no hive asked; it waits for a worker run by hand to claim it.
func (q *Queen) createOperatorRow(ctx context.Context, model, reason, actor string) (store.Row, error) {
	if n := len(q.rows.handRunRows()); n >= maxHandRun {
		return store.Row{}, fmt.Errorf("%w: %d live rows of workers run by hand already (at most %d)", ErrClaimRefused, n, maxHandRun)
	}
	row := store.Row{ID: newLifecycleID(), PoolID: HandRunPool, ModelRef: model, Status: rowStarting, Reason: reason,
		Owner: OwnerOperator, CreatedAt: micro(time.Now())}
	meta := map[string]any{"pool_id": HandRunPool, "model_ref": model, "owner": OwnerOperator, "placement": api.PlacementOperator,
		"claim_timeout": q.cfg.ClaimTimeout.String()}
	if err := q.rows.create(ctx, row, actor, meta); err != nil {
		return store.Row{}, err
	}
	q.routing.Poke()
	return row, nil
}

// postClaim is POST /v2/workers/claim: a worker run by hand claims a row.
func (q *Queen) postClaim(w http.ResponseWriter, r *http.Request, c caller) error {
	var cl api.WorkerClaim
	if err := api.Decode(r, &cl, false); err != nil {
		return err
	}
	if err := checkModel(cl.ModelRef); err != nil {
		return err
	}
	if cl.LifecycleID != "" {
		if err := checkLifecycleID(cl.LifecycleID); err != nil {
			return err
		}
	}
	if _, err := transport.CheckBaseURL("uri", cl.URI); err != nil {
		return api.BadRequest("%v", err)
	}
	uri := strings.TrimSuffix(cl.URI, "/")
	if cl.WorkerToken != "" {
		if err := checkWorkerToken(cl.WorkerToken); err != nil {
			return err
		}
	}
	if cl.PID < 0 {
		return api.BadRequest("pid %d is negative", cl.PID)
	}
	if cl.LifecycleID != "" {
		// A claim for an unknown row, a row of another model, or one
		// that no longer waits is refused before the worker is called.
		cur, err := q.rows.get(r.Context(), cl.LifecycleID)
		if err != nil {
			return err
		}
		if isRefresh(cur, cl.ModelRef, uri) {
			return q.refreshClaim(w, r, cur, uri, cl)
		}
		if err := claimable(cur, cl.ModelRef); err != nil {
			return err
		}
	}
	if err := q.verifyClaim(r.Context(), uri, cl); err != nil {
		return err
	}
	ctx := context.WithoutCancel(r.Context()) // the row's fate no longer depends on the caller
	id := cl.LifecycleID
	if id == "" {
		row, err := q.createOperatorRow(ctx, cl.ModelRef, "a worker run by hand claimed a row of its own", c.actor)
		if err != nil {
			return err
		}
		id = row.ID
	}
	now := micro(time.Now())
	placed := false
	row, _, err := q.rows.apply(ctx, id, rowChange{to: rowRunning, reason: "claimed by a worker run by hand at " + uri,
		actor: c.actor, action: "worker.claimed", meta: map[string]any{"uri": uri, "model_ref": cl.ModelRef},
		check: func(cur store.Row) error { return claimable(cur, cl.ModelRef) },
		set: func(r *store.Row) {
			// Known before the row is RUNNING: from then on the worker
			// may be routed to or stopped.
			q.handRun.put(id, uri, cl.WorkerToken)
			placed = true
			r.WorkerID, r.URI, r.VRAMBytes = id, uri, cl.VRAMBytes
			if cl.PID > 0 {
				p := cl.PID
				r.PID = &p
			}
			if r.StartedAt == nil {
				r.StartedAt = &now
			}
		}})
	if err != nil {
		if placed { // the row was not written: it still waits
			q.handRun.forget(id)
		}
		return err
	}
	q.routing.Poke()
	q.log.Info("worker run by hand claimed its row", "lifecycle_id", id, "model_ref", cl.ModelRef, "uri", uri)
	api.WriteJSON(w, http.StatusOK, api.AdminWorkerResponse{LifecycleID: id, Worker: q.rowWire(row)})
	return nil
}

// claimable refuses a first claim of row cur by a worker of model: only
// a STARTING row of pool HandRunPool and of that model waits for one.
func claimable(cur store.Row, model string) error {
	switch {
	case cur.PoolID != HandRunPool:
		return fmt.Errorf("%w: row %s is on pool %s, placed by the queen: a worker run by hand claims only a row created with placement %s",
			ErrClaimRefused, cur.ID, cur.PoolID, api.PlacementOperator)
	case cur.ModelRef != model:
		return fmt.Errorf("%w: row %s is for model %q, the worker serves %q", ErrClaimRefused, cur.ID, cur.ModelRef, model)
	case cur.Status != rowStarting:
		return fmt.Errorf("%w: row %s is %s (%s), not STARTING: only a row waiting for its worker can be claimed",
			ErrClaimRefused, cur.ID, cur.Status, cur.Reason)
	}
	return nil
}

// isRefresh reports whether a claim of row cur by a worker of model at
// uri is the claim again of the worker that holds it: the row is a
// RUNNING row of a worker run by hand, of that model, at that uri.
func isRefresh(cur store.Row, model, uri string) bool {
	return cur.PoolID == HandRunPool && cur.Status == rowRunning && cur.ModelRef == model && cur.URI == uri
}

// refreshClaim answers the claim again of a worker that holds its row
// (isRefresh). A worker run by hand sends its claim again every claim
// interval, so that a queen that lost its token (it keeps it in memory
// only: a restarted queen) learns it again and routes to the worker. The
// row does not change and no audit entry is written. A token the queen
// already holds for that uri is the answer at once; a new one is
// verified first (verifyClaim) as for a first claim: only the worker
// that answers at the row's uri and takes the token can set it.
func (q *Queen) refreshClaim(w http.ResponseWriter, r *http.Request, row store.Row, uri string, cl api.WorkerClaim) error {
	if hw, ok := q.handRun.get(row.ID); !ok || hw.uri != uri || hw.token != cl.WorkerToken {
		if err := q.verifyClaim(r.Context(), uri, cl); err != nil {
			return err
		}
		// The row may have ended during the check: an entry of a row no
		// longer live is never a candidate (handRunCandidates reads the
		// rows) and goes at the next health round (handRun.keep).
		q.handRun.put(row.ID, uri, cl.WorkerToken)
		q.routing.Poke()
		q.log.Info("worker run by hand claimed its row again", "lifecycle_id", row.ID, "model_ref", cl.ModelRef, "uri", uri, "token_known", ok)
	}
	api.WriteJSON(w, http.StatusOK, api.AdminWorkerResponse{LifecycleID: row.ID, Worker: q.rowWire(row)})
	return nil
}

// verifyClaim checks a claiming worker from the queen's side: it answers
// GET /health at uri, ready (or busy) with the claimed model, and takes
// its token (GET /v1/models). A worker the queen cannot reach or check is
// ErrClaimUnverified.
func (q *Queen) verifyClaim(ctx context.Context, uri string, cl api.WorkerClaim) error {
	ctx, cancel := context.WithTimeout(ctx, claimCheckTimeout)
	defer cancel()
	h, err := rpc.WorkerHealth(ctx, q.claimClient, uri)
	if err != nil {
		return fmt.Errorf("%w: the queen cannot check the worker at %s: %v", ErrClaimUnverified, uri, err)
	}
	if st := lifecycle.State(h.Status); st != lifecycle.Ready && st != lifecycle.Busy {
		return fmt.Errorf("%w: the worker at %s is %q, not ready", ErrClaimUnverified, uri, h.Status)
	}
	if h.Model != cl.ModelRef {
		return fmt.Errorf("%w: the worker at %s serves %q, the claim says %q", ErrClaimUnverified, uri, h.Model, cl.ModelRef)
	}
	if err := rpc.Do(ctx, q.claimClient, rpc.Call{URL: uri + "/v1/models", Token: cl.WorkerToken, MaxAnswer: 64 << 10}); err != nil {
		return fmt.Errorf("%w: the worker at %s does not take the claimed worker token: %v", ErrClaimUnverified, uri, err)
	}
	return nil
}

// postWorkerReport is POST /v2/workers/{id}/report: a worker run by hand
// says it drains (DRAINING) or has stopped (STOPPED).
func (q *Queen) postWorkerReport(w http.ResponseWriter, r *http.Request, c caller) error {
	id := r.PathValue("id")
	if err := checkLifecycleID(id); err != nil {
		return err
	}
	var rep api.WorkerReport
	if err := api.Decode(r, &rep, false); err != nil {
		return err
	}
	to := lifecycle.Status(strings.ToUpper(rep.Status))
	if to != rowDraining && to != rowStopped {
		return api.BadRequest("status %q: a worker reports DRAINING or STOPPED", rep.Status)
	}
	reason, err := checkReason(rep.Reason)
	if err != nil {
		return err
	}
	ctx := context.WithoutCancel(r.Context())
	handRunOnly := func(cur store.Row) error {
		if cur.PoolID != HandRunPool {
			return fmt.Errorf("%w: row %s belongs to pool %s: its hive reports its worker", ErrClaimRefused, id, cur.PoolID)
		}
		return nil
	}
	// STOPPED comes after DRAINING: a worker that stopped at once
	// drained too.
	row, _, err := q.rows.apply(ctx, id, rowChange{to: rowDraining, reason: reason, actor: c.actor, action: "worker.draining",
		fromHive: true, check: handRunOnly})
	if err == nil && to == rowStopped {
		row, _, err = q.rows.apply(ctx, id, rowChange{to: rowStopped, reason: reason, actor: c.actor, action: "worker.stopped",
			check: handRunOnly})
	}
	if err != nil {
		return err
	}
	if to == rowStopped {
		q.handRun.forget(id)
	}
	q.routing.Poke()
	api.WriteJSON(w, http.StatusOK, api.AdminWorkerResponse{LifecycleID: id, Worker: q.rowWire(row)})
	return nil
}

// stopHandRun stops the worker run by hand of a live row: an unclaimed
// row is STOPPED at once; a claimed worker is asked to shut down (POST
// /v1/admin/shutdown with its token; it drains, then reports STOPPED)
// and its row is DRAINING.
func (q *Queen) stopHandRun(ctx context.Context, row store.Row, reason, actor string) (store.Row, error) {
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if row.Status == rowStarting {
		r, _, err := q.rows.apply(wctx, row.ID, rowChange{to: rowDraining, reason: reason, actor: actor, action: "worker.stop", always: true})
		if err == nil {
			r, _, err = q.rows.apply(wctx, row.ID, rowChange{to: rowStopped, reason: "stopped before a worker claimed it", actor: actor, action: "worker.stopped"})
		}
		if errors.Is(err, ErrRowEnded) || errors.Is(err, ErrRefused) {
			return q.rows.get(wctx, row.ID) // claimed or ended meanwhile
		}
		return r, err
	}
	hw, ok := q.handRun.get(row.ID)
	if !ok {
		return row, fmt.Errorf("%w: the queen does not know the token of %s's worker (it claimed the row before the queen restarted and has not claimed it again since: a worker does within its claim interval); try again, or stop it where it runs",
			ErrWorkerUnreachable, row.ID)
	}
	sctx, scancel := context.WithTimeout(ctx, q.cfg.HiveTimeout)
	err := rpc.Do(sctx, q.claimClient, rpc.Call{Method: http.MethodPost, URL: hw.uri + "/v1/admin/shutdown", Token: hw.token, MaxAnswer: 4096})
	scancel()
	if err != nil {
		return row, fmt.Errorf("%w: shutdown of %s at %s: %v", ErrWorkerUnreachable, row.ID, hw.uri, err)
	}
	r, _, err := q.rows.apply(wctx, row.ID, rowChange{to: rowDraining, reason: reason, actor: actor, action: "worker.stop", always: true})
	if errors.Is(err, ErrRowEnded) || errors.Is(err, ErrRefused) {
		return q.rows.get(wctx, row.ID)
	}
	q.routing.Poke()
	return r, err
}

// handRunCandidates are the RUNNING workers run by hand of model whose
// claim this queen took.
func (q *Queen) handRunCandidates(model string) []routing.Candidate {
	var out []routing.Candidate
	for _, r := range q.rows.handRunRows() {
		if r.ModelRef != model || r.Status != rowRunning {
			continue
		}
		hw, ok := q.handRun.get(r.ID)
		if !ok {
			continue
		}
		out = append(out, routing.Candidate{Key: routing.WorkerKey{Pool: HandRunPool, Worker: r.ID}, LifecycleID: r.ID, URI: hw.uri,
			Token: hw.token, Reported: hw.inFlight})
	}
	return out
}

// superviseHandRun fails the rows of workers run by hand that no worker
// claimed within ClaimTimeout, and checks the health of those claimed,
// every ClaimHealthInterval (ClaimTimeout when shorter), until ctx ends.
func (q *Queen) superviseHandRun(ctx context.Context) {
	t := time.NewTicker(min(q.cfg.ClaimHealthInterval, q.cfg.ClaimTimeout))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			q.checkHandRun(ctx, time.Now())
		}
	}
}

// checkHandRun is one round of superviseHandRun.
func (q *Queen) checkHandRun(ctx context.Context, now time.Time) {
	var g errgroup.Group
	g.SetLimit(16)
	rows := q.rows.handRunRows()
	q.handRun.keep(rows)
	for _, r := range rows {
		switch {
		case r.Status == rowStarting:
			if now.Sub(r.CreatedAt) >= q.cfg.ClaimTimeout {
				q.failHandRun(ctx, r.ID, "worker.unclaimed",
					fmt.Sprintf("unclaimed: no worker claimed the row within %s (--claim-timeout)", q.cfg.ClaimTimeout))
			}
		case r.Status == rowRunning || r.Status == rowDraining:
			g.Go(func() error {
				hctx, cancel := context.WithTimeout(ctx, min(q.cfg.ClaimHealthInterval, claimCheckTimeout))
				h, err := rpc.WorkerHealth(hctx, q.claimClient, r.URI)
				cancel()
				if ctx.Err() != nil {
					return nil
				}
				if n := q.handRun.checked(r.ID, err, h.InFlight); n >= ClaimHealthFailures {
					q.failHandRun(ctx, r.ID, "worker.lost",
						fmt.Sprintf("lost: the worker run by hand at %s failed %d health checks in a row: %v", r.URI, n, err))
				}
				return nil
			})
		}
	}
	_ = g.Wait()
}

func (q *Queen) failHandRun(ctx context.Context, id, action, reason string) {
	_, _, err := q.rows.apply(ctx, id, rowChange{to: rowFailed, reason: reason, actor: registry.ActorQueen, action: action})
	if err != nil && !errors.Is(err, ErrRefused) && !errors.Is(err, ErrRowEnded) {
		q.metrics.storeErrors.Inc()
		q.log.Error("cannot fail the row of a worker run by hand", "lifecycle_id", id, "err", err)
		return
	}
	q.handRun.forget(id)
	q.routing.Poke()
}
