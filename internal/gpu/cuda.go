package gpu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Driver is the GPU driver as the inventory reads it: NVML on a node, a
// scripted fake in tests.
type Driver interface {
	DeviceCount() (int, error)
	// Device reads device i now (memory, name, temperature).
	Device(i int) (Device, error)
	// CUDAVersion is the newest CUDA version the driver supports, as
	// 1000*major + 10*minor (12040 is 12.4).
	CUDAVersion() (int, error)
	// Processes lists the processes that hold memory on device i.
	Processes(i int) ([]Process, error)
	Close() error
}

// Process is a process holding memory on a GPU, as the driver reports it.
type Process struct {
	PID       int
	UsedBytes uint64
}

// ProcessLister is an inventory whose driver reports which processes hold
// memory on a device (CUDA); the CPU inventory is not one.
type ProcessLister interface {
	Processes(ctx context.Context, device int) ([]Process, error)
}

// CUDA is the inventory of a node's NVIDIA GPUs. A device is usable only
// when the CUDA backend is (Backend.Err is nil) and the driver supports
// the CUDA version the backend was built for.
type CUDA struct {
	Driver  Driver
	Backend CUDABackend
	// CPU, when set, is the node's CPU, offered after its GPUs (its ID
	// is the number of GPUs): a GPU node serves from its CPU too, where
	// a model fits no GPU or the GPUs are unusable.
	CPU *CPU
}

// Devices reads every GPU now, each marked unusable when workers could
// not run on it.
func (c *CUDA) Devices(context.Context) ([]Device, error) {
	n, err := c.Driver.DeviceCount()
	if err != nil {
		return nil, err
	}
	why := c.unusable()
	devs := make([]Device, 0, n)
	for i := range n {
		d, err := c.Driver.Device(i)
		if err != nil {
			return nil, err
		}
		d.ID, d.Kind, d.Unusable = i, KindCUDA, why
		devs = append(devs, d)
	}
	if c.CPU != nil {
		cpu, err := c.CPU.Devices(context.Background())
		if err != nil {
			return nil, err
		}
		for _, d := range cpu {
			d.ID = n + d.ID
			devs = append(devs, d)
		}
	}
	return devs, nil
}

// unusable is why no worker can use this node's GPUs, or "".
func (c *CUDA) unusable() string {
	if c.Backend.Err != nil {
		return c.Backend.Err.Error()
	}
	have, err := c.Driver.CUDAVersion()
	if err != nil {
		return fmt.Sprintf("the driver's CUDA version is unknown: %v", err)
	}
	if need := c.Backend.NeedCUDA; need > 0 && have < need {
		return fmt.Sprintf("the driver supports CUDA %s; the backend %s needs %s or newer", FormatCUDAVersion(have), c.Backend.Path, FormatCUDAVersion(need))
	}
	return ""
}

// Processes lists the processes holding memory on device id.
func (c *CUDA) Processes(_ context.Context, id int) ([]Process, error) {
	return c.Driver.Processes(id)
}

// Close closes the driver.
func (c *CUDA) Close() error { return c.Driver.Close() }

// CUDALibrary is the file name of llama.cpp's CUDA backend, as ggml names
// it.
const CUDALibrary = "libggml-cuda.so"

// CUDAVersionFile, beside the backend, holds the CUDA version it was
// built with ("12.4"), written by scripts/gpu-proof.sh.
const CUDAVersionFile = "libggml-cuda.cuda-version"

// BackendDirEnv overrides where the GPU backend libraries are looked for.
const BackendDirEnv = "APIARY_BACKEND_DIR"

// BackendDir is where GPU backend libraries are looked for: $APIARY_BACKEND_DIR,
// else the directory of the running binary (bin/ beside bin/apiary).
func BackendDir() string {
	if d := os.Getenv(BackendDirEnv); d != "" {
		return d
	}
	exe, err := os.Executable()
	if err != nil {
		return "."
	}
	if r, err := filepath.EvalSymlinks(exe); err == nil {
		exe = r
	}
	return filepath.Dir(exe)
}

// CUDABackend is the node's CUDA backend library: where it was looked for,
// whether it can be loaded, and the CUDA version it needs.
type CUDABackend struct {
	Path     string
	Err      error // nil: the file is there and is a ggml backend
	NeedCUDA int   // 1000*major + 10*minor; 0 when not recorded
}

// ErrNoBackend is a backend library that is missing or cannot be used.
var ErrNoBackend = errors.New("no usable GPU backend")

// FindCUDABackend looks for the CUDA backend in dir and checks that it
// loads and is a ggml backend (CheckBackendLibrary).
func FindCUDABackend(dir string) CUDABackend {
	b := CUDABackend{Path: filepath.Join(dir, CUDALibrary)}
	if err := CheckBackendLibrary(b.Path); err != nil {
		b.Err = err
		return b
	}
	raw, err := os.ReadFile(filepath.Join(dir, CUDAVersionFile))
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		b.Err = fmt.Errorf("%w: %v", ErrNoBackend, err)
	default:
		v, perr := ParseCUDAVersion(strings.TrimSpace(string(raw)))
		if perr != nil {
			b.Err = fmt.Errorf("%w: %s: %v", ErrNoBackend, filepath.Join(dir, CUDAVersionFile), perr)
		}
		b.NeedCUDA = v
	}
	return b
}

// ParseCUDAVersion reads "12.4" as 12040.
func ParseCUDAVersion(s string) (int, error) {
	maj, min, ok := strings.Cut(s, ".")
	a, err1 := strconv.Atoi(maj)
	b, err2 := strconv.Atoi(min)
	if !ok || err1 != nil || err2 != nil || a < 1 || b < 0 || b > 99 {
		return 0, fmt.Errorf("%q is not a CUDA version (want MAJOR.MINOR, e.g. 12.4)", s)
	}
	return a*1000 + b*10, nil
}

// FormatCUDAVersion writes 12040 as "12.4" (0: "unknown").
func FormatCUDAVersion(v int) string {
	if v <= 0 {
		return "unknown"
	}
	return fmt.Sprintf("%d.%d", v/1000, v%1000/10)
}
