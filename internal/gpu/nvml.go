//go:build cgo && linux

package gpu

import (
	"fmt"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// NVML is the Driver of NVIDIA GPUs, read through NVML.
type NVML struct {
	lib       nvml.Interface
	closeOnce sync.Once
}

var _ Driver = (*NVML)(nil)

// OpenNVML loads libnvidia-ml at run time. Without the library, or with no
// GPU, it returns an error wrapping ErrNoNVML.
func OpenNVML() (*NVML, error) {
	lib := nvml.New()
	if ret := lib.Init(); ret != nvml.SUCCESS {
		if ret == nvml.ERROR_LIBRARY_NOT_FOUND || ret == nvml.ERROR_DRIVER_NOT_LOADED || ret == nvml.ERROR_NO_PERMISSION {
			return nil, fmt.Errorf("%w: %s", ErrNoNVML, ret.Error())
		}
		return nil, fmt.Errorf("nvml init: %s", ret.Error())
	}
	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS || n == 0 {
		lib.Shutdown()
		return nil, fmt.Errorf("%w: %d devices (%s)", ErrNoNVML, n, ret.Error())
	}
	return &NVML{lib: lib}, nil
}

// DeviceCount is the number of GPUs NVML sees.
func (g *NVML) DeviceCount() (int, error) {
	n, ret := g.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return 0, fmt.Errorf("nvml device count: %s", ret.Error())
	}
	return n, nil
}

// Device reads GPU i's memory, name and temperature now.
func (g *NVML) Device(i int) (Device, error) {
	h, ret := g.lib.DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS {
		return Device{}, fmt.Errorf("nvml device %d: %s", i, ret.Error())
	}
	mem, ret := h.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return Device{}, fmt.Errorf("nvml device %d memory: %s", i, ret.Error())
	}
	d := Device{ID: i, Kind: KindCUDA, TotalBytes: mem.Total, FreeBytes: mem.Free}
	if name, ret := h.GetName(); ret == nvml.SUCCESS {
		d.Name = name
	}
	if uuid, ret := h.GetUUID(); ret == nvml.SUCCESS {
		d.UUID = uuid
	}
	if t, ret := h.GetTemperature(nvml.TEMPERATURE_GPU); ret == nvml.SUCCESS {
		c := int(t)
		d.TemperatureC = &c
	}
	if u, ret := h.GetUtilizationRates(); ret == nvml.SUCCESS {
		pct := int(min(u.Gpu, 100))
		d.UtilPercent = &pct
	}
	return d, nil
}

// CUDAVersion is the newest CUDA version the driver supports.
func (g *NVML) CUDAVersion() (int, error) {
	v, ret := g.lib.SystemGetCudaDriverVersion()
	if ret != nvml.SUCCESS {
		return 0, fmt.Errorf("nvml CUDA driver version: %s", ret.Error())
	}
	return v, nil
}

// Processes lists the compute processes holding memory on GPU i.
func (g *NVML) Processes(i int) ([]Process, error) {
	h, ret := g.lib.DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("nvml device %d: %s", i, ret.Error())
	}
	infos, ret := h.GetComputeRunningProcesses()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("nvml device %d processes: %s", i, ret.Error())
	}
	out := make([]Process, 0, len(infos))
	for _, p := range infos {
		out = append(out, Process{PID: int(p.Pid), UsedBytes: p.UsedGpuMemory})
	}
	return out, nil
}

// Close shuts NVML down; it is idempotent.
func (g *NVML) Close() error {
	var err error
	g.closeOnce.Do(func() {
		if ret := g.lib.Shutdown(); ret != nvml.SUCCESS {
			err = fmt.Errorf("nvml shutdown: %s", ret.Error())
		}
	})
	return err
}
