package testbin

import (
	"embed"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The stand-in GPU: a ggml backend library (standin/backend.c) that
// registers GPU devices whose buffers are host memory and whose compute is
// ggml's CPU backend, and a libnvidia-ml.so.1 (standin/nvml.c) that
// reports those devices and, as their processes, the memory each live
// process of the backend holds. Placed as a worker's CUDA backend and a
// hive's NVML, they run apiary's whole GPU path on a machine without one.

//go:embed standin/*.c standin/*.h
var standinSources embed.FS

// StandinEnv names the stand-in's directory (devices, memory records);
// both libraries read it.
const StandinEnv = "APIARY_STANDIN_GPU_DIR"

// StandinDevice is one stand-in GPU.
type StandinDevice struct {
	TotalBytes uint64
	UUID       string
	Name       string
}

// Standin is a stand-in GPU set up for one test.
type Standin struct {
	// Dir holds the devices file and the memory each process holds.
	Dir string
	// BackendDir holds libggml-cuda.so (the stand-in backend): a
	// worker's or a hive's APIARY_BACKEND_DIR.
	BackendDir string
	// NVMLDir holds libnvidia-ml.so.1 (the stand-in driver): a hive's
	// LD_LIBRARY_PATH.
	NVMLDir string
}

// NewStandin compiles the stand-in libraries with the C compiler against
// the ggml headers of the llama.cpp the worker links and go-nvml's
// nvml.h, and writes devs as its devices.
func NewStandin(t testing.TB, devs ...StandinDevice) *Standin {
	t.Helper()
	root := t.TempDir()
	s := &Standin{Dir: filepath.Join(root, "gpus"), BackendDir: filepath.Join(root, "backend"), NVMLDir: filepath.Join(root, "nvml")}
	src := filepath.Join(root, "src")
	for _, d := range []string{s.Dir, s.BackendDir, s.NVMLDir, src} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	entries, err := standinSources.ReadDir("standin")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := standinSources.ReadFile("standin/" + e.Name())
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(src, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ggml, err := GGMLHeaders()
	if err != nil {
		t.Fatal(err)
	}
	nvml, err := moduleDir("github.com/NVIDIA/go-nvml")
	if err != nil {
		t.Fatal(err)
	}
	// The backend's ggml symbols stay undefined, bound to the worker
	// binary's own ggml when it is loaded.
	cc(t, filepath.Join(s.BackendDir, "libggml-cuda.so"), filepath.Join(src, "backend.c"), append(ggml, src)...)
	cc(t, filepath.Join(s.NVMLDir, "libnvidia-ml.so.1"), filepath.Join(src, "nvml.c"), filepath.Join(nvml, "pkg", "nvml"), src)
	var lines strings.Builder
	for _, d := range devs {
		fmt.Fprintf(&lines, "%d %s %s\n", d.TotalBytes, d.UUID, d.Name)
	}
	if err := os.WriteFile(filepath.Join(s.Dir, "devices"), []byte(lines.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return s
}

// Env is the environment of a process that uses the stand-in: its
// directory, the backend's directory, and the driver on the library path.
func (s *Standin) Env() []string {
	return []string{StandinEnv + "=" + s.Dir, "APIARY_BACKEND_DIR=" + s.BackendDir, "LD_LIBRARY_PATH=" + s.NVMLDir}
}

// Held is what the stand-in records process pid holding on device dev
// (0 when nothing).
func (s *Standin) Held(dev, pid int) uint64 {
	b, err := os.ReadFile(filepath.Join(s.Dir, fmt.Sprintf("dev%d.%d", dev, pid)))
	if err != nil {
		return 0
	}
	var n uint64
	fmt.Sscan(string(b), &n)
	return n
}

func cc(t testing.TB, out, src string, includes ...string) {
	t.Helper()
	args := []string{"-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o", out, src}
	for _, inc := range includes {
		args = append(args, "-I"+inc)
	}
	if b, err := exec.Command("gcc", args...).CombinedOutput(); err != nil {
		t.Fatalf("gcc %s: %v\n%s", filepath.Base(src), err, b)
	}
}

// GGMLHeaders are the include directories of the ggml the worker links
// (its public headers and the private backend header), for libraries
// that bind to it.
func GGMLHeaders() ([]string, error) {
	prefix, err := LlamaPrefix()
	if err != nil {
		return nil, err
	}
	return []string{filepath.Join(prefix, "include")}, nil
}

// moduleDir is where the go tool keeps module mod.
func moduleDir(mod string) (string, error) {
	goTool, root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	cmd := exec.Command(goTool, "list", "-m", "-f", "{{.Dir}}", mod)
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go list -m %s: %w", mod, err)
	}
	return strings.TrimSpace(string(out)), nil
}
