// Package gpu is a node's device inventory: the NVIDIA GPUs NVML reports, or,
// on a node without one, a single CPU device whose memory budget is the
// system's memory. NVML is loaded at run time; a node without the library
// simply has no GPUs, which is not an error. A GPU is marked unusable, with
// why, when the CUDA backend library workers load is missing or the driver
// is too old for it; the driver is behind an interface (Driver).
package gpu

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
)

// Device kinds.
const (
	KindCUDA = "cuda"
	KindCPU  = "cpu"
)

// Device is one place a worker can load a model.
type Device struct {
	ID           int    // index passed to the worker as --gpu-device
	Kind         string // KindCUDA or KindCPU
	Name         string
	UUID         string
	TotalBytes   uint64
	FreeBytes    uint64
	TemperatureC *int // nil when the device does not report one
	UtilPercent  *int // the driver's utilisation over its last sample period; nil when it reports none
	// Unusable says why workers cannot use the device ("": they can). The
	// device is still reported, but no worker is placed on it.
	Unusable string
}

// Inventory reports the node's devices as they are now.
type Inventory interface {
	Devices(ctx context.Context) ([]Device, error)
	Close() error
}

// ErrNoNVML is returned by OpenNVML when the NVML library cannot be loaded
// or reports no device.
var ErrNoNVML = errors.New("no NVML devices")

// Detect returns the CUDA inventory when NVML loads and reports at least
// one GPU (its CPU offered after the GPUs), otherwise the CPU inventory. NVML errors other than a missing
// library are logged; the node then offers its CPU. The CUDA devices are
// usable only when the CUDA backend library is beside the binary and
// loads (FindCUDABackend); otherwise they are reported unusable, with why.
func Detect(logger *slog.Logger) Inventory {
	drv, err := OpenNVML()
	if err == nil {
		b := FindCUDABackend(BackendDir())
		if b.Err != nil {
			logger.Warn("CUDA devices are unusable: no usable CUDA backend", "err", b.Err)
		} else {
			logger.Info("CUDA backend found", "path", b.Path, "needs_cuda", FormatCUDAVersion(b.NeedCUDA))
		}
		return &CUDA{Driver: drv, Backend: b, CPU: &CPU{}}
	}
	if !errors.Is(err, ErrNoNVML) {
		logger.Warn("NVML unusable, offering the CPU device", "err", err)
	} else {
		logger.Info("no NVIDIA GPU found, offering the CPU device")
	}
	return CPU{}
}

// CPU is the inventory of a node without a GPU: one device, id 0, whose
// budget is system memory read from /proc/meminfo.
type CPU struct {
	// MeminfoPath overrides /proc/meminfo (tests).
	MeminfoPath string
}

// Devices returns the single CPU device with total and available memory.
func (c CPU) Devices(context.Context) ([]Device, error) {
	path := c.MeminfoPath
	if path == "" {
		path = "/proc/meminfo"
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read system memory: %w", err)
	}
	defer f.Close()
	total, avail, err := ParseMeminfo(f)
	if err != nil {
		return nil, err
	}
	return []Device{{ID: 0, Kind: KindCPU, Name: cpuName(), TotalBytes: total, FreeBytes: avail}}, nil
}

// Close does nothing.
func (CPU) Close() error { return nil }

// ParseMeminfo reads MemTotal and MemAvailable (bytes) from /proc/meminfo
// text. Kernels older than 3.14 lack MemAvailable; MemFree is used then.
func ParseMeminfo(r io.Reader) (total, available uint64, err error) {
	var free uint64
	var haveAvail bool
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		key, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			continue
		}
		n, perr := strconv.ParseUint(fields[0], 10, 64)
		if perr != nil {
			return 0, 0, fmt.Errorf("meminfo %s: %w", key, perr)
		}
		if len(fields) > 1 && fields[1] == "kB" {
			n *= 1024
		}
		switch key {
		case "MemTotal":
			total = n
		case "MemAvailable":
			available, haveAvail = n, true
		case "MemFree":
			free = n
		}
	}
	if err := sc.Err(); err != nil {
		return 0, 0, fmt.Errorf("meminfo: %w", err)
	}
	if total == 0 {
		return 0, 0, errors.New("meminfo has no MemTotal")
	}
	if !haveAvail {
		available = free
	}
	return total, available, nil
}

// cpuName is the CPU's model name, read once.
var cpuName = sync.OnceValue(func() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return "cpu"
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "cpu"
})

// CapCPU is inv with its CPU device offering at most limit bytes: its
// total is limit (or the machine's, when smaller) and its free memory no
// more than that (the hive subtracts what its workers hold).
func CapCPU(inv Inventory, limit uint64) Inventory { return cappedCPU{inv, limit} }

type cappedCPU struct {
	Inventory
	limit uint64
}

func (c cappedCPU) Devices(ctx context.Context) ([]Device, error) {
	devs, err := c.Inventory.Devices(ctx)
	for i := range devs {
		if devs[i].Kind == KindCPU {
			devs[i].TotalBytes = min(devs[i].TotalBytes, c.limit)
			devs[i].FreeBytes = min(devs[i].FreeBytes, c.limit)
		}
	}
	return devs, err
}
