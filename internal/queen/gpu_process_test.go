//go:build !race

package queen

// The GPU path with real processes and no GPU: a hive whose NVML and CUDA
// backend are the stand-ins (internal/testbin/standin), so that its real
// NVML code reads two stand-in GPUs, and its workers load the model into
// host memory that the stand-in counts as the device's.

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/keeper"
	"github.com/apiary-llm/apiary/internal/testbin"
)

// The whole path: the hive offers both stand-in GPUs (usable, through
// NVML, with their UUIDs) and its CPU after them; a request places its
// worker on a GPU, the roomier one, though the CPU has more memory; the
// worker's vram_bytes is the driver's count of its process; a second
// worker shares that GPU, and when the first stops, the driver gives its
// memory back, the release check says so and the GPU stays usable.
func TestProcessGPUPath(t *testing.T) {
	s := testbin.NewStandin(t,
		testbin.StandinDevice{TotalBytes: 1 << 30, UUID: "GPU-5a0d3c1e-0000-4000-8000-000000000000", Name: "Stand-in 1 GiB"},
		testbin.StandinDevice{TotalBytes: 2 << 30, UUID: "GPU-5a0d3c1e-0000-4000-8000-000000000001", Name: "Stand-in 2 GiB"})
	// The stand-in's libraries in the workers read its directory: the
	// hive passes it on by name, as an operator's flag would.
	c := startClusterWith(t, clusterOptions{hiveEnv: s.Env()}, nil, "--log-level", "debug", "--pass-env", testbin.StandinEnv)
	ctx := t.Context()

	pools, err := c.admin.Pools(ctx, keeper.PoolFilter{})
	if err != nil || len(pools) != 1 {
		t.Fatalf("pools: %+v, %v", pools, err)
	}
	devs := pools[0].GPUs
	if len(devs) != 3 {
		t.Fatalf("devices %+v, want the two stand-in GPUs and the CPU", devs)
	}
	for i, want := range []struct {
		kind, uuid string
		total      uint64
	}{{api.DeviceCUDA, "GPU-5a0d3c1e-0000-4000-8000-000000000000", 1 << 30}, {api.DeviceCUDA, "GPU-5a0d3c1e-0000-4000-8000-000000000001", 2 << 30}} {
		if d := devs[i]; d.ID != i || d.Kind != want.kind || d.UUID != want.uuid || d.TotalBytes != want.total || d.Unusable != "" {
			t.Errorf("device %d = %+v, want a usable %s %s of %d bytes", i, d, want.kind, want.uuid, want.total)
		}
	}
	if d := devs[2]; d.ID != 2 || d.Kind != api.DeviceCPU || d.Unusable != "" {
		t.Errorf("device 2 = %+v, want the node's CPU", d)
	}

	if _, err := c.client.Completions.New(ctx, completion(8), ignoreEOS); err != nil {
		t.Fatalf("completion: %v", err)
	}
	first := runningOn(t, c, 1, 1)[0]
	held := s.Held(1, *first.PID)
	if held == 0 || first.VRAMBytes != held || s.Held(0, *first.PID) != 0 {
		t.Errorf("worker %s: vram_bytes %d; the stand-in driver lists %d on device 1 and %d on device 0 for pid %d",
			first.ID, first.VRAMBytes, held, s.Held(0, *first.PID), *first.PID)
	}

	t.Logf("worker %s on GPU 1: vram_bytes %d (the stand-in driver's count of pid %d)", first.ID, first.VRAMBytes, *first.PID)

	one := 1
	if _, err := c.admin.StartWorker(ctx, "tiny", "node-1", &one, "second worker on the GPU"); err != nil {
		t.Fatal(err)
	}
	runningOn(t, c, 1, 2)
	if _, err := c.admin.StopWorker(ctx, first.ID, false, "the GPU stays in use"); err != nil {
		t.Fatal(err)
	}
	c.hive.logs.wait(t, 0, "the driver gave the worker's GPU memory back", map[string]string{"worker_id": first.WorkerID})
	if h := s.Held(1, *first.PID); h != 0 {
		t.Errorf("the stopped worker's %d bytes are still recorded", h)
	}
	if strings.Contains(c.hive.logs.String(), "memory leaked") {
		t.Errorf("a leak reported on a shared GPU:\n%s", c.hive.logs.String())
	}
	pools, err = c.admin.Pools(ctx, keeper.PoolFilter{})
	if err != nil || len(pools) != 1 || len(pools[0].GPUs) != 3 || pools[0].GPUs[1].Unusable != "" {
		t.Errorf("after the stop: %+v, %v; want device 1 usable", pools, err)
	}
	if _, err := c.client.Completions.New(ctx, completion(8), ignoreEOS); err != nil {
		t.Errorf("completion on the second worker: %v", err)
	}
}

// runningOn waits until n workers are RUNNING on device dev (a GPU) and
// returns them.
func runningOn(t *testing.T, c *cluster, dev, n int) []api.LifecycleRow {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for {
		rows, err := c.admin.Workers(t.Context(), keeper.WorkerFilter{Status: "RUNNING"})
		if err != nil {
			t.Fatal(err)
		}
		var on []api.LifecycleRow
		var where []string
		for _, r := range rows {
			if r.GPUDevice != nil && *r.GPUDevice == dev && r.DeviceKind == api.DeviceCUDA && r.PID != nil {
				on = append(on, r)
			}
			where = append(where, fmt.Sprintf("%s on %v %s", r.ID, r.GPUDevice, r.DeviceKind))
		}
		if len(on) == n {
			return on
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d RUNNING workers on GPU %d, want %d: %s", len(on), dev, n, strings.Join(where, ", "))
		}
		time.Sleep(50 * time.Millisecond)
	}
}
