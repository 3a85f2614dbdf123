package routing

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/lifecycle"
	"github.com/apiary-llm/apiary/internal/modelconfig"
	"github.com/apiary-llm/apiary/internal/openai"
	"github.com/apiary-llm/apiary/internal/registry"
	"github.com/apiary-llm/apiary/internal/store"
)

// evictionCase is one pool "a" with a 10 GiB device: idle workers of x
// (4 GiB, used an hour ago) and y (4 GiB, used a minute ago), a busy one
// of z (1 GiB); model m needs 5 GiB, so 1 GiB is free.
func evictionCase(t *testing.T, config string, change func(p *registry.Pool)) *Service {
	t.Helper()
	const gib = 1 << 30
	ready := time.Now().Add(-time.Hour)
	worker := func(id, model, status string, bytes uint64) api.Worker {
		return api.Worker{WorkerID: id, LifecycleID: "wk-" + id, ModelRef: model, Status: status, VRAMBytes: bytes, ReadyAt: &ready}
	}
	cp := newRowsPlane(nil, false)
	cp.pool.GPUs = []api.GPU{{ID: 0, Kind: api.DeviceCPU, TotalBytes: 10 * gib, FreeBytes: 1 * gib, AllocatedBytes: 9 * gib}}
	cp.pool.Workers = []api.Worker{worker("x1", "x", "ready", 4*gib), worker("y1", "y", "ready", 4*gib), worker("z1", "z", "busy", 1*gib)}
	if change != nil {
		change(&cp.pool)
	}
	for _, w := range cp.pool.Workers {
		cp.rows[w.LifecycleID] = store.Row{ID: w.LifecycleID, PoolID: "a", ModelRef: w.ModelRef, Status: lifecycle.StatusRunning}
	}
	models := []api.Model{{Ref: "m", SizeBytes: 5 * gib}, {Ref: "x", SizeBytes: 4 * gib}, {Ref: "y", SizeBytes: 4 * gib}, {Ref: "z", SizeBytes: gib}}
	s, err := New(Config{Logger: slog.New(slog.DiscardHandler), Models: &listHive{models: map[string][]api.Model{"http://a": models}}}, cp)
	if err != nil {
		t.Fatal(err)
	}
	if config != "" {
		f, err := modelconfig.Parse([]byte(config))
		if err != nil {
			t.Fatal(err)
		}
		s.models.Store(f)
	}
	s.catalog.ensure(t.Context(), []registry.Pool{cp.pool}, "m")
	s.router.lastUsed[WorkerKey{"a", "x1"}] = time.Now().Add(-time.Hour)
	s.router.lastUsed[WorkerKey{"a", "y1"}] = time.Now().Add(-time.Minute)
	return s
}

func victims(ev eviction) []string {
	var out []string
	for _, v := range ev.victims {
		out = append(out, v.key.Worker)
	}
	return out
}

// TestPlanEviction: the fewest idle workers, least recently used first;
// never a busy, pinned or young one, nor one whose model has requests
// waiting; everything the groups keep apart; more for --max-loaded.
func TestPlanEviction(t *testing.T) {
	const models = "models:\n  m: {}\n  x: {}\n  y: {}\n  z: {}\n"
	for _, tc := range []struct {
		name    string
		config  string
		change  func(p *registry.Pool)
		prepare func(s *Service)
		want    []string // nil: no plan
		patient []string // with busy and young ones too (nil: no plan)
	}{
		{name: "least recently used", want: []string{"x1"}, patient: []string{"x1"}},
		{name: "two when one is not enough", change: func(p *registry.Pool) { p.GPUs[0].TotalBytes -= 1 << 30; p.GPUs[0].FreeBytes = 0 },
			want: []string{"x1", "y1"}, patient: []string{"x1", "y1"}},
		{name: "pinned", config: "models:\n  m: {}\n  x: {pin: true}\n", want: []string{"y1"}, patient: []string{"y1"}},
		{name: "all pinned", config: "models:\n  m: {}\n  x: {pin: true}\n  y: {pin: true}\n"},
		{name: "its model's requests wait", prepare: func(s *Service) { s.router.queues[target{model: "x"}] = []*waiter{{}} },
			want: []string{"y1"}, patient: []string{"y1"}},
		{name: "in flight through the queen", prepare: func(s *Service) { n := 1; s.router.inflight[WorkerKey{"a", "x1"}] = &n },
			want: []string{"y1"}, patient: []string{"y1"}},
		{name: "exclusive group takes the busy one too", config: models + "groups:\n  solo:\n    models: [m]\n    exclusive: true\n",
			patient: []string{"x1", "y1", "z1"}},
		{name: "other group", config: models + "groups:\n  g1:\n    models: [m]\n  g2:\n    models: [y]\n",
			want: []string{"y1"}, patient: []string{"y1"}},
		{name: "max loaded", change: func(p *registry.Pool) {
			p.MaxLoaded = 2
			p.GPUs[0].TotalBytes += 100 << 30
			p.GPUs[0].FreeBytes += 100 << 30
		},
			want: []string{"x1", "y1"}, patient: []string{"x1", "y1"}},
		{name: "a starting one is waited for", change: func(p *registry.Pool) { p.Workers[0].Status, p.Workers[1].Status = "starting", "starting" },
			patient: []string{"z1", "x1"}},
		{name: "stopping ones count as gone", change: func(p *registry.Pool) { p.Workers[0].Status, p.Workers[1].Status = "draining", "draining" },
			want: []string{}, patient: []string{}},
		{name: "young on a device that thrashes", change: loadedLately(3 * time.Second), prepare: thrashing(2),
			patient: []string{"z1", "x1"}},
		{name: "young on a calm device", change: loadedLately(3 * time.Second), prepare: thrashing(1),
			want: []string{"x1"}, patient: []string{"x1"}},
		{name: "old enough on a device that thrashes", change: loadedLately(time.Second), prepare: thrashing(2),
			want: []string{"x1"}, patient: []string{"x1"}},
		{name: "a quick load kept for --min-residency", change: loadedLately(time.Second), prepare: func(s *Service) {
			thrashing(2)(s)
			s.cfg.MinResidency = 10 * time.Second
		}, patient: []string{"z1", "x1"}},
		{name: "never past half the swap wait", change: loadedLately(time.Hour), prepare: func(s *Service) {
			thrashing(2)(s)
			s.cfg.SwapWait = 3 * time.Second
		}, want: []string{"x1"}, patient: []string{"x1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := evictionCase(t, tc.config, tc.change)
			if tc.prepare != nil {
				tc.prepare(s)
			}
			for _, patient := range []bool{false, true} {
				want := tc.want
				if patient {
					want = tc.patient
				}
				ev, ok := s.planEviction("m", "", 5<<30, patient)
				switch {
				case want == nil && ok:
					t.Errorf("patient %v: plan %v, want none", patient, victims(ev))
				case want != nil && !ok:
					t.Errorf("patient %v: no plan, want %v", patient, want)
				case ok && !slices.Equal(append([]string{}, victims(ev)...), want):
					t.Errorf("patient %v: plan %v, want %v", patient, victims(ev), want)
				}
			}
		})
	}
}

// TestPlacementKeepsLimits: a pool at its --max-loaded takes no worker;
// a device running a model the groups keep apart is passed over.
func TestPlacementKeepsLimits(t *testing.T) {
	const gib = 1 << 30
	models := map[string]map[string]api.Model{"a": {"m": {Ref: "m", SizeBytes: gib}}}
	pool := registry.Pool{ID: "a", Status: registry.Healthy, MaxLoaded: 1,
		GPUs:    []api.GPU{{ID: 0, Kind: "cuda", TotalBytes: 80 * gib, FreeBytes: 70 * gib}, {ID: 1, Kind: "cuda", TotalBytes: 24 * gib, FreeBytes: 20 * gib}},
		Workers: []api.Worker{{WorkerID: "w", ModelRef: "big", GPUDevice: 0, Status: string(lifecycle.Ready), VRAMBytes: 10 * gib}}}
	_, err := MostFreeMemory{}.Place([]registry.Pool{pool}, PlaceRequest{Model: "m", Models: models})
	if err == nil || !strings.Contains(err.Error(), "runs 1 workers, its hive's --max-loaded") {
		t.Errorf("at --max-loaded: %v", err)
	}
	pool.MaxLoaded = 0
	d, err := MostFreeMemory{}.Place([]registry.Pool{pool}, PlaceRequest{Model: "m", Models: models})
	if err != nil || d.GPU != 0 {
		t.Errorf("no limits: device %d, %v; want the roomiest, 0", d.GPU, err)
	}
	apart := func(other string) string {
		if other == "big" {
			return "they are in two groups"
		}
		return ""
	}
	d, err = MostFreeMemory{}.Place([]registry.Pool{pool}, PlaceRequest{Model: "m", Models: models, Apart: apart})
	if err != nil || d.GPU != 1 {
		t.Errorf("groups: device %d, %v; want 1, away from big", d.GPU, err)
	}
	one := 0
	_, err = MostFreeMemory{}.Place([]registry.Pool{pool}, PlaceRequest{Model: "m", Models: models, Apart: apart, GPU: &one})
	if err == nil || !strings.Contains(err.Error(), "device 0 runs a worker of big (they are in two groups)") {
		t.Errorf("groups on device 0 only: %v", err)
	}
	pool.Workers[0].Status = string(lifecycle.Stopped)
	if _, err = (MostFreeMemory{}).Place([]registry.Pool{pool}, PlaceRequest{Model: "m", Models: models, Apart: apart, GPU: &one}); err != nil {
		t.Errorf("an ended worker keeps nothing apart: %v", err)
	}
}

// loadedLately makes x1 and y1 ready 2s ago after a load of load.
func loadedLately(load time.Duration) func(p *registry.Pool) {
	return func(p *registry.Pool) {
		ready := time.Now().Add(-2 * time.Second)
		for i := range p.Workers {
			p.Workers[i].ReadyAt, p.Workers[i].StartedAt = &ready, ready.Add(-load)
		}
	}
}

// thrashing records n eviction rounds on pool a's device 0 just now.
func thrashing(n int) func(s *Service) {
	return func(s *Service) {
		for range n {
			s.evictions.add("a", 0, time.Now(), nil)
		}
	}
}

// runningPlane is a rowsPlane whose Running reads the rows, as the queen's
// does (an eviction's stop written: the row is no longer RUNNING).
type runningPlane struct{ *rowsPlane }

func (p runningPlane) Running(_, lifecycleID, _ string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.rows[lifecycleID].Status == lifecycle.StatusRunning
}

// takeRoom is evict's first step, under placeMu as there: plan, claim the
// victims off routing, reserve the room.
func takeRoom(t *testing.T, s *Service, model string) []string {
	t.Helper()
	s.placeMu.Lock()
	defer s.placeMu.Unlock()
	ev, ok := s.planEviction(model, "", s.needOf(model), false)
	if !ok {
		return nil
	}
	if !s.router.claimIdle(ev.victims) {
		t.Fatalf("victims %v not claimed", victims(ev))
	}
	s.ledger.reserve(model, ev.pool, ev.gpu, time.Now())
	s.ledger.evict(ev.victims, model, time.Now())
	return victims(ev)
}

// TestPlanEvictionSeesPending: a plan made while another eviction's
// victim still shows ready in the pool's list (its stop not yet seen) and
// the room it made is reserved for its model takes another worker, never
// the same one, and counts the reserved room as taken; a victim is off
// routing until its stop is written; a reservation the pool lists is
// dropped.
func TestPlanEvictionSeesPending(t *testing.T) {
	s := evictionCase(t, "", nil)
	if got := takeRoom(t, s, "m"); !slices.Equal(got, []string{"x1"}) {
		t.Fatalf("first plan %v, want [x1]", got)
	}
	// x1 (4 GiB) leaves, but its room and the 1 GiB free go to m (5
	// GiB): z (1 GiB) needs y1's room.
	if got := takeRoom(t, s, "z"); !slices.Equal(got, []string{"y1"}) {
		t.Errorf("plan for z %v, want [y1]: x1 is taken, its room reserved", got)
	}
	// Even z1 gone leaves 4 GiB: x1's and y1's rooms are reserved.
	if ev, ok := s.planEviction("m", "", 5<<30, false); ok {
		t.Errorf("another plan for m: %v, want none", victims(ev))
	}
	// A patient plan waits for z's worker, placed and not listed yet: it
	// holds y1's room (z's need) once loaded, and may go once it served
	// (the queen's controller then waits rather than refuse). Never x1 or
	// y1 again.
	if ev, ok := s.planEviction("m", "", 5<<30, true); !ok || len(ev.victims) != 2 || victims(ev)[0] != "z1" ||
		!strings.HasPrefix(victims(ev)[1], "placing-") {
		t.Errorf("a patient plan for m: %v (%v), want z1 and z's placed worker", victims(ev), ok)
	}
	cands := s.router.usableLocked([]Candidate{{Key: WorkerKey{"a", "x1"}}, {Key: WorkerKey{"a", "y1"}}, {Key: WorkerKey{"a", "z1"}}}, time.Now())
	if len(cands) != 1 || cands[0].Key.Worker != "z1" {
		t.Errorf("candidates while x1 and y1 are evicted: %v, want z1 alone", cands)
	}

	// The pool lists x1 draining and the first m's worker: the ledger
	// drops both.
	p := s.cp.Pools(registry.Filter{})[0]
	cp := s.cp.(*rowsPlane)
	cp.pool.Workers[0].Status = string(lifecycle.Draining)
	s.ledger.mu.Lock()
	var first *reservation
	for _, r := range s.ledger.starts {
		if first == nil || r.id < first.id {
			first = r
		}
	}
	s.ledger.mu.Unlock()
	s.ledger.started(first, "wk-m1")
	cp.pool.Workers = append(cp.pool.Workers, api.Worker{WorkerID: "m1", LifecycleID: "wk-m1", ModelRef: "m", Status: "starting"})
	view := s.pools(registry.Filter{}, nil)[0]
	if len(s.ledger.starts) != 1 || s.ledger.evicted(WorkerKey{"a", "x1"}) || !s.ledger.evicted(WorkerKey{"a", "y1"}) {
		t.Errorf("ledger after the pool lists x1 draining and m1: %d reservations, stops %v; want z's and y1", len(s.ledger.starts), s.ledger.stops)
	}
	if len(view.Workers) != len(p.Workers)+2 || view.Workers[1].Status != string(lifecycle.Draining) {
		t.Errorf("view %+v: want the pool's workers (y1 draining), m1, and z's reservation", view.Workers)
	}
}

// TestConcurrentEvictionsTakeEachWorkerOnce: evictions for two models at
// once stop each worker at most once, and never a model's workers below
// its min_workers (x keeps one of x1, x2).
func TestConcurrentEvictionsTakeEachWorkerOnce(t *testing.T) {
	ready := time.Now().Add(-time.Hour)
	s := evictionCase(t, "models:\n  m: {}\n  n: {}\n  x: {min_workers: 1}\n  y: {}\n  z: {}\n", func(p *registry.Pool) {
		p.Workers = append(p.Workers, api.Worker{WorkerID: "x2", LifecycleID: "wk-x2", ModelRef: "x", Status: "ready", VRAMBytes: 4 << 30, ReadyAt: &ready})
		p.GPUs[0].TotalBytes += 4 << 30
	})
	cp := s.cp.(*rowsPlane)
	cp.replicas = map[string]Replica{"x": {Min: 1}}
	s.cp = runningPlane{cp}
	s.cfg.EvictWait = 10 * time.Millisecond // the fake pool never gives the room back
	var wg sync.WaitGroup
	for _, model := range []string{"m", "m", "m"} {
		wg.Go(func() { s.ctl.evict(t.Context(), model, "") })
	}
	wg.Wait()
	seen := map[string]int{}
	for _, id := range cp.evicted {
		if seen[id]++; seen[id] > 1 {
			t.Errorf("%s evicted twice: %v", id, cp.evicted)
		}
	}
	if seen["wk-x1"]+seen["wk-x2"] > 1 {
		t.Errorf("evicted %v: x's min_workers 1 keeps one of x1, x2", cp.evicted)
	}
	if len(cp.evicted) != 2 {
		t.Errorf("evicted %v, want two (one of x, and y)", cp.evicted)
	}
}

// TestHiveBusyReportOlderThanTheQueensLastRequest: a worker its hive
// reports busy is idle for eviction once the queen's own last request on
// it ended after placement first saw the report, and none is in flight;
// not before.
func TestHiveBusyReportOlderThanTheQueensLastRequest(t *testing.T) {
	s := evictionCase(t, "models:\n  m: {}\n  x: {pin: true}\n  y: {pin: true}\n  z: {}\n", func(p *registry.Pool) {
		p.Workers[2].VRAMBytes = 4 << 30
		p.GPUs[0].TotalBytes += 3 << 30
		p.GPUs[0].AllocatedBytes += 3 << 30
	})
	z := WorkerKey{"a", "z1"}
	s.router.lastUsed[z] = time.Now().Add(-time.Hour)
	if ev, ok := s.planEviction("m", "", 5<<30, false); ok {
		t.Fatalf("plan %v while z1 is reported busy and the queen's last request on it ended before", victims(ev))
	}
	s.router.lastUsed[z] = time.Now()
	ev, ok := s.planEviction("m", "", 5<<30, false)
	if !ok || !slices.Equal(victims(ev), []string{"z1"}) {
		t.Errorf("plan %v, %v after the queen's last request on z1 ended: want [z1]", victims(ev), ok)
	}
	n := 1
	s.router.inflight[z] = &n
	if ev, ok := s.planEviction("m", "", 5<<30, false); ok {
		t.Errorf("plan %v with a request of the queen's in flight on z1", victims(ev))
	}
}

// Unload refuses 409 a model the config pins (model_pinned) or keeps
// running (min_workers: model_kept), saying why by its name, and stops no
// worker.
func TestUnloadRefusesWhatTheConfigKeeps(t *testing.T) {
	s := evictionCase(t, "models:\n  m: {}\n  x: {pin: true}\n  y: {}\n  z: {}\n", nil)
	cp := s.cp.(*rowsPlane)
	cp.replicas = map[string]Replica{"y": {Min: 1}}
	var stopped []string
	stop := func(_ context.Context, id string) error { stopped = append(stopped, id); return nil }
	for _, c := range []struct{ model, code, says string }{
		{"x", "model_pinned", "model x is pinned"},
		{"y", "model_kept", "keeps 1 workers of model y"},
	} {
		_, err := s.Unload(t.Context(), c.model, "", stop)
		var oe *openai.Error
		if !errors.As(err, &oe) || oe.Status != http.StatusConflict || oe.Code != c.code || !strings.Contains(oe.Message, c.says) {
			t.Errorf("unload %s: %v; want 409 %s saying %q", c.model, err, c.code, c.says)
		}
	}
	if len(stopped) > 0 {
		t.Errorf("refused unloads stopped %v", stopped)
	}
}

// A model that no one GPU holds gets room over the fewest GPUs of one
// pool (a split): on three 6 GiB GPUs, x (4 GiB) on GPU 0 and y (4 GiB)
// on GPU 1 idle, z (1 GiB) on GPU 2 busy, a 9 GiB need frees GPUs 0 and
// 1 (x and y), the roomiest two; never the CPU, never z while it is
// busy. One device that can be freed wins over a split; more than the
// GPUs hold gets no plan.
func TestPlanEvictionSplitsOverGPUs(t *testing.T) {
	const gib = 1 << 30
	gpus := func(p *registry.Pool) {
		p.GPUs = []api.GPU{
			{ID: 0, Kind: api.DeviceCUDA, TotalBytes: 6 * gib, FreeBytes: 2 * gib, AllocatedBytes: 4 * gib},
			{ID: 1, Kind: api.DeviceCUDA, TotalBytes: 6 * gib, FreeBytes: 2 * gib, AllocatedBytes: 4 * gib},
			{ID: 2, Kind: api.DeviceCUDA, TotalBytes: 6 * gib, FreeBytes: 5 * gib, AllocatedBytes: 1 * gib},
			{ID: 3, Kind: api.DeviceCPU, TotalBytes: 4 * gib, FreeBytes: 4 * gib},
		}
		p.Workers[1].GPUDevice, p.Workers[2].GPUDevice = 1, 2
	}
	s := evictionCase(t, "", gpus)
	ev, ok := s.planEviction("m", "", 9*gib, false)
	if !ok || !slices.Equal(ev.gpus, []int{0, 1}) || !slices.Equal(victims(ev), []string{"x1", "y1"}) {
		t.Fatalf("plan for 9 GiB: %v on %v (%v); want x1 and y1 over GPUs 0 and 1", victims(ev), ev.gpus, ok)
	}
	// One device that can hold it wins over a split.
	if ev, ok := s.planEviction("m", "", 5*gib, false); !ok || len(ev.gpus) > 0 || len(ev.victims) != 1 {
		t.Errorf("plan for 5 GiB: %v on %d %v (%v); want one victim on one device", victims(ev), ev.gpu, ev.gpus, ok)
	}
	// More than the GPUs hold: none.
	if ev, ok := s.planEviction("m", "", 19*gib, true); ok {
		t.Errorf("plan for 19 GiB: %v on %v; want none", victims(ev), ev.gpus)
	}
}
