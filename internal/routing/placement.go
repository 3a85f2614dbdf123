package routing

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/lifecycle"
	"github.com/apiary-llm/apiary/internal/registry"
)

// PlaceRequest is what a placement must satisfy, and what it knows.
type PlaceRequest struct {
	Model string
	Pool  string // the pool the worker must run on ("": any)
	GPU   *int   // a device the worker must run on
	// Pools are the only pools the model may run on (its pools in the
	// queen's model config); nil: any.
	Pools []string
	// Engine is the hive engine the model runs on ("": the built-in
	// one); only pools whose model list offers it are chosen.
	Engine string
	// Models holds the model list of every pool whose hive answered, by
	// pool id (the catalog).
	Models map[string]map[string]api.Model
	// Exclude names pools this placement must not use, with why (a hive
	// that refused the same start a moment ago).
	Exclude map[string]string
	// ExcludeDetail is, for a pool of Exclude, the reason in full (what
	// its hive said) when it says more than Exclude's words: the log and
	// the audit get it (Rejection.Detail).
	ExcludeDetail map[string]string
	// Apart says why a worker of Model may not share a device with one of
	// model other (the queen's groups); nil or "": it may.
	Apart func(other string) string
}

// Rejection is a pool a placement did not choose, and why.
type Rejection struct {
	PoolID string
	// Reason is why in words an API client may read: no file path,
	// address or lifecycle id.
	Reason string
	// Detail is the reason in full when it says more than Reason: with
	// what a hive said (a device's trouble, which may name a library's
	// path). The log, the audit and the operator see it, API clients do
	// not. "": Reason says it all.
	Detail string
}

// full is the reason in full.
func (r Rejection) full() string {
	if r.Detail == "" {
		return r.Reason
	}
	return r.Detail
}

// Decision is a placement: the pool and device chosen, and every other
// pool with the reason it was not.
type Decision struct {
	Pool registry.Pool
	GPU  int // the device chosen; of a split, the first of GPUs
	// GPUs are, when the model fits no one device of the pool, the GPUs
	// of the pool it is split over (the fewest that hold it, the roomiest
	// first), and Shares its share of NeedBytes on each, in proportion to
	// their free memory (llama.cpp's layer split); nil: GPU alone.
	GPUs      []int
	Shares    []uint64
	FreeBytes uint64 // its free memory (of a split, the GPUs' together)
	NeedBytes uint64 // the model's size: the least it needs
	Rejected  []Rejection
}

// Devices are every device the decision uses: GPUs, or GPU.
func (d Decision) Devices() []int {
	if len(d.GPUs) > 0 {
		return d.GPUs
	}
	return []int{d.GPU}
}

// AuditMeta is the decision as the audit entry of the start shows it.
func (d Decision) AuditMeta() map[string]any {
	m := map[string]any{"pool_id": d.Pool.ID, "gpu_device": d.GPU, "free_bytes": d.FreeBytes, "need_bytes": d.NeedBytes,
		"rejected": rejectedMeta(d.Rejected)}
	if len(d.GPUs) > 0 {
		m["gpu_devices"] = d.GPUs
		m["share_bytes"] = d.Shares
	}
	return m
}

func rejectedMeta(rs []Rejection) map[string]any {
	out := make(map[string]any, len(rs))
	for _, r := range rs {
		out[r.PoolID] = r.full()
	}
	return out
}

// PlacementError is a placement that found no pool; it wraps ErrNoPool.
type PlacementError struct {
	Model    string
	Rejected []Rejection
}

// maxReasons bounds the pools an error message names (a fleet has
// thousands); the audit entry of the placement has every one.
const maxReasons = 8

func (e *PlacementError) Error() string { return e.text(Rejection.full) }

// PublicMessage is the error in words for API clients: each pool's
// reason without the hives' details.
func (e *PlacementError) PublicMessage() string {
	return e.text(func(r Rejection) string { return r.Reason })
}

func (e *PlacementError) text(reason func(Rejection) string) string {
	if len(e.Rejected) == 0 {
		return fmt.Sprintf("no pool can run %s: no hive has registered", e.Model)
	}
	parts := make([]string, 0, min(len(e.Rejected), maxReasons)+1)
	for _, r := range e.Rejected[:min(len(e.Rejected), maxReasons)] {
		parts = append(parts, r.PoolID+": "+reason(r))
	}
	if n := len(e.Rejected) - maxReasons; n > 0 {
		parts = append(parts, fmt.Sprintf("and %d more pools", n))
	}
	return fmt.Sprintf("no pool can run %s (%s)", e.Model, strings.Join(parts, "; "))
}

func (e *PlacementError) Unwrap() error { return ErrNoPool }

// Placer picks the pool and device a new worker goes to. It is pure: it
// decides from the pools and the request it is given.
type Placer interface {
	Place(pools []registry.Pool, req PlaceRequest) (Decision, error)
}

// MostFreeMemory is the default placement: among the healthy pools
// whose hive has the model, the one with a device where the model fits
// and that has the most free memory; a GPU where it fits comes before any
// node's CPU (a GPU node offers its CPU too, with more memory than any
// GPU); ties go to the smaller pool id, then the smaller device id. The model fits a device whose free memory is at
// least what it needs: the hive's estimate (weights, KV cache, buffers at
// its context size) from its model list, never less than the GGUF's size
// (the hive checks the estimate for the start's own context and refuses
// a start that does not fit; the controller then places again without
// that pool). Every pool not chosen gets a reason.
type MostFreeMemory struct{}

// Place implements Placer.
func (MostFreeMemory) Place(pools []registry.Pool, req PlaceRequest) (Decision, error) {
	type fit struct {
		pool   registry.Pool
		gpu    int
		gpus   []int // a split over several GPUs; nil: gpu alone
		shares []uint64
		free   uint64
		onGPU  bool // the device is a GPU, not the node's CPU
	}
	// better ranks fits: a GPU before the CPU, one GPU before a split,
	// a split over fewer GPUs before more, then more free memory, then
	// the smaller pool id.
	better := func(a, b fit) bool {
		switch {
		case a.onGPU != b.onGPU:
			return a.onGPU
		case len(a.gpus) != len(b.gpus):
			return len(a.gpus) < len(b.gpus)
		case a.free != b.free:
			return a.free > b.free
		}
		return a.pool.ID < b.pool.ID
	}
	var fits []fit
	var rejected []Rejection
	var need uint64
	for _, p := range pools {
		if m, ok := req.Models[p.ID][req.Model]; ok && m.SizeBytes > 0 {
			need = modelNeed(m)
			break
		}
	}
	for _, p := range pools {
		reject := func(format string, a ...any) {
			rejected = append(rejected, Rejection{PoolID: p.ID, Reason: fmt.Sprintf(format, a...)})
		}
		if req.Pool != "" && p.ID != req.Pool {
			reject("the request is pinned to pool %s", req.Pool)
			continue
		}
		if req.Pools != nil && !slices.Contains(req.Pools, p.ID) {
			reject("model %s may run only on pools %s (its pools in the queen's config)", req.Model, strings.Join(req.Pools, ", "))
			continue
		}
		if p.Status != registry.Healthy {
			reject("pool is %s", p.Status)
			continue
		}
		if why, ok := req.Exclude[p.ID]; ok {
			rejected = append(rejected, Rejection{PoolID: p.ID, Reason: why, Detail: req.ExcludeDetail[p.ID]})
			continue
		}
		models, known := req.Models[p.ID]
		if !known {
			reject("its model list is not known (the hive has not answered GET /v2/models)")
			continue
		}
		m, ok := models[req.Model]
		if !ok {
			reject("does not have model %s", req.Model)
			continue
		}
		if !hasEngine(m, req.Engine) {
			reject("has no engine %s (its hive declares %s)", req.Engine, strings.Join(engines(m), ", "))
			continue
		}
		if n := loaded(p); p.MaxLoaded > 0 && n >= p.MaxLoaded {
			reject("runs %d workers, its hive's --max-loaded", n)
			continue
		}
		size := modelNeed(m)
		best, bestFree, bestGPU, found := 0, uint64(0), false, false
		var roomiest api.GPU
		seen := false
		var unusable, trouble []string
		var gpus []api.GPU // the usable GPUs, with their free memory now
		for _, g := range p.GPUs {
			if req.GPU != nil && g.ID != *req.GPU {
				continue
			}
			if g.Unusable != "" {
				unusable = append(unusable, fmt.Sprintf("device %d is unusable", g.ID))
				trouble = append(trouble, fmt.Sprintf("device %d is unusable: %s", g.ID, g.Unusable))
				continue
			}
			if why := apartOn(p, g.ID, req.Apart); why != "" {
				unusable = append(unusable, fmt.Sprintf("device %d runs %s", g.ID, why))
				continue
			}
			g.FreeBytes = deviceFree(p, g, models)
			if !seen || g.FreeBytes > roomiest.FreeBytes {
				roomiest = g
			}
			seen = true
			onGPU := g.Kind != api.DeviceCPU
			if onGPU {
				gpus = append(gpus, g)
			}
			if g.FreeBytes >= size && (!found || onGPU && !bestGPU ||
				onGPU == bestGPU && (g.FreeBytes > bestFree || (g.FreeBytes == bestFree && g.ID < best))) {
				best, bestFree, bestGPU, found = g.ID, g.FreeBytes, onGPU, true
			}
		}
		switch {
		case !seen && len(unusable) > 0:
			rejected = append(rejected, Rejection{PoolID: p.ID, Reason: strings.Join(unusable, "; "), Detail: strings.Join(trouble, "; ")})
		case !seen && req.GPU != nil:
			reject("has no device %d", *req.GPU)
		case !seen:
			reject("reports no devices")
		case (!found || !bestGPU) && req.GPU == nil && len(gpus) >= 2:
			// No one device holds it (or the CPU only): the fewest GPUs
			// that hold it together.
			if ids, shares, free, ok := splitFit(gpus, size); ok {
				fits = append(fits, fit{pool: p, gpu: ids[0], gpus: ids, shares: shares, free: free, onGPU: true})
				continue
			}
			if found {
				fits = append(fits, fit{pool: p, gpu: best, free: bestFree, onGPU: bestGPU})
				continue
			}
			reject("no device has room for %s (%s): the roomiest, device %d, has %s free%s", req.Model, api.FormatBytes(size), roomiest.ID,
				api.FormatBytes(roomiest.FreeBytes), gpusFree(gpus))
		case !found:
			reject("no device has room for %s (%s): the roomiest, device %d, has %s free", req.Model, api.FormatBytes(size), roomiest.ID, api.FormatBytes(roomiest.FreeBytes))
		default:
			fits = append(fits, fit{pool: p, gpu: best, free: bestFree, onGPU: bestGPU})
		}
	}
	if len(fits) == 0 {
		return Decision{}, &PlacementError{Model: req.Model, Rejected: rejected}
	}
	win := fits[0]
	for _, f := range fits[1:] {
		if better(f, win) {
			win = f
		}
	}
	for _, f := range fits {
		switch {
		case f.pool.ID == win.pool.ID:
		case len(f.gpus) > len(win.gpus) && win.onGPU:
			rejected = append(rejected, Rejection{PoolID: f.pool.ID, Reason: fmt.Sprintf("fits only split over %d GPUs (%s); %s holds it on fewer (%s)",
				len(f.gpus), intList(f.gpus), win.pool.ID, intList(Decision{GPU: win.gpu, GPUs: win.gpus}.Devices()))})
		case win.onGPU && !f.onGPU:
			rejected = append(rejected, Rejection{PoolID: f.pool.ID, Reason: fmt.Sprintf("fits on device %d with %s free, its CPU; %s has a GPU where it fits (device %d)",
				f.gpu, api.FormatBytes(f.free), win.pool.ID, win.gpu)})
		default:
			rejected = append(rejected, Rejection{PoolID: f.pool.ID, Reason: fmt.Sprintf("fits on device %d with %s free; %s has more (%s on device %d, ties go to the smaller id)",
				f.gpu, api.FormatBytes(f.free), win.pool.ID, api.FormatBytes(win.free), win.gpu)})
		}
	}
	return Decision{Pool: win.pool, GPU: win.gpu, GPUs: win.gpus, Shares: win.shares, FreeBytes: win.free, NeedBytes: need, Rejected: rejected}, nil
}

// splitFit finds the fewest GPUs of gpus (their free memory now) that
// hold size together, at least two, the roomiest first (ties: the
// smaller id), and each one's share of size in proportion to its free
// memory, as llama.cpp's layer split divides it: every share fits its
// GPU when size fits their sum. ok is false when all of them together
// cannot hold it.
func splitFit(gpus []api.GPU, size uint64) (ids []int, shares []uint64, free uint64, ok bool) {
	gpus = slices.Clone(gpus)
	slices.SortFunc(gpus, func(a, b api.GPU) int {
		if a.FreeBytes != b.FreeBytes {
			if a.FreeBytes > b.FreeBytes {
				return -1
			}
			return 1
		}
		return a.ID - b.ID
	})
	for i, g := range gpus {
		free += g.FreeBytes
		if i == 0 || free < size {
			continue
		}
		avail := make([]uint64, i+1)
		for j, g := range gpus[:i+1] {
			ids = append(ids, g.ID)
			avail[j] = g.FreeBytes
		}
		return ids, api.SplitShares(size, avail), free, true
	}
	return nil, nil, 0, false
}

// gpusFree says, for a pool of more than one GPU, what they have free
// together: a split over all of them would not hold the model either.
func gpusFree(gpus []api.GPU) string {
	if len(gpus) < 2 {
		return ""
	}
	var sum uint64
	for _, g := range gpus {
		sum += g.FreeBytes
	}
	return fmt.Sprintf(", its %d GPUs %s together", len(gpus), api.FormatBytes(sum))
}

// intList is ns comma-separated.
func intList(ns []int) string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = fmt.Sprint(n)
	}
	return strings.Join(s, ",")
}

// deviceFree is the memory device g of pool p has free as the queen
// knows it now. The hive's last reading is up to a heartbeat old: a worker
// that was starting then (its estimate reserved) may be ready now with
// less, one that ran may have stopped. So what the reading shows held by
// anything but the hive's workers (another process on a GPU) is kept, and
// the workers' share is taken from p.Workers as it is now: what each
// reports holding, or for one still starting its model's estimate (from
// models, the pool's model list).
func deviceFree(p registry.Pool, g api.GPU, models map[string]api.Model) uint64 {
	return freeOn(p, g, models, false)
}

// heldBy is the memory worker w holds on device id, or will once loaded:
// what it reported there (of a split worker, its part), else (starting,
// or placed and not listed yet) its model's need from the pool's model
// list.
func heldBy(w api.Worker, id int, models map[string]api.Model) uint64 {
	if b, _ := w.On(id); b > 0 {
		return b
	}
	if m, ok := models[w.ModelRef]; ok {
		return modelNeed(m)
	}
	return 0
}

// freeOn is deviceFree; with stoppingGone, the workers stopping (draining)
// count as gone: their memory is coming back.
func freeOn(p registry.Pool, g api.GPU, models map[string]api.Model, stoppingGone bool) uint64 {
	gone := func(w api.Worker) bool {
		_, on := w.On(g.ID)
		// A worker in an ended state holds nothing, whether or not the
		// pool's list has its stop time yet (a stop event may come
		// without it: it counted twice its memory in a swap under load).
		return !on || !live(w) || stoppingGone && lifecycle.State(w.Status) == lifecycle.Draining
	}
	if g.TotalBytes == 0 {
		free := g.FreeBytes // no total reported: the reading is all there is
		for _, w := range p.Workers {
			if b, on := w.On(g.ID); stoppingGone && on && w.StoppedAt == nil && lifecycle.State(w.Status) == lifecycle.Draining {
				free += b
			}
		}
		return free
	}
	var foreign uint64
	if used := g.FreeBytes + g.AllocatedBytes + g.ReservedBytes; used < g.TotalBytes {
		foreign = g.TotalBytes - used
	}
	held := foreign
	for _, w := range p.Workers {
		if gone(w) {
			continue
		}
		held += heldBy(w, g.ID, models)
	}
	if held >= g.TotalBytes {
		return 0
	}
	return g.TotalBytes - held
}

// loaded is how many workers pool p runs: every one not ended, those
// still starting or stopping too (they hold memory).
func loaded(p registry.Pool) int {
	n := 0
	for _, w := range p.Workers {
		if live(w) {
			n++
		}
	}
	return n
}

// live says whether a worker of a pool's list holds its device: not ended.
func live(w api.Worker) bool {
	return w.StoppedAt == nil && !lifecycle.State(w.Status).Terminal()
}

// apartOn says why the worker a placement is for may not go on device gpu
// of p: a worker there whose model apart keeps away; "" when none.
func apartOn(p registry.Pool, gpu int, apart func(string) string) string {
	if apart == nil {
		return ""
	}
	for _, w := range p.Workers {
		if _, on := w.On(gpu); on && live(w) {
			if why := apart(w.ModelRef); why != "" {
				return fmt.Sprintf("a worker of %s (%s)", w.ModelRef, why)
			}
		}
	}
	return ""
}

// modelNeed is the memory a worker of m needs: the hive's estimate when
// it gives one (weights, KV cache, buffers), never less than the file.
func modelNeed(m api.Model) uint64 {
	return uint64(max(m.SizeBytes, m.EstimateBytes, 0))
}

// hasEngine says whether a pool's model entry offers engine ("": the
// built-in one, which every hive has).
func hasEngine(m api.Model, engine string) bool {
	return engine == "" || engine == builtinEngine || slices.Contains(m.Engines, engine)
}

// engines is what a model entry offers: a hive that names none has only
// the built-in engine.
func engines(m api.Model) []string {
	if len(m.Engines) == 0 {
		return []string{builtinEngine}
	}
	return m.Engines
}

// builtinEngine is the engine every hive has.
const builtinEngine = "builtin"

// unplaceable says why no pool can take a new worker of req.Model now,
// from the pools and the model lists as they are known (no hive is
// asked): the placer's error, naming each pool's reason. It is nil when a
// pool can take one, or may: a pool the placer could use whose model
// list is not known yet (the placement itself reads it).
func unplaceable(placer Placer, pools []registry.Pool, req PlaceRequest) error {
	if req.Pool != "" {
		// Pinned: the one pool's reason, not every other pool's "pinned".
		pools = slices.DeleteFunc(slices.Clone(pools), func(p registry.Pool) bool { return p.ID != req.Pool })
		if len(pools) == 0 {
			return &PlacementError{Model: req.Model, Rejected: []Rejection{{PoolID: req.Pool, Reason: "pool is not registered"}}}
		}
	}
	for _, p := range pools {
		_, excluded := req.Exclude[p.ID]
		allowed := req.Pools == nil || slices.Contains(req.Pools, p.ID)
		if p.Status == registry.Healthy && (req.Pool == "" || p.ID == req.Pool) && allowed && !excluded && req.Models[p.ID] == nil {
			return nil
		}
	}
	_, err := placer.Place(pools, req)
	return err
}

// placementRejections returns the pools a failed placement rejected.
func placementRejections(err error) []Rejection {
	var pe *PlacementError
	if errors.As(err, &pe) {
		return pe.Rejected
	}
	return nil
}
