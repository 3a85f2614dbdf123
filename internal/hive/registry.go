package hive

import (
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/gpu"
	"github.com/apiary-llm/apiary/internal/lifecycle"
)

type deviceInfo = gpu.Device

// recentMax is how many ended workers the registry remembers for
// GET /v2/workers?all=true and their logs.
const recentMax = 64

// registry is the hive's table of workers. Each worker's owner publishes
// its snapshot here; readers get copies. Spawning reserves a device's memory
// and a port under the same lock as the fit check, so two starts cannot
// both take the last gigabyte.
type registry struct {
	mu       sync.Mutex
	live     map[string]*worker // guarded by mu
	recent   []*worker          // guarded by mu; ended, oldest first
	ports    map[int]bool       // guarded by mu
	nextPort int                // guarded by mu
	// fixedPort, when set, is every worker's port (Kubernetes: each Pod
	// has its own IP); set before use.
	fixedPort int
	closing   bool      // guarded by mu
	leaks     leakMarks // guarded by mu
	// maxLoaded bounds the live workers (0: no bound); set before use.
	maxLoaded int
}

func newRegistry(portMin, maxLoaded int) *registry {
	return &registry{live: map[string]*worker{}, ports: map[int]bool{}, nextPort: portMin, maxLoaded: maxLoaded}
}

// heldLocked sums what the live workers hold on device id.
func (r *registry) heldLocked(id int) held {
	var h held
	for _, w := range r.live {
		for i, d := range w.devs() {
			if d.ID == id && i < len(w.hold) {
				h.allocated += w.hold[i].allocated
				h.reserved += w.hold[i].reserved
			}
		}
	}
	return h
}

// admit checks that w's estimate fits its device, binds a free port in
// [min, max] on host for it (w.listener, which the worker inherits: no
// other process can take the port between this check and the worker's
// start) and adds w as starting. It fails once the hive is closing.
func (r *registry) admit(w *worker, host string, portMin, portMax int) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closing {
		return ErrShuttingDown
	}
	if n := r.loadedLocked(); r.maxLoaded > 0 && n >= r.maxLoaded {
		return fmt.Errorf("%w: %d workers live (starting, running or stopping), --max-loaded %d; stop one first", ErrMaxLoaded, n, r.maxLoaded)
	}
	for i, d := range w.devs() {
		if err := checkFit(d, r.heldLocked(d.ID), w.share(i)); err != nil {
			return err
		}
	}
	if r.fixedPort > 0 {
		w.port = r.fixedPort
	} else {
		ln, port, err := r.takePortLocked(host, portMin, portMax)
		if err != nil {
			return err
		}
		w.port, w.listener = port, ln
	}
	w.hold = make([]held, len(w.devs()))
	for i := range w.hold {
		w.hold[i].reserved = w.share(i)
	}
	r.live[w.id] = w
	return nil
}

// adopt adds w, a worker a previous hive started (a Kubernetes Pod), as
// it is: no bound applies, it already runs.
func (r *registry) adopt(w *worker) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closing {
		return ErrShuttingDown
	}
	w.port = r.fixedPort
	w.hold = make([]held, len(w.devs()))
	r.live[w.id] = w
	return nil
}

// loadedLocked counts the workers --max-loaded bounds: those not ended (a
// worker that has ended leaves the table once its output is drained, a
// moment after the queen hears it stopped).
func (r *registry) loadedLocked() int {
	n := 0
	for _, w := range r.live {
		if !lifecycle.State(w.snap.Status).Terminal() {
			n++
		}
	}
	return n
}

// takePortLocked walks the range from where it last stopped and binds the
// first port no worker holds that is free.
func (r *registry) takePortLocked(host string, portMin, portMax int) (*net.TCPListener, int, error) {
	n := portMax - portMin + 1
	for range n {
		p := r.nextPort
		r.nextPort++
		if r.nextPort > portMax {
			r.nextPort = portMin
		}
		if r.ports[p] {
			continue
		}
		ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(p)))
		if err != nil {
			continue // in use by someone else: try the next
		}
		r.ports[p] = true
		return ln.(*net.TCPListener), p, nil
	}
	return nil, 0, fmt.Errorf("%w: %d-%d", ErrNoFreePort, portMin, portMax)
}

// publish stores a worker's snapshot and memory hold.
func (r *registry) publish(w *worker, snap api.Worker, h []held) {
	r.mu.Lock()
	defer r.mu.Unlock()
	w.snap = snap
	w.hold = h
}

// remove moves an ended worker out of the live table, freeing its port.
func (r *registry) remove(w *worker) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.live[w.id]; !ok {
		return
	}
	delete(r.live, w.id)
	delete(r.ports, w.port)
	w.closeListener()
	w.hold = nil
	r.recent = append(r.recent, w)
	if len(r.recent) > recentMax {
		r.recent = slices.Delete(r.recent, 0, len(r.recent)-recentMax)
	}
}

// get finds a live worker, or with ended also a recently ended one.
func (r *registry) get(id string, ended bool) (*worker, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if w, ok := r.live[id]; ok {
		return w, true
	}
	if ended {
		for _, w := range r.recent {
			if w.id == id {
				return w, true
			}
		}
	}
	return nil, false
}

// snapshot is a copy of one worker's published state.
func (r *registry) snapshot(w *worker) api.Worker {
	r.mu.Lock()
	defer r.mu.Unlock()
	return w.snap
}

// list returns the live workers' snapshots, and with ended the recently
// ended ones too, oldest spawn first.
func (r *registry) list(ended bool) []api.Worker {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.listLocked(ended)
}

// listLocked is list; a worker admitted but not spawned yet has no
// snapshot (publish) and is left out: it would be an entry without id.
func (r *registry) listLocked(ended bool) []api.Worker {
	out := make([]api.Worker, 0, len(r.live))
	for _, w := range r.live {
		if w.snap.WorkerID != "" {
			out = append(out, w.snap)
		}
	}
	if ended {
		for _, w := range r.recent {
			if w.snap.WorkerID != "" {
				out = append(out, w.snap)
			}
		}
	}
	slices.SortFunc(out, func(a, b api.Worker) int {
		if c := a.StartedAt.Compare(b.StartedAt); c != 0 {
			return c
		}
		return strings.Compare(a.WorkerID, b.WorkerID)
	})
	return out
}

// heartbeat lists the live workers without their histories and their own
// tokens by worker id, for the queen, in one look: every token is of a
// listed worker (the queen refuses a token for one it does not see, and
// stops that worker).
func (r *registry) heartbeat() ([]api.Worker, map[string]string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.listLocked(false)
	tokens := make(map[string]string, len(out))
	for i := range out {
		out[i] = out[i].Brief()
		if tok := r.live[out[i].WorkerID].token; tok != "" {
			tokens[out[i].WorkerID] = tok
		}
	}
	return out, tokens
}

// liveWorkers returns the live workers.
func (r *registry) liveWorkers() []*worker {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*worker, 0, len(r.live))
	for _, w := range r.live {
		out = append(out, w)
	}
	return out
}

// close refuses further admissions and returns the live workers.
func (r *registry) close() []*worker {
	r.mu.Lock()
	r.closing = true
	r.mu.Unlock()
	return r.liveWorkers()
}

// devices joins the inventory with what the hive's workers hold.
func (r *registry) devices(devs []gpu.Device) []api.GPU {
	r.mu.Lock()
	defer r.mu.Unlock()
	devs = r.withLeaksLocked(devs)
	out := make([]api.GPU, 0, len(devs))
	for _, d := range devs {
		h := r.heldLocked(d.ID)
		free := d.FreeBytes
		if d.Kind == gpu.KindCPU {
			// The machine's free memory need not show what the workers
			// hold within a --cpu-memory cap: the cap less theirs.
			free = min(free, d.TotalBytes-min(d.TotalBytes, h.total()))
		}
		g := api.GPU{
			ID: d.ID, Kind: d.Kind, Name: d.Name, UUID: d.UUID,
			TotalBytes: d.TotalBytes, FreeBytes: free, TemperatureC: d.TemperatureC,
			AllocatedBytes: h.allocated, ReservedBytes: h.reserved, Workers: []string{}, Unusable: d.Unusable,
		}
		for _, w := range r.live {
			if slices.ContainsFunc(w.devs(), func(wd gpu.Device) bool { return wd.ID == d.ID }) {
				g.Workers = append(g.Workers, w.id)
			}
		}
		slices.Sort(g.Workers)
		out = append(out, g)
	}
	return out
}
