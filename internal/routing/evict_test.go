package routing

import (
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/lifecycle"
	"github.com/apiary-llm/apiary/internal/modelconfig"
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
