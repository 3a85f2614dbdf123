package registry

import (
	"slices"

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

// Query returns the pools f selects, by id.
func (r *Registry) Query(f Filter) []Pool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	// Counted first: a narrow filter (the pools serving a model) must not
	// cost room for every pool, nor a wide one a growing slice.
	n := 0
	for _, e := range r.order {
		if f.match(&e.Pool) {
			n++
		}
	}
	out := make([]Pool, 0, n)
	for _, e := range r.order {
		if f.match(&e.Pool) {
			out = append(out, e.Pool)
		}
	}
	return out
}

// Get returns the pool id.
func (r *Registry) Get(id string) (Pool, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	e, ok := r.pools[id]
	if !ok {
		return Pool{}, false
	}
	return e.Pool, true
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
