package queen

// Starting and stopping one worker: the lifecycle row is written with the
// hive's answer, audited.

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/registry"
	"github.com/apiary-llm/apiary/internal/routing"
	"github.com/apiary-llm/apiary/internal/store"
)

// StartRequest asks for a new worker.
type StartRequest struct {
	Model  string
	PoolID string // "" lets the Placer choose
	GPU    *int
	GPUs   []int // a split over several GPUs of the pool (GPU first)
	Reason string
	Actor  string
	Owner  string // OwnerOperator or OwnerQueen
	// Meta is added to the audit entry of the start (the controller's
	// placement decision and demand).
	Meta map[string]any
}

// StartWorker writes a STARTING row, then asks the hive to start the worker
// with the row's lifecycle id. A hive that refuses leaves the row FAILED
// with its answer as the reason, and the refusal is returned.
func (q *Queen) StartWorker(ctx context.Context, req StartRequest) (store.Row, error) {
	var pool registry.Pool
	if req.PoolID != "" {
		p, ok := q.reg.Get(req.PoolID)
		if !ok {
			return store.Row{}, fmt.Errorf("%w: %s", registry.ErrNotFound, req.PoolID)
		}
		if p.Status != registry.Healthy {
			return store.Row{}, fmt.Errorf("%w: pool %s is %s", ErrPoolUnavailable, p.ID, p.Status)
		}
		pool = p
	} else {
		d, err := q.routing.Place(ctx, routing.PlaceRequest{Model: req.Model, GPU: req.GPU})
		if err != nil {
			if q.noPoolHas(req.Model) {
				// By the name the user gave it, with its file (the
				// placement's reasons would name the file alone).
				what := req.Model
				if name := q.models.nameOf(req.Model); name != "" {
					what = fmt.Sprintf("%s (its file %s.gguf)", name, req.Model)
				}
				return store.Row{}, &api.RequestError{Status: http.StatusNotFound, Code: "model_not_found",
					Err: fmt.Errorf("no pool has model %s: `apiary models ls --all` lists the models the hives have", what)}
			}
			return store.Row{}, err
		}
		pool = d.Pool
		if req.GPU == nil {
			g := d.GPU
			req.GPU = &g
			req.GPUs = d.GPUs
		}
		req.Meta = maps.Clone(req.Meta)
		if req.Meta == nil {
			req.Meta = map[string]any{}
		}
		req.Meta["placement"] = d.AuditMeta()
	}
	now := micro(time.Now())
	row := store.Row{ID: newLifecycleID(), PoolID: pool.ID, ModelRef: req.Model, GPUDevice: req.GPU,
		Status: rowStarting, Reason: req.Reason, Owner: req.Owner, CreatedAt: now}
	meta := map[string]any{"pool_id": pool.ID, "model_ref": req.Model, "owner": req.Owner}
	maps.Copy(meta, req.Meta)
	if req.GPU != nil {
		meta["gpu_device"] = *req.GPU
	}
	if len(req.GPUs) > 0 {
		meta["gpu_devices"] = req.GPUs
	}
	if err := q.rows.create(ctx, row, req.Actor, meta); err != nil {
		return store.Row{}, err
	}
	resp, err := q.hives.StartWorker(ctx, pool.Endpoint, api.StartWorkerRequest{ModelRef: req.Model, GPUDevice: req.GPU, GPUDevices: req.GPUs, LifecycleID: row.ID,
		Engine: q.models.engine(req.Model), WorkerOptions: q.models.workerOptions(req.Model)})
	// The row's fate no longer depends on the caller waiting for it.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err != nil {
		down := hiveDown(err)
		reason := "start refused: " + err.Error()
		if down {
			reason = fmt.Sprintf("start failed: pool %s did not answer: %v", pool.ID, err)
		}
		_, _, ferr := q.rows.apply(wctx, row.ID, rowChange{to: rowFailed, reason: reason,
			actor: registry.ActorQueen, action: "worker.start_failed"})
		if ferr != nil && !errors.Is(ferr, ErrRefused) && !errors.Is(ferr, ErrRowEnded) {
			q.log.Error("cannot record failed start", "lifecycle_id", row.ID, "err", ferr)
		}
		if !down {
			q.log.Warn("hive refused to start worker", "lifecycle_id", row.ID, "pool_id", pool.ID, "model_ref", req.Model, "err", err)
			return store.Row{}, fmt.Errorf("start %s on pool %s (lifecycle row %s is FAILED): %w", req.Model, pool.ID, row.ID, err)
		}
		// No hive listens at the pool's endpoint (it died, and its lease
		// has not run out yet): the pool is unhealthy now, so that no
		// other start or request is sent there. The log and the audit
		// entry keep the error; the caller gets the pool, not the address.
		q.log.Warn("hive did not answer a start; pool marked unhealthy", "lifecycle_id", row.ID, "pool_id", pool.ID,
			"model_ref", req.Model, "err", err)
		if _, merr := q.reg.MarkUnhealthy(wctx, pool.ID, "its hive did not answer a start: "+err.Error()); merr != nil {
			q.log.Error("cannot mark the pool unhealthy", "pool_id", pool.ID, "err", merr)
		}
		return store.Row{}, &poolDownError{pool: pool.ID, row: row.ID}
	}
	started, _, err := q.rows.apply(wctx, row.ID, rowChange{reason: "hive accepted the start", actor: registry.ActorQueen, action: "worker.spawned",
		meta: map[string]any{"hive_status": resp.Status},
		set: func(r *store.Row) {
			if r.WorkerID == "" {
				r.WorkerID = resp.WorkerID
			}
			if r.StartedAt == nil {
				r.StartedAt = &now
			}
		}})
	switch {
	case errors.Is(err, ErrRowEnded):
		// The worker already ended (a fast failure event won the race).
		return q.rows.get(wctx, row.ID)
	case err != nil:
		return store.Row{}, err
	}
	return started, nil
}

// StopWorker asks the hive to stop the row's worker and marks the row
// DRAINING (audited worker.stop). A worker its hive no longer knows is
// lost: its row is FAILED.
func (q *Queen) StopWorker(ctx context.Context, id string, drain bool, reason, actor string) (store.Row, error) {
	return q.stopWorker(ctx, id, stopOrder{drain: drain, reason: reason, actor: actor, action: "worker.stop"})
}

// stopOrder is a stop as StopWorker takes it, with the audit entry's
// action (worker.stop, worker.evicted) and what it adds to its metadata.
type stopOrder struct {
	drain         bool
	reason, actor string
	action        string
	meta          map[string]any
	// rowReason, when set, is the row's reason instead of reason (the
	// audit entry's and the hive's): who stopped it, for an operator.
	rowReason string
}

// stopWorker is StopWorker with the audit entry's action and metadata.
func (q *Queen) stopWorker(ctx context.Context, id string, o stopOrder) (store.Row, error) {
	drain, reason, actor := o.drain, o.reason, o.actor
	row, err := q.rows.get(ctx, id)
	if err != nil {
		return store.Row{}, err
	}
	if row.Status.Terminal() {
		return row, fmt.Errorf("%w: %s is %s (%s)", ErrRowEnded, id, row.Status, row.Reason)
	}
	if row.PoolID == HandRunPool {
		return q.stopHandRun(ctx, row, reason, actor)
	}
	if row.WorkerID == "" {
		return row, fmt.Errorf("%w: %s; retry in a moment", ErrNotStarted, id)
	}
	pool, ok := q.reg.Get(row.PoolID)
	if !ok || pool.Status == registry.Offline {
		return row, fmt.Errorf("%w: pool %s of %s is gone; its row fails when the watchdog notices", ErrPoolUnavailable, row.PoolID, id)
	}
	err = q.hives.StopWorker(ctx, pool.Endpoint, row.WorkerID, api.StopWorkerRequest{Drain: drain, Reason: reason})
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	switch {
	case hiveCode(err, "worker_not_found"):
		r, _, aerr := q.rows.apply(wctx, id, rowChange{to: rowFailed, reason: "lost: the hive does not know worker " + row.WorkerID,
			actor: registry.ActorQueen, action: "worker.lost"})
		if aerr != nil {
			return q.rows.get(wctx, id)
		}
		return r, nil
	case hiveCode(err, "worker_ended"):
		return q.rows.get(wctx, id) // its final event is on the way
	case err != nil:
		return row, fmt.Errorf("stop %s on pool %s: %w", id, row.PoolID, err)
	}
	meta := maps.Clone(o.meta)
	if meta == nil {
		meta = map[string]any{}
	}
	meta["drain"] = drain
	r, _, err := q.rows.apply(wctx, id, rowChange{to: rowDraining, reason: reason, rowReason: o.rowReason, actor: actor, action: o.action,
		meta: meta, always: true})
	if errors.Is(err, ErrRowEnded) || errors.Is(err, ErrRefused) {
		return q.rows.get(wctx, id) // it ended meanwhile
	}
	return r, err
}
