package routing

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/registry"
)

func TestPlacement(t *testing.T) {
	const gib = 1 << 30
	gpu := func(id int, free uint64) api.GPU { return api.GPU{ID: id, FreeBytes: free} }
	tiny := map[string]api.Model{"tiny": {Ref: "tiny", SizeBytes: 2 * gib}}
	pools := []registry.Pool{
		{ID: "a", Status: registry.Healthy, GPUs: []api.GPU{gpu(0, 10*gib)}},
		{ID: "b", Status: registry.Healthy, GPUs: []api.GPU{gpu(0, 5*gib), gpu(1, 30*gib)}},
		{ID: "c", Status: registry.Draining, GPUs: []api.GPU{gpu(0, 100*gib)}},
		{ID: "d", Status: registry.Healthy, GPUs: []api.GPU{gpu(0, 30*gib)}},
		{ID: "e", Status: registry.Healthy, GPUs: []api.GPU{gpu(0, 1*gib)}},
		{ID: "f", Status: registry.Healthy, GPUs: []api.GPU{gpu(0, 50*gib)}},
		{ID: "g", Status: registry.Healthy, GPUs: []api.GPU{gpu(0, 50*gib)}},
		{ID: "h", Status: registry.Unhealthy},
	}
	models := map[string]map[string]api.Model{"a": tiny, "b": tiny, "c": tiny, "d": tiny, "e": tiny,
		"f": {"other": {Ref: "other", SizeBytes: 1}}}
	one, zero := 1, 0
	for _, tc := range []struct {
		name     string
		gpu      *int
		exclude  map[string]string
		pools    []registry.Pool
		want     string
		wantGPU  int
		rejected []Rejection
	}{
		{name: "most free memory where the model fits, ties by id", pools: pools, want: "b", wantGPU: 1, rejected: []Rejection{
			{PoolID: "c", Reason: "pool is draining"},
			{PoolID: "e", Reason: "no device has room for tiny (2.0 GiB): the roomiest, device 0, has 1.0 GiB free"},
			{PoolID: "f", Reason: "does not have model tiny"},
			{PoolID: "g", Reason: "its model list is not known (the hive has not answered GET /v2/models)"},
			{PoolID: "h", Reason: "pool is unhealthy"},
			{PoolID: "a", Reason: "fits on device 0 with 10.0 GiB free; b has more (30.0 GiB on device 1, ties go to the smaller id)"},
			{PoolID: "d", Reason: "fits on device 0 with 30.0 GiB free; b has more (30.0 GiB on device 1, ties go to the smaller id)"},
		}},
		{name: "on a given device", pools: pools[:5], gpu: &zero, want: "d", wantGPU: 0, rejected: []Rejection{
			{PoolID: "c", Reason: "pool is draining"},
			{PoolID: "e", Reason: "no device has room for tiny (2.0 GiB): the roomiest, device 0, has 1.0 GiB free"},
			{PoolID: "a", Reason: "fits on device 0 with 10.0 GiB free; d has more (30.0 GiB on device 0, ties go to the smaller id)"},
			{PoolID: "b", Reason: "fits on device 0 with 5.0 GiB free; d has more (30.0 GiB on device 0, ties go to the smaller id)"},
		}},
		{name: "a device only one pool has", pools: pools[:2], gpu: &one, want: "b", wantGPU: 1, rejected: []Rejection{
			{PoolID: "a", Reason: "has no device 1"},
		}},
		{name: "an excluded pool is left out with its reason", pools: pools[:2], exclude: map[string]string{"b": "its hive refused the start"},
			want: "a", rejected: []Rejection{{PoolID: "b", Reason: "its hive refused the start"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := MostFreeMemory{}.Place(tc.pools, PlaceRequest{Model: "tiny", GPU: tc.gpu, Models: models, Exclude: tc.exclude})
			if err != nil {
				t.Fatal(err)
			}
			if d.Pool.ID != tc.want || d.GPU != tc.wantGPU || d.NeedBytes != 2*gib {
				t.Errorf("placed on %s device %d (need %d), want %s device %d", d.Pool.ID, d.GPU, d.NeedBytes, tc.want, tc.wantGPU)
			}
			if diff := cmp.Diff(tc.rejected, d.Rejected); diff != "" {
				t.Errorf("rejections (-want +got):\n%s", diff)
			}
		})
	}

	t.Run("no pool: every pool's reason in the error", func(t *testing.T) {
		_, err := MostFreeMemory{}.Place(pools[2:3], PlaceRequest{Model: "tiny", Models: models})
		if !errors.Is(err, ErrNoPool) || err.Error() != "no pool can run tiny (c: pool is draining)" {
			t.Errorf("err %v", err)
		}
		if diff := cmp.Diff([]Rejection{{PoolID: "c", Reason: "pool is draining"}}, placementRejections(err)); diff != "" {
			t.Errorf("rejections (-want +got):\n%s", diff)
		}
		_, err = MostFreeMemory{}.Place(nil, PlaceRequest{Model: "tiny"})
		if !errors.Is(err, ErrNoPool) || err.Error() != "no pool can run tiny: no hive has registered" {
			t.Errorf("no pools: %v", err)
		}
	})
}

// unplaceable is the placement's answer to "can a worker of the model be
// placed now", from what the queen knows without asking a hive.
func TestUnplaceable(t *testing.T) {
	tiny := map[string]api.Model{"tiny": {Ref: "tiny", SizeBytes: 1 << 30}}
	gpus := []api.GPU{{ID: 0, FreeBytes: 4 << 30}}
	pool := func(id string, s registry.Status) registry.Pool { return registry.Pool{ID: id, Status: s, GPUs: gpus} }
	for _, tc := range []struct {
		name   string
		pools  []registry.Pool
		models map[string]map[string]api.Model
		pin    string
		want   string
	}{
		{name: "a pool fits", pools: []registry.Pool{pool("a", registry.Healthy)}, models: map[string]map[string]api.Model{"a": tiny}},
		{name: "the only pool drained", pools: []registry.Pool{pool("a", registry.Draining)}, models: map[string]map[string]api.Model{"a": tiny},
			want: "no pool can run tiny (a: pool is draining)"},
		{name: "every pool's reason",
			pools:  []registry.Pool{pool("a", registry.Unhealthy), pool("b", registry.Healthy), {ID: "c", Status: registry.Healthy, GPUs: []api.GPU{{ID: 0, FreeBytes: 1 << 20}}}},
			models: map[string]map[string]api.Model{"a": tiny, "b": {}, "c": tiny},
			want:   "no pool can run tiny (a: pool is unhealthy; b: does not have model tiny; c: no device has room for tiny (1.0 GiB): the roomiest, device 0, has 1.0 MiB free)"},
		{name: "a healthy pool whose list is not known yet may take it",
			pools: []registry.Pool{pool("a", registry.Draining), pool("b", registry.Healthy)}, models: map[string]map[string]api.Model{"a": tiny}},
		{name: "an unhealthy pool whose list is not known is no hope",
			pools: []registry.Pool{pool("a", registry.Unhealthy)}, want: "no pool can run tiny (a: pool is unhealthy)"},
		{name: "pinned: the pool's own reason, not the others' pin",
			pools: []registry.Pool{pool("a", registry.Healthy), pool("b", registry.Draining)}, models: map[string]map[string]api.Model{"a": tiny, "b": tiny},
			pin: "b", want: "no pool can run tiny (b: pool is draining)"},
		{name: "pinned to a pool that is gone", pools: []registry.Pool{pool("a", registry.Healthy)}, models: map[string]map[string]api.Model{"a": tiny},
			pin: "b", want: "no pool can run tiny (b: pool is not registered)"},
		{name: "no pool at all", want: "no pool can run tiny: no hive has registered"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := unplaceable(MostFreeMemory{}, tc.pools, PlaceRequest{Model: "tiny", Pool: tc.pin, Models: tc.models})
			got := ""
			if err != nil {
				got = err.Error()
				if !errors.Is(err, ErrNoPool) {
					t.Errorf("%v is not ErrNoPool", err)
				}
			}
			if got != tc.want {
				t.Errorf("unplaceable = %q, want %q", got, tc.want)
			}
		})
	}
}

// A placement error names at most maxReasons pools; the audit has them all.
func TestPlacementErrorIsBounded(t *testing.T) {
	var rs []Rejection
	for i := range maxReasons + 3 {
		rs = append(rs, Rejection{PoolID: fmt.Sprintf("p%02d", i), Reason: "pool is draining"})
	}
	msg := (&PlacementError{Model: "tiny", Rejected: rs}).Error()
	if !strings.HasSuffix(msg, "p07: pool is draining; and 3 more pools)") || strings.Contains(msg, "p08") {
		t.Errorf("error %q", msg)
	}
}

// TestPlacementKeepsToTheModelsPools: a model whose config names pools is
// placed only there, the others rejected with that reason.
func TestPlacementKeepsToTheModelsPools(t *testing.T) {
	gpu := api.GPU{ID: 0, FreeBytes: 10 << 30}
	tiny := map[string]api.Model{"tiny": {Ref: "tiny", SizeBytes: 1 << 20}}
	pools := []registry.Pool{
		{ID: "a", Status: registry.Healthy, GPUs: []api.GPU{gpu}},
		{ID: "b", Status: registry.Healthy, GPUs: []api.GPU{{ID: 0, FreeBytes: 1 << 30}}},
	}
	models := map[string]map[string]api.Model{"a": tiny, "b": tiny}
	d, err := MostFreeMemory{}.Place(pools, PlaceRequest{Model: "tiny", Models: models, Pools: []string{"b"}})
	if err != nil || d.Pool.ID != "b" {
		t.Fatalf("Place = %+v, %v; want pool b", d, err)
	}
	want := []Rejection{{PoolID: "a", Reason: "model tiny may run only on pools b (its pools in the queen's config)"}}
	if diff := cmp.Diff(want, d.Rejected); diff != "" {
		t.Errorf("rejected (-want +got):\n%s", diff)
	}
	_, err = MostFreeMemory{}.Place(pools, PlaceRequest{Model: "tiny", Models: models, Pools: []string{"c"}})
	if !errors.Is(err, ErrNoPool) || !strings.Contains(err.Error(), "b: model tiny may run only on pools c") {
		t.Errorf("no allowed pool: %v", err)
	}
	// unplaceable does not wait for the model list of a pool it may not use.
	err = unplaceable(MostFreeMemory{}, pools, PlaceRequest{Model: "tiny", Models: map[string]map[string]api.Model{"a": tiny}, Pools: []string{"a"}})
	if err != nil {
		t.Errorf("unplaceable with a pool that fits: %v", err)
	}
	err = unplaceable(MostFreeMemory{}, pools, PlaceRequest{Model: "tiny", Models: map[string]map[string]api.Model{"a": tiny}, Pools: []string{"x"}})
	if err == nil {
		t.Error("unplaceable: nil for a model no pool may run")
	}
}

func TestPlacementOnlyOnPoolsWithTheEngine(t *testing.T) {
	gpus := []api.GPU{{ID: 0, FreeBytes: 1 << 30}}
	pools := []registry.Pool{
		{ID: "old", Status: registry.Healthy, GPUs: gpus},
		{ID: "plain", Status: registry.Healthy, GPUs: gpus},
		{ID: "vllm", Status: registry.Healthy, GPUs: gpus},
	}
	models := map[string]map[string]api.Model{
		"old":   {"m": {Ref: "m", SizeBytes: 1}},
		"plain": {"m": {Ref: "m", SizeBytes: 1, Engines: []string{"builtin"}}},
		"vllm":  {"m": {Ref: "m", SizeBytes: 1, Engines: []string{"builtin", "vllm"}}},
	}
	d, err := MostFreeMemory{}.Place(pools, PlaceRequest{Model: "m", Engine: "vllm", Models: models})
	if err != nil {
		t.Fatal(err)
	}
	want := []Rejection{
		{PoolID: "old", Reason: "has no engine vllm (its hive declares builtin)"},
		{PoolID: "plain", Reason: "has no engine vllm (its hive declares builtin)"},
	}
	if d.Pool.ID != "vllm" || !cmp.Equal(d.Rejected, want) {
		t.Errorf("placed on %s, rejected %v", d.Pool.ID, d.Rejected)
	}
	if d, err := (MostFreeMemory{}).Place(pools, PlaceRequest{Model: "m", Models: models}); err != nil || d.Pool.ID != "old" {
		t.Errorf("builtin: placed on %s, %v; every pool has the built-in engine", d.Pool.ID, err)
	}
}

// A device its hive marks unusable is never chosen, however roomy; a pool
// with no usable device is rejected with the hive's reason, and one with
// another, usable device is placed there.
func TestPlacementSkipsUnusableDevices(t *testing.T) {
	const gib = 1 << 30
	tiny := map[string]api.Model{"tiny": {Ref: "tiny", SizeBytes: 2 * gib}}
	pools := []registry.Pool{
		{ID: "a", Status: registry.Healthy, GPUs: []api.GPU{{ID: 0, FreeBytes: 80 * gib, Unusable: "no usable GPU backend: /opt/bin/libggml-cuda.so is not there"}}},
		{ID: "b", Status: registry.Healthy, GPUs: []api.GPU{{ID: 0, FreeBytes: 70 * gib, Unusable: "memory leaked by worker-1 (pid 42)"}, {ID: 1, FreeBytes: 4 * gib}}},
	}
	models := map[string]map[string]api.Model{"a": tiny, "b": tiny}
	d, err := MostFreeMemory{}.Place(pools, PlaceRequest{Model: "tiny", Models: models})
	if err != nil {
		t.Fatal(err)
	}
	if d.Pool.ID != "b" || d.GPU != 1 {
		t.Errorf("placed on %s device %d, want b device 1", d.Pool.ID, d.GPU)
	}
	want := []Rejection{{PoolID: "a", Reason: "device 0 is unusable", Detail: "device 0 is unusable: no usable GPU backend: /opt/bin/libggml-cuda.so is not there"}}
	if diff := cmp.Diff(want, d.Rejected); diff != "" {
		t.Errorf("rejections (-want +got):\n%s", diff)
	}
	zero := 0
	_, err = MostFreeMemory{}.Place(pools, PlaceRequest{Model: "tiny", Models: models, GPU: &zero})
	if !errors.Is(err, ErrNoPool) || !strings.Contains(err.Error(), "b: device 0 is unusable: memory leaked by worker-1 (pid 42)") {
		t.Errorf("pinned to the unusable device 0: %v", err)
	}
}

// A GPU where the model fits comes before any CPU, in its pool and across
// pools, though a CPU has more memory; a model that fits no GPU goes to
// the roomiest CPU.
func TestPlacementPrefersAGPU(t *testing.T) {
	pools := []registry.Pool{
		{ID: "a", Status: registry.Healthy, GPUs: []api.GPU{{ID: 0, Kind: api.DeviceCPU, FreeBytes: 200 << 30}}},
		{ID: "b", Status: registry.Healthy, GPUs: []api.GPU{
			{ID: 0, Kind: "cuda", FreeBytes: 20 << 30}, {ID: 1, Kind: api.DeviceCPU, FreeBytes: 100 << 30}}},
	}
	for _, tc := range []struct {
		size     int64
		pool     string
		dev      int
		whyOther string
	}{
		{8 << 30, "b", 0, "fits on device 0 with 200.0 GiB free"},
		{30 << 30, "a", 0, "fits on device 1 with 100.0 GiB free"},
	} {
		m := map[string]api.Model{"m": {Ref: "m", SizeBytes: tc.size}}
		d, err := MostFreeMemory{}.Place(pools, PlaceRequest{Model: "m", Models: map[string]map[string]api.Model{"a": m, "b": m}})
		if err != nil || d.Pool.ID != tc.pool || d.GPU != tc.dev {
			t.Errorf("%s: placed on %s device %d (%v), want %s device %d", api.FormatBytes(uint64(tc.size)), d.Pool.ID, d.GPU, err, tc.pool, tc.dev)
			continue
		}
		if len(d.Rejected) != 1 || !strings.Contains(d.Rejected[0].Reason, tc.whyOther) {
			t.Errorf("%s: rejected %+v, want the other pool with %q", api.FormatBytes(uint64(tc.size)), d.Rejected, tc.whyOther)
		}
	}
}

// A model that fits no one GPU is split over the fewest GPUs of one pool
// that hold it, the roomiest first, each given a share in proportion to
// its free memory; one GPU where it fits comes first, a pool that needs
// fewer GPUs before one that needs more, any split before the CPU; GPUs
// of two pools are never mixed; a split worker's part counts on each of
// its devices.
func TestPlacementSplitsOverTheFewestGPUs(t *testing.T) {
	gpus := func(free ...uint64) []api.GPU {
		var out []api.GPU
		for i, f := range free {
			out = append(out, api.GPU{ID: i, Kind: api.DeviceCUDA, TotalBytes: max(128, f) << 20, FreeBytes: f << 20})
		}
		return append(out, api.GPU{ID: len(free), Kind: api.DeviceCPU, FreeBytes: 64 << 30})
	}
	for _, tc := range []struct {
		name   string
		pools  []registry.Pool
		size   uint64 // MiB
		pool   string
		devs   []int
		shares []uint64 // MiB
	}{
		{"one GPU where it fits", []registry.Pool{{ID: "a", GPUs: gpus(128, 128)}}, 100, "a", []int{0}, nil},
		{"two of 128 MiB for 183", []registry.Pool{{ID: "a", GPUs: gpus(128, 128)}}, 183, "a", []int{0, 1}, []uint64{91, 91}},
		{"the roomiest two of four", []registry.Pool{{ID: "a", GPUs: gpus(50, 120, 100, 128)}}, 183, "a", []int{3, 1}, []uint64{94, 88}},
		{"three when two do not hold it", []registry.Pool{{ID: "a", GPUs: gpus(100, 100, 100)}}, 250, "a", []int{0, 1, 2}, []uint64{83, 83, 83}},
		{"fewer GPUs in another pool", []registry.Pool{{ID: "a", GPUs: gpus(100, 100, 100)}, {ID: "b", GPUs: gpus(128, 128)}}, 183, "b", []int{0, 1}, []uint64{91, 91}},
		{"one GPU in another pool before a split", []registry.Pool{{ID: "a", GPUs: gpus(128, 128)}, {ID: "b", GPUs: gpus(100, 190)}}, 183, "b", []int{1}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			models := map[string]map[string]api.Model{}
			for i := range tc.pools {
				tc.pools[i].Status = registry.Healthy
				models[tc.pools[i].ID] = map[string]api.Model{"m": {Ref: "m", SizeBytes: int64(tc.size << 20)}}
			}
			d, err := MostFreeMemory{}.Place(tc.pools, PlaceRequest{Model: "m", Models: models})
			if err != nil {
				t.Fatal(err)
			}
			var shares []uint64
			var sum uint64
			for _, s := range d.Shares {
				shares = append(shares, s>>20)
				sum += s
			}
			if d.Pool.ID != tc.pool || !slices.Equal(d.Devices(), tc.devs) || !slices.Equal(shares, tc.shares) || d.GPU != tc.devs[0] ||
				len(shares) > 0 && sum != tc.size<<20 {
				t.Errorf("placed on %s devices %v shares %v MiB (%d bytes, gpu %d), want %s %v %v", d.Pool.ID, d.Devices(), shares, sum, d.GPU, tc.pool, tc.devs, tc.shares)
			}
		})
	}

	// Two pools of one 128 MiB GPU each: never one split over both.
	pools := []registry.Pool{{ID: "a", Status: registry.Healthy, GPUs: gpus(128)[:1]}, {ID: "b", Status: registry.Healthy, GPUs: gpus(128)[:1]}}
	m := map[string]api.Model{"m": {Ref: "m", SizeBytes: 183 << 20}}
	if d, err := (MostFreeMemory{}).Place(pools, PlaceRequest{Model: "m", Models: map[string]map[string]api.Model{"a": m, "b": m}}); err == nil {
		t.Errorf("placed on %s %v over two nodes' GPUs", d.Pool.ID, d.Devices())
	}

	// A split worker holds its part on each device: a second model of
	// 80 MiB fits neither GPU, nor both together (36 and 37 MiB free).
	p := registry.Pool{ID: "a", Status: registry.Healthy, GPUs: gpus(128, 128)[:2], Workers: []api.Worker{{WorkerID: "w", ModelRef: "big", Status: "ready",
		GPUDevice: 0, VRAMBytes: 183 << 20, Devices: []api.WorkerDevice{{ID: 0, VRAMBytes: 92 << 20}, {ID: 1, VRAMBytes: 91 << 20}}}}}
	small := map[string]api.Model{"m": {Ref: "m", SizeBytes: 80 << 20}, "big": {Ref: "big", SizeBytes: 183 << 20}}
	if d, err := (MostFreeMemory{}).Place([]registry.Pool{p}, PlaceRequest{Model: "m", Models: map[string]map[string]api.Model{"a": small}}); err == nil {
		t.Errorf("80 MiB placed on %v beside a split worker holding 92 and 91 of 128 MiB", d.Devices())
	} else if !strings.Contains(err.Error(), "its 2 GPUs 73.0 MiB together") {
		t.Errorf("error %v, want what the GPUs have free together", err)
	}
}
