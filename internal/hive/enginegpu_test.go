package hive

import (
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/gpu"
	"github.com/apiary-llm/apiary/internal/lifecycle"
)

// Regression (issue #35, "external engines get the wrong GPU"): CUDA
// numbers GPUs fastest first, NVML by PCI bus, so an engine given the
// hive's index in CUDA_VISIBLE_DEVICES ran on another GPU of a node of
// mixed models. An engine on a CUDA device gets the device's UUID through
// {gpu_uuid} (the index when the driver reported none) and
// CUDA_DEVICE_ORDER=PCI_BUS_ID, unless its engines file sets that itself;
// on the CPU device {gpu_uuid} is -1 and the order is not forced. Read
// from the running engine's own /proc/PID/environ, behind the real front.
func TestEngineOnAGPUGetsItsUUIDAndNVMLOrder(t *testing.T) {
	const uuid = "GPU-5f1c7a2e-93b4-4d1e-8c6a-0b2f3e4d5a6b"
	hiveOrder, hiveHasOrder := os.LookupEnv(cudaOrderKey)
	mem := uint64(1 << 30)
	for _, tc := range []struct {
		name     string
		devs     []gpu.Device
		on       int               // the device the start names
		env      map[string]string // the engines file's env besides CUDA_VISIBLE_DEVICES
		visible  string            // want CUDA_VISIBLE_DEVICES
		order    string            // want CUDA_DEVICE_ORDER
		hasOrder bool
	}{
		{name: "cuda", on: 1,
			devs: []gpu.Device{
				{ID: 0, Kind: gpu.KindCUDA, Name: "L4", UUID: "GPU-00000000-0000-0000-0000-000000000000", TotalBytes: mem, FreeBytes: mem},
				{ID: 1, Kind: gpu.KindCUDA, Name: "H100", UUID: uuid, TotalBytes: mem, FreeBytes: mem},
			},
			visible: uuid, order: "PCI_BUS_ID", hasOrder: true},
		{name: "cuda without a uuid", on: 1,
			devs: []gpu.Device{
				{ID: 0, Kind: gpu.KindCUDA, Name: "L4", UUID: uuid, TotalBytes: mem, FreeBytes: mem},
				{ID: 1, Kind: gpu.KindCUDA, Name: "H100", TotalBytes: mem, FreeBytes: mem},
			},
			visible: "1", order: "PCI_BUS_ID", hasOrder: true},
		{name: "cuda with the file's own order", on: 0,
			devs:    []gpu.Device{{ID: 0, Kind: gpu.KindCUDA, Name: "H100", UUID: uuid, TotalBytes: mem, FreeBytes: mem}},
			env:     map[string]string{cudaOrderKey: "FASTEST_FIRST"},
			visible: uuid, order: "FASTEST_FIRST", hasOrder: true},
		{name: "cpu", on: 0,
			devs:    []gpu.Device{{ID: 0, Kind: gpu.KindCPU, TotalBytes: mem, FreeBytes: mem}},
			visible: "-1", order: hiveOrder, hasOrder: hiveHasOrder},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pidFile := filepath.Join(t.TempDir(), "engine.pid")
			th := startHive(t, withDevices(tc.devs...), withEngine(t, "", ""), func(c *Config) {
				e := c.Engines["fake"]
				e.Command = append(e.Command, "-pid-file", pidFile)
				e.Env = map[string]string{"CUDA_VISIBLE_DEVICES": "{gpu_uuid}"}
				for k, v := range tc.env {
					e.Env[k] = v
				}
				c.Engines["fake"] = e
			})
			var res api.StartWorkerResponse
			req := api.StartWorkerRequest{ModelRef: "tiny", Engine: "fake", GPUDevice: &tc.on}
			if code := th.do("POST", "/v2/workers/start", req, &res); code != http.StatusAccepted {
				t.Fatalf("start: %d", code)
			}
			th.rec.wait(t, res.WorkerID, lifecycle.Ready)
			env := processEnv(t, pidFile)
			if got := env["CUDA_VISIBLE_DEVICES"]; got != tc.visible {
				t.Errorf("the engine's CUDA_VISIBLE_DEVICES = %q, want %q", got, tc.visible)
			}
			if got, ok := env[cudaOrderKey]; got != tc.order || ok != tc.hasOrder {
				t.Errorf("the engine's %s = %q (set: %v), want %q (set: %v)", cudaOrderKey, got, ok, tc.order, tc.hasOrder)
			}
		})
	}
}

// processEnv is the environment of the process whose pid is in pidFile
// (written once it runs), as the kernel holds it.
func processEnv(t *testing.T, pidFile string) map[string]string {
	t.Helper()
	var pid int
	for deadline := time.Now().Add(waitLimit); ; time.Sleep(5 * time.Millisecond) {
		b, err := os.ReadFile(pidFile)
		if err == nil {
			if pid, err = strconv.Atoi(string(b)); err == nil {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the engine wrote no pid: %v", err)
		}
	}
	return environOf(t, pid)
}
