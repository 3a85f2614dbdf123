package hive

import (
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/gpu"
	"github.com/apiary-llm/apiary/internal/lifecycle"
)

// Regression ("a CPU shows as GPU 0"): a worker on the CPU logs
// device=cpu, not gpu_device=0; one on a GPU logs its gpu_device.
func TestWorkerLogNamesItsDevice(t *testing.T) {
	for _, tc := range []struct {
		dev        gpu.Device
		want, not_ string
	}{
		{gpu.Device{ID: 0, Kind: gpu.KindCPU, TotalBytes: 1 << 30, FreeBytes: 1 << 30}, `device=cpu`, `gpu_device=`},
		{gpu.Device{ID: 0, Kind: gpu.KindCUDA, TotalBytes: 1 << 30, FreeBytes: 1 << 30}, `gpu_device=0`, `device=cpu`},
	} {
		t.Run(tc.dev.Kind, func(t *testing.T) {
			th := startHive(t, withDevices(tc.dev))
			id := th.start()
			th.rec.wait(t, id, lifecycle.Ready)
			line := regexp.MustCompile(`(?m)^.*msg="worker spawned".*$`).FindString(th.logs.String())
			if !regexp.MustCompile(`\b`+tc.want+`\b`).MatchString(line) || regexp.MustCompile(`\b`+tc.not_).MatchString(line) {
				t.Errorf("spawn line %q: want %s, not %s", line, tc.want, tc.not_)
			}
		})
	}
}

// A device the inventory marks unusable is reported with why, in
// GET /v2/gpus, and refused for a start that names it or picks one.
func TestUnusableDeviceIsReportedAndRefused(t *testing.T) {
	const why = "no usable GPU backend: /opt/apiary/bin/libggml-cuda.so is not there"
	th := startHive(t, withDevices(gpu.Device{ID: 0, Kind: gpu.KindCUDA, Name: "H100", TotalBytes: 1 << 30, FreeBytes: 1 << 30, Unusable: why}))
	var list api.GPUList
	if code := th.do("GET", "/v2/gpus", nil, &list); code != http.StatusOK || len(list.GPUs) != 1 || list.GPUs[0].Unusable != why {
		t.Fatalf("GET /v2/gpus = %d %+v", code, list)
	}
	zero := 0
	for _, req := range []api.StartWorkerRequest{{ModelRef: "tiny"}, {ModelRef: "tiny", GPUDevice: &zero}} {
		var e api.Error
		code := th.do("POST", "/v2/workers/start", req, &e)
		if code != http.StatusConflict || e.Error.Code != "device_unusable" || !strings.Contains(e.Error.Message, why) {
			t.Errorf("start %+v = %d %+v, want 409 device_unusable with %q", req, code, e, why)
		}
	}
}

// Of two devices the unusable one is passed over although it has more
// memory.
func TestChooseDevicePassesOverUnusable(t *testing.T) {
	devs := []gpu.Device{
		{ID: 0, Kind: gpu.KindCUDA, TotalBytes: 100, FreeBytes: 100, Unusable: "memory leaked by worker-x (pid 1)"},
		{ID: 1, Kind: gpu.KindCUDA, TotalBytes: 10, FreeBytes: 10},
	}
	d, err := chooseDevice(devs, nil, 0, func(int) held { return held{} })
	if err != nil || d.ID != 1 {
		t.Errorf("chooseDevice = %+v, %v; want device 1", d, err)
	}
}

// A worker on a CUDA device numbers GPUs as NVML does (by PCI bus), so
// that its --gpu-device is the hive's device; a CPU worker is not told.
func TestCUDAWorkerNumbersGPUsAsNVML(t *testing.T) {
	th := startHive(t)
	for _, tc := range []struct {
		kind string
		want bool
	}{{gpu.KindCUDA, true}, {gpu.KindCPU, false}} {
		spec := th.builtinSpec(&worker{id: "worker-x", device: gpu.Device{ID: 0, Kind: tc.kind}}, api.StartWorkerRequest{}, "/m/tiny.gguf", startOptions{})
		if got := slices.Contains(spec.Env, "CUDA_DEVICE_ORDER=PCI_BUS_ID"); got != tc.want {
			t.Errorf("%s worker: CUDA_DEVICE_ORDER=PCI_BUS_ID in its environment: %v, want %v", tc.kind, got, tc.want)
		}
	}
}

// A start split over GPUs: each device must be a usable GPU of the node,
// named once, and gets its share of the estimate in proportion to what
// it has available; an engine of the split gets every UUID in
// {gpu_uuids}.
func TestChooseSplitSharesByAvailableMemory(t *testing.T) {
	devs := []gpu.Device{
		{ID: 0, Kind: gpu.KindCUDA, UUID: "GPU-a", TotalBytes: 128 << 20, FreeBytes: 128 << 20},
		{ID: 1, Kind: gpu.KindCUDA, UUID: "GPU-b", TotalBytes: 128 << 20, FreeBytes: 64 << 20},
		{ID: 2, Kind: gpu.KindCUDA, UUID: "GPU-c", TotalBytes: 128 << 20, FreeBytes: 128 << 20, Unusable: "memory leaked"},
		{ID: 3, Kind: gpu.KindCPU, TotalBytes: 1 << 30, FreeBytes: 1 << 30},
	}
	none := func(int) held { return held{} }
	split, shares, err := chooseSplit(devs, []int{0, 1}, 150<<20, none)
	if err != nil || len(split) != 2 || shares[0] != 100<<20 || shares[1] != 50<<20 {
		t.Errorf("split %v shares %v, %v; want 100 and 50 MiB", split, shares, err)
	}
	for _, ids := range [][]int{{0, 2}, {0, 3}, {0, 0}, {0, 9}} {
		if _, _, err := chooseSplit(devs, ids, 150<<20, none); err == nil {
			t.Errorf("split over %v accepted", ids)
		}
	}
	vals := engineValues("/m", "m", "127.0.0.1", 1, split, startOptions{}, "")
	if vals["gpu_uuids"] != "GPU-a,GPU-b" || vals["gpu_uuid"] != "GPU-a" || vals["gpu"] != "0" {
		t.Errorf("placeholders %v", vals)
	}
}
