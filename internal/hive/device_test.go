package hive

import (
	"regexp"
	"testing"

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
