package gpu

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// fakeDriver is a scripted Driver: the devices, CUDA version and process
// lists a test sets.
type fakeDriver struct {
	devs  []Device
	cuda  int
	procs map[int][]Process
}

func (f *fakeDriver) DeviceCount() (int, error)          { return len(f.devs), nil }
func (f *fakeDriver) Device(i int) (Device, error)       { return f.devs[i], nil }
func (f *fakeDriver) CUDAVersion() (int, error)          { return f.cuda, nil }
func (f *fakeDriver) Processes(i int) ([]Process, error) { return f.procs[i], nil }
func (f *fakeDriver) Close() error                       { return nil }

// buildLibrary compiles C source into a shared library named name in dir.
func buildLibrary(t *testing.T, dir, name, src string) string {
	t.Helper()
	c := filepath.Join(t.TempDir(), "lib.c")
	if err := os.WriteFile(c, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, name)
	if b, err := exec.Command("gcc", "-shared", "-fPIC", "-o", out, c).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, b)
	}
	return out
}

// A library with ggml_backend_init; the check never calls it.
const backendSource = "void *ggml_backend_init(void) { return 0; }\n"

func TestCheckBackendLibrary(t *testing.T) {
	dir := t.TempDir()
	notBackend := buildLibrary(t, dir, "libnot.so", "int answer(void) { return 42; }\n")
	backend := buildLibrary(t, dir, "libggml-cuda.so", backendSource)
	garbage := filepath.Join(dir, "garbage.so")
	if err := os.WriteFile(garbage, []byte("not an ELF file"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, path, want string
	}{
		{"absent", filepath.Join(dir, "missing.so"), "is not there"},
		{"a directory", dir, "is not a regular file"},
		{"not a shared library", garbage, "does not load"},
		{"not a ggml backend", notBackend, "is not a ggml backend (it has no ggml_backend_init)"},
		{"a backend", backend, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckBackendLibrary(tc.path)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("CheckBackendLibrary(%s) = %v, want nil", tc.path, err)
				}
				return
			}
			if err == nil || !errors.Is(err, ErrNoBackend) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), tc.path) {
				t.Fatalf("CheckBackendLibrary(%s) = %v, want ErrNoBackend naming the path and %q", tc.path, err, tc.want)
			}
		})
	}
}

func TestFindCUDABackendReadsItsCUDAVersion(t *testing.T) {
	dir := t.TempDir()
	buildLibrary(t, dir, CUDALibrary, backendSource)
	if b := FindCUDABackend(dir); b.Err != nil || b.NeedCUDA != 0 {
		t.Fatalf("without a version file: %+v", b)
	}
	vf := filepath.Join(dir, CUDAVersionFile)
	if err := os.WriteFile(vf, []byte("12.4\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b := FindCUDABackend(dir); b.Err != nil || b.NeedCUDA != 12040 {
		t.Fatalf("with 12.4: %+v", b)
	}
	if err := os.WriteFile(vf, []byte("twelve"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b := FindCUDABackend(dir); b.Err == nil || !strings.Contains(b.Err.Error(), `"twelve" is not a CUDA version`) {
		t.Fatalf("with a bad version: %+v", b)
	}
	if b := FindCUDABackend(t.TempDir()); b.Err == nil || !strings.Contains(b.Err.Error(), "is not there") {
		t.Fatalf("empty dir: %+v", b)
	}
}

// Every CUDA device is reported; each is unusable, with the reason, when
// the backend is missing or the driver too old for it.
func TestCUDADevicesUsableOnlyWithBackendAndDriver(t *testing.T) {
	drv := &fakeDriver{devs: []Device{{Name: "H100", TotalBytes: 80 << 30, FreeBytes: 79 << 30}, {Name: "H100", TotalBytes: 80 << 30, FreeBytes: 80 << 30}}, cuda: 12020}
	for _, tc := range []struct {
		name    string
		backend CUDABackend
		want    string
	}{
		{"usable", CUDABackend{Path: "/x/" + CUDALibrary, NeedCUDA: 12000}, ""},
		{"version not recorded", CUDABackend{Path: "/x/" + CUDALibrary}, ""},
		{"no backend", CUDABackend{Path: "/x/" + CUDALibrary, Err: errors.New("no usable GPU backend: /x/libggml-cuda.so is not there")}, "no usable GPU backend: /x/libggml-cuda.so is not there"},
		{"driver too old", CUDABackend{Path: "/x/" + CUDALibrary, NeedCUDA: 12040}, "the driver supports CUDA 12.2; the backend /x/libggml-cuda.so needs 12.4 or newer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			devs, err := (&CUDA{Driver: drv, Backend: tc.backend}).Devices(t.Context())
			if err != nil || len(devs) != 2 {
				t.Fatalf("Devices = %+v, %v", devs, err)
			}
			for i, d := range devs {
				if d.ID != i || d.Kind != KindCUDA || d.Unusable != tc.want {
					t.Errorf("device %d = %+v, want unusable %q", i, d, tc.want)
				}
			}
		})
	}
}

func TestParseCUDAVersion(t *testing.T) {
	for in, want := range map[string]int{"12.4": 12040, "11.8": 11080, "13.0": 13000} {
		if v, err := ParseCUDAVersion(in); err != nil || v != want || FormatCUDAVersion(v) != in {
			t.Errorf("ParseCUDAVersion(%q) = %d, %v; want %d", in, v, err, want)
		}
	}
	for _, bad := range []string{"", "12", "12.x", "-1.0", "12.100"} {
		if _, err := ParseCUDAVersion(bad); err == nil {
			t.Errorf("ParseCUDAVersion(%q) accepted", bad)
		}
	}
}

// scripts/gpu-proof.sh, which needs a GPU to run, is at least valid bash,
// and its argument handling answers a mistake with usage and exit 2, and
// a step run out of order with what to run first.
func TestGPUProofScriptArguments(t *testing.T) {
	script, err := filepath.Abs(filepath.Join("..", "..", "scripts", "gpu-proof.sh"))
	if err != nil {
		t.Fatal(err)
	}
	if b, err := exec.Command("bash", "-n", script).CombinedOutput(); err != nil {
		t.Fatalf("bash -n %s: %v\n%s", script, err, b)
	}
	empty := t.TempDir()
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{nil, 2, "scripts/gpu-proof.sh pack OUT"},
		{[]string{"frob", empty}, 2, "unknown step frob (want pack, build, run, all, bench-cpu or cuda)"},
		{[]string{"build"}, 2, "build needs one argument: the output directory"},
		{[]string{"run", empty, "extra"}, 2, "run needs one argument"},
		{[]string{"cuda", empty}, 2, "cuda takes no argument"},
		{[]string{"build", empty}, 1, "no " + empty + "/apiary-proof.tgz: run pack first"},
		{[]string{"run", empty}, 1, "no " + empty + "/bin/apiary: run pack and build first"},
		{[]string{"all", empty}, 1, "apiary-proof.tgz: run pack first"},
		{[]string{"bench-cpu", empty}, 1, "no " + empty + "/bench.test: pack it again"},
	} {
		cmd := exec.Command(script, tc.args...)
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != tc.code || !strings.Contains(string(out), tc.want) {
			t.Errorf("gpu-proof.sh %q: %v, want exit %d and %q; output:\n%s", tc.args, err, tc.code, tc.want, out)
		}
	}
}

// A GPU node offers its CPU after its GPUs, with the next id: a model that
// fits no GPU, or a node whose GPUs are unusable, still has a device.
func TestCUDANodeOffersItsCPU(t *testing.T) {
	drv := &fakeDriver{devs: []Device{{Name: "H100", TotalBytes: 80 << 30, FreeBytes: 79 << 30}, {Name: "H100", TotalBytes: 80 << 30, FreeBytes: 80 << 30}}, cuda: 12020}
	meminfo := filepath.Join(t.TempDir(), "meminfo")
	if err := os.WriteFile(meminfo, []byte("MemTotal: 1024 kB\nMemAvailable: 512 kB\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	devs, err := (&CUDA{Driver: drv, Backend: CUDABackend{Err: errors.New("no backend")}, CPU: &CPU{MeminfoPath: meminfo}}).Devices(t.Context())
	if err != nil || len(devs) != 3 {
		t.Fatalf("Devices = %+v, %v; want 2 GPUs and the CPU", devs, err)
	}
	if c := devs[2]; c.ID != 2 || c.Kind != KindCPU || c.TotalBytes != 1<<20 || c.FreeBytes != 512<<10 || c.Unusable != "" {
		t.Errorf("CPU device = %+v, want id 2, usable, 1 MiB of which 512 KiB free", c)
	}
	if devs[0].Unusable == "" || devs[1].Unusable == "" {
		t.Errorf("GPUs without a backend usable: %+v", devs[:2])
	}
}
