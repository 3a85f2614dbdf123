package registry

import (
	"slices"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/lifecycle"
)

// Filter selects pools; zero fields select all.
type Filter struct {
	Statuses     []Status // any of these (19041: healthy)
	Model        string   // has a live worker of this model (19042)
	MinFreeBytes uint64   // has a device with at least this much free memory (19043)
}

// Match reports whether p passes f.
func (f Filter) Match(p Pool) bool { return f.match(&p) }

// match is Match without copying p (Query runs it on every pool).
func (f Filter) match(p *Pool) bool {
	if len(f.Statuses) > 0 && !slices.Contains(f.Statuses, p.Status) {
		return false
	}
	if f.Model != "" && !p.HasModel(f.Model) {
		return false
	}
	if f.MinFreeBytes > 0 && p.MaxFreeBytes() < f.MinFreeBytes {
		return false
	}
	return true
}

// HasModel reports whether a live worker of p serves model.
func (p *Pool) HasModel(model string) bool {
	for _, w := range p.Workers {
		if w.ModelRef == model && !lifecycle.State(w.Status).Terminal() {
			return true
		}
	}
	return false
}

// MaxFreeBytes is the free memory of p's roomiest device.
func (p *Pool) MaxFreeBytes() uint64 {
	var m uint64
	for _, g := range p.GPUs {
		m = max(m, g.FreeBytes)
	}
	return m
}

// Query returns the pools f selects, by id. A query for a model's pools
// reads only the pools that have a live worker of it.
func (r *Registry) Query(f Filter) []Pool {
	if f.Model != "" {
		r.mu.RLock()
		pools := r.byModel[f.Model]
		out := make([]Pool, 0, len(pools))
		for _, e := range pools {
			if p, ok := e.snapshot(f); ok {
				out = append(out, p)
			}
		}
		r.mu.RUnlock()
		return out
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	// Counted first: a narrow filter must not cost room for every pool,
	// nor a wide one a growing slice.
	n := 0
	for _, e := range r.order {
		if _, ok := e.snapshot(f); ok {
			n++
		}
	}
	out := make([]Pool, 0, n)
	for _, e := range r.order {
		if p, ok := e.snapshot(f); ok {
			out = append(out, p)
		}
	}
	return out
}

// Generation is a registry's state as routing reads it for one model:
// equal generations, equal answers (see Registry.Generation).
type Generation struct{ all, model uint64 }

// Generation changes whenever a query of model's pools could answer
// differently in what routing reads: the status of any pool, or the
// identity, model, URI or status of a worker of a pool with a live worker
// of model. Devices, heartbeat times and the load a hive reports
// (in_flight, which a busy fleet's every heartbeat changes) move without
// it. A cache of what is derived from those answers keeps the generation
// read before its query.
func (r *Registry) Generation(model string) Generation {
	r.mu.RLock()
	defer r.mu.RUnlock()
	g := Generation{all: r.gen.Load()}
	if c := r.modelGen[model]; c != nil {
		g.model = c.Load()
	}
	return g
}

// inventoryChange is how a full heartbeat's devices and workers differ
// from those the registry holds; ordered, so that the max of two is the
// change of both.
type inventoryChange int

const (
	inventorySame inventoryChange = iota
	// inventoryMoved: only in figures that move on their own (a device's
	// memory and temperature, a worker's requests in flight and memory).
	// Such a change is written at the pace of the heartbeat time
	// (BeatTimeSave), not at the next flush: the first full beat after a
	// restart brings them anyway, and a fleet whose memory moves every
	// second would otherwise rewrite every pool's row every flush.
	inventoryMoved
	inventoryChanged
)

// compareInventory compares, field by field and in one pass, the devices
// and workers the registry holds with a full heartbeat's.
func compareInventory(gpus []api.GPU, workers []api.Worker, hbGPUs []api.GPU, hbWorkers []api.Worker) inventoryChange {
	return max(compareEach(gpus, hbGPUs, stillGPU, movingGPU), compareEach(workers, hbWorkers, stillWorker, movingWorker))
}

// compareEach compares a and b element by element, still and moving
// splitting each element's fields as inventoryChange does.
func compareEach[T any](a, b []T, still, moving func(x, y *T) bool) inventoryChange {
	if len(a) != len(b) {
		return inventoryChanged
	}
	c := inventorySame
	for i := range a {
		if !still(&a[i], &b[i]) {
			return inventoryChanged
		}
		if !moving(&a[i], &b[i]) {
			c = inventoryMoved
		}
	}
	return c
}

func sameGPU(a, b api.GPU) bool { return stillGPU(&a, &b) && movingGPU(&a, &b) }

func sameWorker(a, b api.Worker) bool { return stillWorker(&a, &b) && movingWorker(&a, &b) }

// stillGPU compares the fields of a device that change only with news.
func stillGPU(a, b *api.GPU) bool {
	return a.ID == b.ID && a.Kind == b.Kind && a.Name == b.Name && a.UUID == b.UUID && a.TotalBytes == b.TotalBytes &&
		slices.Equal(a.Workers, b.Workers) && a.Unusable == b.Unusable
}

// movingGPU compares the figures of a device that move on their own.
func movingGPU(a, b *api.GPU) bool {
	return a.FreeBytes == b.FreeBytes && a.AllocatedBytes == b.AllocatedBytes && a.ReservedBytes == b.ReservedBytes &&
		samePtr(a.TemperatureC, b.TemperatureC, func(x, y int) bool { return x == y })
}

func stillWorker(a, b *api.Worker) bool {
	sameTime := func(x, y time.Time) bool { return x.Equal(y) }
	return a.WorkerID == b.WorkerID && a.LifecycleID == b.LifecycleID && a.ModelRef == b.ModelRef && a.GPUDevice == b.GPUDevice &&
		a.URI == b.URI && a.Status == b.Status && a.Reason == b.Reason && a.PID == b.PID &&
		samePtr(a.ExitCode, b.ExitCode, func(x, y int) bool { return x == y }) &&
		a.StartedAt.Equal(b.StartedAt) && samePtr(a.ReadyAt, b.ReadyAt, sameTime) && samePtr(a.StoppedAt, b.StoppedAt, sameTime) &&
		samePtr(a.LastUsedAt, b.LastUsedAt, sameTime) && a.IdleTimeoutMS == b.IdleTimeoutMS && a.ModelName == b.ModelName &&
		len(a.History) == 0 && len(b.History) == 0 && a.Transitions == b.Transitions && a.Pod == b.Pod && a.Node == b.Node
}

func movingWorker(a, b *api.Worker) bool {
	return a.InFlight == b.InFlight && a.VRAMBytes == b.VRAMBytes && slices.Equal(a.Devices, b.Devices)
}

func samePtr[T any](a, b *T, eq func(x, y T) bool) bool {
	if a == nil || b == nil {
		return a == b
	}
	return eq(*a, *b)
}

// sameRouting reports whether a and b are the same workers in what
// Generation follows.
func sameRouting(a, b []api.Worker) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := &a[i], &b[i]
		if x.WorkerID != y.WorkerID || x.LifecycleID != y.LifecycleID || x.ModelRef != y.ModelRef || x.URI != y.URI ||
			x.Status != y.Status {
			return false
		}
	}
	return true
}

// ServingPools calls fn with the id, status and workers of each pool that
// has a live worker of model, by id, without copying them: routing
// reads a thousand such pools when it makes a model's candidates. fn runs
// under the registry's locks: it must not keep workers nor call the
// registry.
func (r *Registry) ServingPools(model string, fn func(id string, status Status, workers []api.Worker)) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	for _, e := range r.byModel[model] {
		e.beat.Lock()
		fn(e.ID, e.Status, e.Workers)
		e.beat.Unlock()
	}
}

// ServingCount is the number of pools with a live worker of model.
func (r *Registry) ServingCount(model string) int {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return len(r.byModel[model])
}

// snapshot is e's pool when f selects it; the caller holds mu's read
// lock.
func (e *entry) snapshot(f Filter) (Pool, bool) {
	e.beat.Lock()
	defer e.beat.Unlock()
	if !f.match(&e.Pool) {
		return Pool{}, false
	}
	return e.lend(), true
}

// liveModels is the models of ws's live workers, each once.
func liveModels(ws []api.Worker) []string {
	var out []string
	for _, w := range ws {
		if w.ModelRef != "" && !lifecycle.State(w.Status).Terminal() && !slices.Contains(out, w.ModelRef) {
			out = append(out, w.ModelRef)
		}
	}
	return out
}

// sameModels reports whether models (distinct) is liveModels(ws), in any
// order, without building it: the few workers of a pool are compared
// directly, many through a set.
func sameModels(models []string, ws []api.Worker) bool {
	if len(ws) > 64 {
		got := liveModels(ws)
		if len(got) != len(models) {
			return false
		}
		want := make(map[string]bool, len(models))
		for _, m := range models {
			want[m] = true
		}
		for _, m := range got {
			if !want[m] {
				return false
			}
		}
		return true
	}
	seen := 0 // how many of models have a live worker
	for i, m := range models {
		for _, w := range ws {
			if w.ModelRef == m && !lifecycle.State(w.Status).Terminal() {
				seen++
				break
			}
		}
		if seen != i+1 {
			return false
		}
	}
	for _, w := range ws {
		if w.ModelRef != "" && !lifecycle.State(w.Status).Terminal() && !slices.Contains(models, w.ModelRef) {
			return false
		}
	}
	return seen == len(models)
}

// Get returns the pool id.
func (r *Registry) Get(id string) (Pool, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	e, ok := r.pools[id]
	if !ok {
		return Pool{}, false
	}
	return e.snapshot(Filter{})
}

// StatusOf is the status of pool id, without a snapshot of it.
func (r *Registry) StatusOf(id string) (Status, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	e, ok := r.pools[id]
	if !ok {
		return "", false
	}
	return e.Status, true
}

// Counts counts pools by status (every status present, zero or not).
func (r *Registry) Counts() map[Status]int {
	out := make(map[Status]int, len(Statuses))
	for _, s := range Statuses {
		out[s] = 0
	}
	r.mu.RLock()
	for _, e := range r.pools {
		out[e.Status]++
	}
	r.mu.RUnlock()
	return out
}
