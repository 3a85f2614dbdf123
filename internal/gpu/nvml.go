//go:build cgo && linux

package gpu

import (
	"context"
	"fmt"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// NVML is the inventory of NVIDIA GPUs read through NVML.
type NVML struct {
	lib       nvml.Interface
	closeOnce sync.Once
}

// OpenNVML loads libnvidia-ml at run time. Without the library, or with no
// GPU, it returns an error wrapping ErrNoNVML.
func OpenNVML() (*NVML, error) {
	lib := nvml.New()
	if ret := lib.Init(); ret != nvml.SUCCESS {
		if ret == nvml.ERROR_LIBRARY_NOT_FOUND || ret == nvml.ERROR_DRIVER_NOT_LOADED || ret == nvml.ERROR_NO_PERMISSION {
			return nil, fmt.Errorf("%w: %s", ErrNoNVML, ret.Error())
		}
		return nil, fmt.Errorf("gpu: nvml init: %s", ret.Error())
	}
	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS || n == 0 {
		lib.Shutdown()
		return nil, fmt.Errorf("%w: %d devices (%s)", ErrNoNVML, n, ret.Error())
	}
	return &NVML{lib: lib}, nil
}

// Devices reads every GPU's memory, name and temperature now.
func (g *NVML) Devices(context.Context) ([]Device, error) {
	n, ret := g.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("gpu: nvml device count: %s", ret.Error())
	}
	devs := make([]Device, 0, n)
	for i := range n {
		h, ret := g.lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("gpu: nvml device %d: %s", i, ret.Error())
		}
		mem, ret := h.GetMemoryInfo()
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("gpu: nvml device %d memory: %s", i, ret.Error())
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
		devs = append(devs, d)
	}
	return devs, nil
}

// Close shuts NVML down; it is idempotent.
func (g *NVML) Close() error {
	var err error
	g.closeOnce.Do(func() {
		if ret := g.lib.Shutdown(); ret != nvml.SUCCESS {
			err = fmt.Errorf("gpu: nvml shutdown: %s", ret.Error())
		}
	})
	return err
}
