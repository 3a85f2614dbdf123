//go:build !race

package queen

// A model too big for any one GPU of a node, split over two of its GPUs:
// real queen, hive and worker processes on stand-in GPUs
// (internal/testbin/standin), whose memory the stand-in driver counts per
// device and process.

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/keeper"
	"github.com/apiary-llm/apiary/internal/modelstore"
	"github.com/apiary-llm/apiary/internal/testbin"
	"github.com/apiary-llm/apiary/internal/testmodel"
)

// The whole path of a split: on a node of two (and four) stand-in GPUs,
// each smaller than the model's estimate, a request places its worker
// over two of them (the fewest that hold it), not on the node's CPU; the
// worker serves; each of the two devices holds a part of it, by the
// stand-in driver's count, and the others nothing; its row, its pool's
// worker entry and the start's audit entry name both devices; stopped,
// each device's memory comes back and the release check says so for each.
// A second model of the same size arriving meanwhile goes where its room
// is (the two free GPUs of four, else the CPU), no device overcommitted.
func TestProcessSplitOverGPUs(t *testing.T) {
	for _, tc := range []struct {
		devices int
		part    float64 // of the model's estimate, each device's memory
	}{{2, 0.8}, {4, 0.75}} {
		t.Run(fmt.Sprintf("%d GPUs", tc.devices), func(t *testing.T) { splitOverGPUs(t, tc.devices, tc.part) })
	}
}

func splitOverGPUs(t *testing.T, n int, part float64) {
	model, est := splitModel(t)
	size := uint64(float64(est) * part)
	var devs []testbin.StandinDevice
	for i := range n {
		devs = append(devs, testbin.StandinDevice{TotalBytes: size, UUID: fmt.Sprintf("GPU-5a0d3c1e-0000-4000-8000-00000000000%d", i), Name: "Stand-in"})
	}
	s := testbin.NewStandin(t, devs...)
	second := model
	second.Seed = 8
	c := startClusterWith(t, clusterOptions{model: model, more: map[string]testmodel.Options{"b": second}, hiveEnv: s.Env()}, nil,
		"--log-level", "debug", "--pass-env", testbin.StandinEnv, "--worker-ctx-size", "512")
	ctx := t.Context()
	if _, err := c.client.Completions.New(ctx, completion(8), ignoreEOS); err != nil {
		t.Fatalf("completion of a model of %d bytes (estimate) on %d GPUs of %d: %v", est, n, size, err)
	}
	row := splitRunning(t, c)
	if !slices.Equal(row.GPUDevices, []int{0, 1}) || row.GPUDevice == nil || *row.GPUDevice != 0 || row.DeviceKind != api.DeviceCUDA {
		t.Fatalf("row %s on %v (gpu_device %v, %s), want split over GPUs 0,1", row.ID, row.GPUDevices, row.GPUDevice, row.DeviceKind)
	}
	pid := *row.PID
	var sum uint64
	for d := range n {
		h := s.Held(d, pid)
		if d < 2 && (h == 0 || h > size) || d >= 2 && h != 0 {
			t.Errorf("device %d of %d bytes: the stand-in driver lists %d bytes for the worker (pid %d)", d, size, h, pid)
		}
		sum += h
	}
	if row.VRAMBytes != sum {
		t.Errorf("vram_bytes %d, the driver's count on the two devices %d", row.VRAMBytes, sum)
	}
	t.Logf("estimate %d bytes, devices of %d: worker %s holds %d on device 0, %d on device 1", est, size, row.ID, s.Held(0, pid), s.Held(1, pid))

	pools, err := c.admin.Pools(ctx, keeper.PoolFilter{})
	if err != nil || len(pools) != 1 {
		t.Fatalf("pools: %+v, %v", pools, err)
	}
	i := slices.IndexFunc(pools[0].Workers, func(w api.Worker) bool { return w.LifecycleID == row.ID })
	if i < 0 || !slices.Equal(pools[0].Workers[i].DeviceIDs(), []int{0, 1}) {
		t.Errorf("the pool's workers %+v: want %s on devices 0 and 1", pools[0].Workers, row.ID)
	} else {
		w := pools[0].Workers[i]
		for _, d := range w.Devices {
			if d.VRAMBytes != s.Held(d.ID, pid) {
				t.Errorf("the pool lists %d bytes on device %d, the driver %d", d.VRAMBytes, d.ID, s.Held(d.ID, pid))
			}
		}
	}
	// The devices' worker lists come with the hive's next heartbeat.
	for deadline := time.Now().Add(waitLimit); ; time.Sleep(50 * time.Millisecond) {
		pools, err := c.admin.Pools(ctx, keeper.PoolFilter{})
		if err != nil || len(pools) != 1 {
			t.Fatalf("pools: %+v, %v", pools, err)
		}
		on := func(g api.GPU) bool { return slices.Contains(g.Workers, row.WorkerID) }
		if on(pools[0].GPUs[0]) && on(pools[0].GPUs[1]) && !slices.ContainsFunc(pools[0].GPUs[2:], on) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("devices %+v: want %s listed by devices 0 and 1 alone", pools[0].GPUs, row.WorkerID)
		}
	}
	entries, err := c.admin.AuditQuery(ctx, keeper.AuditFilter{Target: row.ID})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(entries, func(e api.AuditEntry) bool {
		return e.Action == "worker.start" && fmt.Sprint(e.Metadata["gpu_devices"]) == "[0 1]"
	}) {
		t.Errorf("no start entry names gpu_devices [0 1]: %+v", entries)
	}

	// A second model of the same size arrives while the split runs: it
	// is placed where its room is (two free GPUs of four, else the
	// node's CPU), and no device holds more than it has.
	p := completion(8)
	p.Model = "b"
	if _, err := c.client.Completions.New(ctx, p, ignoreEOS); err != nil {
		t.Fatalf("a second model beside the split: %v", err)
	}
	var other api.LifecycleRow
	for _, r := range c.rows() {
		if r.ModelRef == "b" && r.Status == "RUNNING" && r.PID != nil {
			other = r
		}
	}
	if other.ID == "" {
		t.Fatalf("no RUNNING worker of b: %+v", c.rows())
	}
	for d := range n {
		if h := s.Held(d, pid) + s.Held(d, *other.PID); h > size {
			t.Errorf("device %d of %d bytes holds %d: overcommitted (the split and b on %v %s)", d, size, h, other.GPUDevices, other.DeviceKind)
		}
	}
	wantB := api.DeviceCPU
	if n >= 4 {
		wantB = api.DeviceCUDA
	}
	if other.DeviceKind != wantB {
		t.Errorf("b on %s %v, want %s", other.DeviceKind, other.GPUDevices, wantB)
	}
	t.Logf("b placed on %s %v", other.DeviceKind, other.GPUDevices)

	if _, err := c.admin.StopWorker(ctx, row.ID, false, "the split is done"); err != nil {
		t.Fatal(err)
	}
	for d := range 2 {
		c.hive.logs.wait(t, 0, "the driver gave the worker's GPU memory back", map[string]string{"worker_id": row.WorkerID, "gpu_device": fmt.Sprint(d)})
		if h := s.Held(d, pid); h != 0 {
			t.Errorf("device %d still records %d bytes of the stopped worker", d, h)
		}
	}
	if strings.Contains(c.hive.logs.String(), "memory leaked") {
		t.Errorf("a leak reported:\n%s", c.hive.logs.String())
	}
}

// splitRunning waits until one worker is RUNNING split over GPUs and
// returns its row.
func splitRunning(t *testing.T, c *cluster) api.LifecycleRow {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for {
		rows, err := c.admin.Workers(t.Context(), keeper.WorkerFilter{Status: "RUNNING"})
		if err != nil {
			t.Fatal(err)
		}
		var where []string
		for _, r := range rows {
			if len(r.GPUDevices) > 1 && r.PID != nil {
				return r
			}
			where = append(where, fmt.Sprintf("%s on %v %v %s", r.ID, r.GPUDevice, r.GPUDevices, r.DeviceKind))
		}
		if time.Now().After(deadline) {
			t.Fatalf("no RUNNING worker split over GPUs: %s", strings.Join(where, ", "))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A model on one GPU that leaves too little beside it for a model that
// needs both GPUs of the node (and no room on its CPU) is evicted for it:
// the eviction frees the fewest GPUs that hold the split together, and
// the split is served there.
func TestProcessEvictionForASplit(t *testing.T) {
	model, est := splitModel(t)
	size := est * 52 / 100 // two hold it, just
	small, ok := modelBetween(t, est*3/10, size)
	if !ok {
		t.Fatalf("no test model between %d and %d bytes (estimate)", est*3/10, size)
	}
	var devs []testbin.StandinDevice
	for i := range 2 {
		devs = append(devs, testbin.StandinDevice{TotalBytes: size, UUID: fmt.Sprintf("GPU-5a0d3c1e-0000-4000-8000-00000000001%d", i), Name: "Stand-in"})
	}
	s := testbin.NewStandin(t, devs...)
	c := startClusterWith(t, clusterOptions{model: model, more: map[string]testmodel.Options{"c": small}, hiveEnv: s.Env()}, nil,
		"--pass-env", testbin.StandinEnv, "--worker-ctx-size", "512", "--cpu-memory", "16MiB")
	ctx := t.Context()
	p := completion(8)
	p.Model = "c"
	if _, err := c.client.Completions.New(ctx, p, ignoreEOS); err != nil {
		t.Fatalf("c on one GPU: %v", err)
	}
	var first api.LifecycleRow
	for _, r := range c.rows() {
		if r.ModelRef == "c" {
			first = r
		}
	}
	if first.DeviceKind != api.DeviceCUDA || len(first.GPUDevices) > 1 {
		t.Fatalf("c on %s %v %v, want one GPU", first.DeviceKind, first.GPUDevice, first.GPUDevices)
	}
	if _, err := c.client.Completions.New(ctx, completion(8), ignoreEOS); err != nil {
		t.Fatalf("the split model after c: %v", err)
	}
	row := splitRunning(t, c)
	c.queen.logs.wait(t, 0, "worker evicted", map[string]string{"lifecycle_id": first.ID, "for": "tiny"})
	if !slices.Equal(row.GPUDevices, []int{0, 1}) {
		t.Errorf("the split on %v, want GPUs 0 and 1", row.GPUDevices)
	}
	for d := range 2 {
		if h := s.Held(d, *row.PID); h == 0 || h > size {
			t.Errorf("device %d of %d bytes: the split holds %d", d, size, h)
		}
	}
}

// splitModel is the model the split tests place, and its estimate at 512
// tokens: one whose weights outweigh llama.cpp's compute buffers, as a
// model too big for one GPU's do.
func splitModel(t *testing.T) (testmodel.Options, uint64) {
	t.Helper()
	model := testmodel.Options{Seed: 7, Layers: 8, Dim: 256}
	return model, estimateOf(t, model)
}

// estimateOf is the memory estimate (at 512 tokens) of test model o.
func estimateOf(t *testing.T, o testmodel.Options) uint64 {
	t.Helper()
	path := filepath.Join(t.TempDir(), "probe.gguf")
	if err := testmodel.WriteFile(path, o); err != nil {
		t.Fatal(err)
	}
	info, err := modelstore.ReadInfo(path)
	if err != nil {
		t.Fatal(err)
	}
	return info.EstimateMemory(512).Total
}

// modelBetween is a test model of the split's kind, smaller, whose
// estimate (at 512 tokens) is over lo and at most hi: the largest of a
// few shapes.
func modelBetween(t *testing.T, lo, hi uint64) (testmodel.Options, bool) {
	t.Helper()
	var best testmodel.Options
	var bestEst uint64
	for _, dim := range []int{256, 192, 128, 64} {
		for _, layers := range []int{6, 4, 2} {
			o := testmodel.Options{Seed: 9, Layers: layers, Dim: dim}
			if e := estimateOf(t, o); e > lo && e <= hi && e > bestEst {
				best, bestEst = o, e
			}
		}
	}
	return best, bestEst > 0
}
