package gpu

import (
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseMeminfo(t *testing.T) {
	tests := []struct {
		name        string
		in          string
		total, free uint64
		wantErr     bool
	}{
		{"available", "MemTotal:       24000000 kB\nMemFree:        1000 kB\nMemAvailable:   20000000 kB\n", 24000000 * 1024, 20000000 * 1024, false},
		{"old kernel uses MemFree", "MemTotal: 2048 kB\nMemFree: 1024 kB\n", 2048 * 1024, 1024 * 1024, false},
		{"no total", "MemFree: 1 kB\n", 0, 0, true},
		{"garbage number", "MemTotal: x kB\n", 0, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			total, free, err := ParseMeminfo(strings.NewReader(tt.in))
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if total != tt.total || free != tt.free {
				t.Errorf("got %d/%d, want %d/%d", total, free, tt.total, tt.free)
			}
		})
	}
}

func TestCPUDeviceUsesSystemMemory(t *testing.T) {
	p := filepath.Join(t.TempDir(), "meminfo")
	if err := os.WriteFile(p, []byte("MemTotal: 4096 kB\nMemAvailable: 1024 kB\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	devs, err := CPU{MeminfoPath: p}.Devices(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(devs) != 1 || devs[0].Kind != KindCPU || devs[0].ID != 0 || devs[0].TotalBytes != 4096*1024 || devs[0].FreeBytes != 1024*1024 {
		t.Errorf("devices = %+v", devs)
	}
}

// On machines without an NVIDIA driver (CI) NVML must be reported absent,
// not as a failure, and Detect must fall back to the CPU device.
func TestDetectWithoutNVMLOffersCPU(t *testing.T) {
	inv, err := OpenNVML()
	if err == nil {
		defer inv.Close()
		devs, derr := (&CUDA{Driver: inv}).Devices(t.Context())
		if derr != nil || len(devs) == 0 {
			t.Fatalf("NVML present but Devices = %v, %v", devs, derr)
		}
		t.Logf("NVML present: %d GPUs", len(devs))
		return
	}
	if !errors.Is(err, ErrNoNVML) {
		t.Fatalf("OpenNVML error %v does not wrap ErrNoNVML", err)
	}
	d := Detect(slog.New(slog.NewTextHandler(io.Discard, nil)))
	defer d.Close()
	devs, err := d.Devices(t.Context())
	if err != nil || len(devs) != 1 || devs[0].Kind != KindCPU || devs[0].TotalBytes == 0 {
		t.Fatalf("Detect fallback = %+v, %v", devs, err)
	}
}
