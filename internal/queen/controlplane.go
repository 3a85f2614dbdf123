package queen

import (
	"context"
	"errors"
	"maps"

	"github.com/apiary-llm/apiary/internal/fleet"
	"github.com/apiary-llm/apiary/internal/lifecycle"
	"github.com/apiary-llm/apiary/internal/openai"
	"github.com/apiary-llm/apiary/internal/registry"
	"github.com/apiary-llm/apiary/internal/routing"
	"github.com/apiary-llm/apiary/internal/store"
)

// controlPlane is the queen as routing and the fleet see it
// (routing.ControlPlane, fleet.Queen): the registry's pools, the rows,
// the workers' tokens, and the few changes they ask for.
type controlPlane struct{ q *Queen }

var (
	_ routing.ControlPlane = controlPlane{}
	_ fleet.Queen          = controlPlane{}
)

// URL is the queen's base URL for its hives.
func (c controlPlane) URL() string { return c.q.URL() }

// Deregister takes the pool of a hive that stopped or exited offline, so
// no request waits for it; a pool already gone is no error.
func (c controlPlane) Deregister(ctx context.Context, poolID, reason string) error {
	_, err := c.q.reg.Deregister(ctx, poolID, registry.ActorQueen, reason)
	if errors.Is(err, registry.ErrNotFound) || errors.Is(err, registry.ErrClosed) {
		return nil
	}
	return err
}

// Vacate takes a pool offline whose workers outlive its hive
// (fleet.Queen).
func (c controlPlane) Vacate(ctx context.Context, poolID, reason string) error {
	_, err := c.q.reg.Vacate(ctx, poolID, registry.ActorQueen, reason)
	if errors.Is(err, registry.ErrNotFound) || errors.Is(err, registry.ErrClosed) {
		return nil
	}
	return err
}

// PingHive asks the hive at endpoint whether it answers (fleet.Queen);
// a hive client that cannot ask says so, which the fleet takes for no
// answer.
func (c controlPlane) PingHive(ctx context.Context, endpoint string) error {
	p, ok := c.q.hives.(hivePinger)
	if !ok {
		return errors.New("this hive client cannot ping a hive")
	}
	return p.Ping(ctx, endpoint)
}

func (c controlPlane) Pool(id string) (registry.Pool, bool)    { return c.q.reg.Get(id) }
func (c controlPlane) Pools(f registry.Filter) []registry.Pool { return c.q.reg.Query(f) }
func (c controlPlane) Row(ctx context.Context, id string) (store.Row, error) {
	return c.q.rows.get(ctx, id)
}

// Running reports whether the hive's worker has a RUNNING row.
func (c controlPlane) Running(pool, lifecycleID, workerID string) bool {
	_, ok := c.q.rows.runningRow(pool, lifecycleID, workerID)
	return ok
}

// StartWorker starts a worker the controller placed: the queen's own,
// audited as the queen's. A hive that refused the start or did not answer
// it is a *routing.StartRefused.
func (c controlPlane) StartWorker(ctx context.Context, s routing.Start) (store.Row, error) {
	gpu := s.GPU
	row, err := c.q.StartWorker(ctx, StartRequest{Model: s.Model, PoolID: s.Pool, GPU: &gpu, GPUs: s.GPUs, Reason: s.Reason,
		Actor: registry.ActorQueen, Owner: OwnerQueen, Meta: s.Meta})
	// Why is in words (it reaches API clients among the placement's
	// reasons); err keeps what the hive said, the row and the address,
	// for the log, and the row's audit entry has them.
	var he *HiveError
	switch {
	case err == nil:
	case errors.As(err, &he):
		return row, &routing.StartRefused{Why: he.PublicMessage(), Err: err,
			NoRoomYet: he.Code == "max_loaded" || he.Code == "insufficient_memory"}
	case errors.As(err, new(*poolDownError)):
		return row, &routing.StartRefused{Why: "its hive did not answer (the pool is marked unhealthy)", Err: err}
	case errors.Is(err, ErrHiveUnreachable):
		return row, &routing.StartRefused{Why: "its hive did not answer the start in time", Err: err}
	case errors.Is(err, ErrPoolUnavailable):
		return row, &routing.StartRefused{Why: openai.PublicText(err), Err: err}
	}
	return row, err
}

// WorkerLost fails the row of a worker that broke a request and does not
// answer its health check; a row that ended meanwhile is left as it is.
func (c controlPlane) WorkerLost(ctx context.Context, lifecycleID, reason string) error {
	_, _, err := c.q.rows.apply(ctx, lifecycleID, rowChange{to: rowFailed, actor: registry.ActorQueen, action: "worker.lost",
		reason: reason, meta: map[string]any{"suspect": true}})
	if err != nil && !errors.Is(err, ErrRefused) && !errors.Is(err, ErrRowEnded) {
		c.q.metrics.storeErrors.Inc()
		return err
	}
	return nil
}

// StopWorker stops a worker whose strikes reached 3 × the strike limit:
// the admin stop path (its hive drains it, the row goes DRAINING with a
// worker.stop audit entry), with the queen as the actor. A row that ended
// meanwhile is left as it is.
func (c controlPlane) StopWorker(ctx context.Context, lifecycleID, reason string) error {
	_, err := c.q.StopWorker(ctx, lifecycleID, true, reason, registry.ActorQueen)
	if errors.Is(err, ErrRowEnded) {
		return nil
	}
	return err
}

// EvictWorker stops a worker to make room for another model's, as
// StopWorker does, audited worker.evicted (CONTRACT.md) with meta.
func (c controlPlane) EvictWorker(ctx context.Context, lifecycleID, reason string, meta map[string]any) error {
	_, err := c.q.stopWorker(ctx, lifecycleID, stopOrder{drain: true, reason: reason, actor: registry.ActorQueen, action: "worker.evicted", meta: meta})
	if errors.Is(err, ErrRowEnded) {
		return nil
	}
	return err
}

// Audit appends e; a failure is logged and counted.
func (c controlPlane) Audit(ctx context.Context, e store.AuditEntry) {
	err := c.q.st.Update(ctx, func(tx *store.Tx) error {
		_, err := tx.Append(e)
		return err
	})
	if err != nil {
		c.q.metrics.storeErrors.Inc()
		c.q.log.Error("cannot write an audit entry", "action", e.Action, "target", e.Target, "err", err)
	}
}

// Replicas returns the models' settings: apiary models scale, and over
// them those of the model config (the file wins for the models it
// gives min_workers or max_workers).
func (c controlPlane) Replicas() map[string]routing.Replica {
	out := c.q.settings.replicas()
	maps.Copy(out, c.q.models.replicas())
	return out
}

// LogTail returns the last n lines of a row's worker's log, from its
// hive.
func (c controlPlane) LogTail(ctx context.Context, lifecycleID string, n int) ([]string, error) {
	return c.q.logTail(ctx, lifecycleID, n)
}

// LiveModels returns the models that have a STARTING or RUNNING row.
func (c controlPlane) LiveModels() []string { return c.q.rows.liveModels() }

// AwaitedPools returns the pools restored at the queen's start whose
// hives have not been heard from yet.
func (c controlPlane) AwaitedPools() []string { return c.q.reg.Awaited() }

// TokenRefused drops the worker's token and asks its hive for it again.
func (c controlPlane) TokenRefused(pool, workerID string) {
	if pool == HandRunPool {
		return
	}
	c.q.tokens.drop(pool, workerID)
	c.q.tokens.unknownPool(pool)
	c.q.fetchTokens(pool)
}

// liveModels returns the models of the STARTING and RUNNING rows, each
// once.
func (b *rowBook) liveModels() []string {
	b.mu.RLock()
	defer b.mu.RUnlock()
	var out []string
	for model, ids := range b.byModel {
		for id := range ids {
			if st := b.active[id].Status; st == rowStarting || st == rowRunning {
				out = append(out, model)
				break
			}
		}
	}
	return out
}

// runningRow returns the id of the RUNNING row of a hive's worker.
func (b *rowBook) runningRow(pool, lifecycleID, workerID string) (string, bool) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	return b.runningRowLocked(pool, lifecycleID, workerID)
}

// runningRowLocked is runningRow; the caller holds mu or its read lock.
func (b *rowBook) runningRowLocked(pool, lifecycleID, workerID string) (string, bool) {
	if r, ok := b.active[lifecycleID]; ok && lifecycleID != "" && r.PoolID == pool {
		return r.ID, r.Status == rowRunning
	}
	id, ok := b.byWorker[workerKey{pool, workerID}]
	if !ok || workerID == "" {
		return "", false
	}
	return id, b.active[id].Status == rowRunning
}

// targetCounts counts the live rows of model (on pool, when it names
// one); with keep given, only the rows on pools it keeps.
func (b *rowBook) targetCounts(model, pool string, keep func(pool string) bool) routing.Count {
	b.mu.RLock()
	ids := b.byModel[model]
	pools, status := make([]string, 0, len(ids)), make([]lifecycle.Status, 0, len(ids))
	for id := range ids {
		if r := b.active[id]; pool == "" || r.PoolID == pool {
			pools, status = append(pools, r.PoolID), append(status, r.Status)
		}
	}
	b.mu.RUnlock() // keep may take the registry's lock: not under this one
	var c routing.Count
	for i, p := range pools {
		switch {
		case keep != nil && !keep(p):
		case status[i] == rowStarting:
			c.Starting++
		case status[i] == rowRunning:
			c.Running++
		}
	}
	return c
}

// routingConfig is the routing's Config: the queen's routing settings,
// wired to the queen's tokens, hive client and metrics.
func (q *Queen) routingConfig() routing.Config {
	rc := q.cfg.Routing
	rc.APIToken = q.cfg.Tokens.API
	rc.CORSOrigins = q.cfg.CORSOrigins
	rc.MaxBodyBytes = q.cfg.MaxBodyBytes
	rc.HiveTimeout = q.cfg.HiveTimeout
	rc.Placer = q.cfg.Placer
	rc.Metrics = q.metrics.reg
	rc.Logger = q.cfg.Logger
	src, ok := q.hives.(routing.HiveModels)
	if !ok {
		src = q.hivesHTTP
	}
	rc.Models = src
	rc.Responses = q.st
	rc.Finished = q.ui.requestFinished
	return rc
}
