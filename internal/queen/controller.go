package queen

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/apiary-llm/apiary/internal/registry"
	"github.com/apiary-llm/apiary/internal/store"
)

// modelDemand is what the scale policy sees of one model with requests
// waiting.
type modelDemand struct {
	Model      string
	Queued     int
	OldestWait time.Duration
	Live       int // live rows (STARTING, RUNNING) on healthy pools, plus placements under way
	Starting   int // STARTING rows plus placements under way
	Routable   int // workers taking requests now
	MaxWorkers int
	RetryAt    time.Time // no placement before this (after failures)
}

// placeOrder asks for one more worker of Model.
type placeOrder struct {
	Model  string
	Kind   string // cold_start or scale_up
	Reason string // for the audit entry of the start
}

// scaleDecision is what decideScale decided.
type scaleDecision struct {
	Place []placeOrder
	// Refuse holds models whose waiting requests no worker will ever
	// serve (none lives, and the queen may not place one), with why.
	Refuse map[string]string
	// Recheck is when to decide again if nothing else happens first; 0:
	// no need.
	Recheck time.Duration
}

// decideScale is the scale policy, pure. For each model with requests
// waiting:
//   - at most one placement is under way at a time (a starting worker
//     will take the queue);
//   - no worker at all: place one now (cold start);
//   - the oldest request waited ScaleUpAfter: place one more (scale up);
//   - never beyond the model's max workers, and not before RetryAt.
func decideScale(now time.Time, demand []modelDemand, scaleUpAfter time.Duration) scaleDecision {
	d := scaleDecision{Refuse: map[string]string{}}
	recheck := func(after time.Duration) {
		if after > 0 && (d.Recheck == 0 || after < d.Recheck) {
			d.Recheck = after
		}
	}
	for _, m := range demand {
		switch {
		case m.Queued == 0:
		case m.Live == 0 && m.MaxWorkers == 0:
			d.Refuse[m.Model] = fmt.Sprintf("model %s is not placed on demand (its max workers is 0) and no worker of it runs; an operator must start one", m.Model)
		case m.Starting > 0, m.Live >= m.MaxWorkers:
		case now.Before(m.RetryAt):
			recheck(m.RetryAt.Sub(now))
		case m.Live == 0:
			d.Place = append(d.Place, placeOrder{Model: m.Model, Kind: "cold_start",
				Reason: fmt.Sprintf("demand: %d requests for %s waiting, no worker runs it", m.Queued, m.Model)})
		case m.OldestWait >= scaleUpAfter:
			d.Place = append(d.Place, placeOrder{Model: m.Model, Kind: "scale_up",
				Reason: fmt.Sprintf("demand: %d requests for %s waiting, the oldest for %s (threshold %s), %d of at most %d workers live",
					m.Queued, m.Model, m.OldestWait.Round(time.Millisecond), scaleUpAfter, m.Live, m.MaxWorkers)})
		default:
			recheck(scaleUpAfter - m.OldestWait)
		}
	}
	return d
}

// placeBackoff is the wait before placing a model again after n
// placements in a row that gave it no serving worker: 1s, 2s, 4s … 30s.
func placeBackoff(n int) time.Duration {
	if n <= 0 {
		return 0
	}
	return min(time.Second<<min(n-1, 5), 30*time.Second)
}

// placeResult is what one placement did.
type placeResult struct {
	model string
	row   store.Row
	err   error
}

// controller turns demand (requests waiting in the router's queues) into
// workers: it is the only code that places workers on demand, and it
// never serves a request. One goroutine (run) owns its state; placements
// run on goroutines run starts and waits for.
type controller struct {
	q    *Queen
	log  *slog.Logger
	wake chan struct{}
}

func newController(q *Queen) *controller {
	return &controller{q: q, log: q.log.With("component", "controller"), wake: make(chan struct{}, 1)}
}

// signal asks the controller to look at the demand; it never blocks.
func (c *controller) signal() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// run decides whenever demand changes, a placement ends, or a deadline of
// the policy passes, until ctx ends; then it waits for its placements.
func (c *controller) run(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	results := make(chan placeResult)
	models := map[string]*placing{}
	state := func(m string) *placing {
		if models[m] == nil {
			models[m] = &placing{}
		}
		return models[m]
	}
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.wake:
		case <-timer.C:
		case res := <-results:
			st := state(res.model)
			st.pending--
			if res.err == nil {
				st.fails, st.failRetry = 0, time.Time{}
				break
			}
			st.fails++
			st.failRetry = time.Now().Add(placeBackoff(st.fails))
			if len(c.q.routing.router.source(res.model)) == 0 && c.q.rows.modelCounts()[res.model].live() == 0 {
				n := c.q.routing.router.failModel(res.model, fmt.Errorf("%w: %w", ErrNoCapacity, res.err))
				c.log.Warn("no worker can be placed; waiting requests refused", "model_ref", res.model, "refused", n, "err", res.err)
			}
		}
		now := time.Now()
		// A model that has a serving worker again starts afresh: its next
		// cold start (after the worker is gone) is not held back.
		for m, st := range models {
			if st.coldTries > 0 && len(c.q.routing.router.source(m)) > 0 {
				st.coldTries, st.coldRetry = 0, time.Time{}
			}
			if *st == (placing{}) {
				delete(models, m)
			}
		}
		// Workers on pools that are not healthy (drained, silent) take no
		// requests: they do not count against the model's max workers.
		healthy := map[string]bool{}
		for _, p := range c.q.reg.Query(registry.Filter{Statuses: []registry.Status{registry.Healthy}}) {
			healthy[p.ID] = true
		}
		var demand []modelDemand
		counts := c.q.rows.modelCounts(healthy)
		for _, s := range c.q.routing.router.queueStats() {
			st := state(s.model)
			n := counts[s.model]
			demand = append(demand, modelDemand{Model: s.model, Queued: s.queued, OldestWait: now.Sub(s.oldest),
				Live: n.live() + st.pending, Starting: n.starting + st.pending, Routable: len(c.q.routing.router.source(s.model)),
				MaxWorkers: c.q.cfg.Routing.maxWorkers(s.model), RetryAt: later(st.coldRetry, st.failRetry)})
		}
		sort.Slice(demand, func(i, j int) bool { return demand[i].Model < demand[j].Model })
		dec := decideScale(now, demand, c.q.cfg.Routing.ScaleUpAfter)
		for model, why := range dec.Refuse {
			c.q.routing.router.failModel(model, fmt.Errorf("%w: %s", ErrNoCapacity, why))
		}
		for _, o := range dec.Place {
			st := state(o.Model)
			st.pending++
			if o.Kind == "cold_start" {
				// A worker that dies while loading brings the model back
				// here: each cold start in a row waits longer.
				st.coldTries++
				st.coldRetry = now.Add(placeBackoff(st.coldTries))
			}
			wg.Go(func() {
				res := c.place(ctx, o)
				select {
				case results <- res:
				case <-ctx.Done():
				}
			})
		}
		if dec.Recheck > 0 {
			timer.Reset(dec.Recheck)
		}
	}
}

// placing is what the controller remembers of one model.
type placing struct {
	pending   int       // placements under way
	coldTries int       // cold starts since the model last had a serving worker
	coldRetry time.Time // no cold start before (after one that gave no worker)
	fails     int       // placements in a row that failed
	failRetry time.Time // no placement before (after failures)
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// place starts one worker of o.Model: placement, lifecycle row, hive
// start. A hive that refuses (or does not answer) is left out and the
// placement is made again without it.
func (c *controller) place(ctx context.Context, o placeOrder) placeResult {
	start := time.Now()
	exclude := map[string]string{}
	for {
		d, err := c.q.decide(ctx, o.Model, nil, exclude)
		if err != nil {
			c.q.routing.m.placements.WithLabelValues(o.Model, "failed").Inc()
			return placeResult{model: o.Model, err: err}
		}
		gpu := d.GPU
		row, err := c.q.StartWorker(ctx, StartRequest{Model: o.Model, PoolID: d.Pool.ID, GPU: &gpu, Reason: o.Reason,
			Actor: registry.ActorQueen, Owner: OwnerQueen, Meta: map[string]any{"placement": d.auditMeta(), "demand": o.Kind}})
		var he *HiveError
		switch {
		case err == nil:
			c.q.routing.m.placements.WithLabelValues(o.Model, "started").Inc()
			c.log.Info("worker placed on demand", "model_ref", o.Model, "kind", o.Kind, "pool_id", d.Pool.ID, "gpu_device", gpu,
				"lifecycle_id", row.ID, "duration_ms", time.Since(start).Milliseconds())
			return placeResult{model: o.Model, row: row}
		case ctx.Err() != nil:
			return placeResult{model: o.Model, err: err}
		case errors.As(err, &he):
			exclude[d.Pool.ID] = fmt.Sprintf("its hive refused the start: %s %s", he.Code, he.Message)
		case errors.Is(err, ErrHiveUnreachable), errors.Is(err, ErrPoolUnavailable):
			exclude[d.Pool.ID] = "its hive did not answer the start: " + err.Error()
		default:
			c.q.routing.m.placements.WithLabelValues(o.Model, "failed").Inc()
			return placeResult{model: o.Model, err: err}
		}
		c.log.Warn("placement refused; placing again without the pool", "model_ref", o.Model, "pool_id", d.Pool.ID, "err", err)
	}
}

// decide places a worker of model: the catalog is brought up to date for
// it, then the Placer decides. A placement that finds no pool is audited
// with every pool's reason.
func (q *Queen) decide(ctx context.Context, model string, gpu *int, exclude map[string]string) (Decision, error) {
	pools := q.reg.Query(registry.Filter{})
	var healthy []registry.Pool
	for _, p := range pools {
		if p.Status == registry.Healthy {
			healthy = append(healthy, p)
		}
	}
	q.routing.catalog.ensure(ctx, healthy, model)
	d, err := q.cfg.Placer.Place(pools, PlaceRequest{Model: model, GPU: gpu, Models: q.routing.catalog.snapshot(), Exclude: exclude})
	if err == nil {
		return d, nil
	}
	meta := map[string]any{"model_ref": model, "rejected": rejectedMeta(placementRejections(err))}
	if gpu != nil {
		meta["gpu_device"] = *gpu
	}
	aerr := q.st.Update(context.WithoutCancel(ctx), func(tx *store.Tx) error {
		_, err := tx.Append(store.AuditEntry{Actor: registry.ActorQueen, Action: "worker.place_failed", Target: "model:" + model,
			Reason: err.Error(), Metadata: meta})
		return err
	})
	if aerr != nil {
		q.metrics.storeErrors.Inc()
		q.log.Error("cannot audit a failed placement", "model_ref", model, "err", aerr)
	}
	q.log.Warn("placement found no pool", "model_ref", model, "err", err)
	return Decision{}, err
}
