package worker

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/apiary-llm/apiary/internal/gpu"
)

// ggmlSourceDir is the pinned ollama module's vendored ggml sources, whose
// private header a test backend is compiled against.
func ggmlSourceDir(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/ollama/ollama").Output()
	if err != nil {
		t.Fatalf("go list the ollama module: %v", err)
	}
	return filepath.Join(strings.TrimSpace(string(out)), "ml", "backend", "ggml", "ggml")
}

// compileBackend builds C source as dir/libggml-cuda.so with gcc, against
// the vendored ggml headers; the library's ggml symbols stay undefined,
// to be bound to the worker binary's own ggml when it is loaded.
func compileBackend(t *testing.T, dir, src string) {
	t.Helper()
	ggml := ggmlSourceDir(t)
	c := filepath.Join(t.TempDir(), "backend.c")
	if err := os.WriteFile(c, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("gcc", "-shared", "-fPIC", "-I"+filepath.Join(ggml, "include"), "-I"+filepath.Join(ggml, "src"),
		"-o", filepath.Join(dir, gpu.CUDALibrary), c)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, b)
	}
}

// A ggml backend that registers no device; its init calls ggml_time_us,
// which only the worker binary defines.
const noDeviceBackend = `#include "ggml-backend-impl.h"
static const char *name(ggml_backend_reg_t r) { (void)r; return "NoDevice"; }
static size_t count(ggml_backend_reg_t r) { (void)r; return 0; }
static ggml_backend_dev_t get(ggml_backend_reg_t r, size_t i) { (void)r; (void)i; return 0; }
static struct ggml_backend_reg reg;
ggml_backend_reg_t ggml_backend_init(void) {
	ggml_time_us();
	reg.api_version = GGML_BACKEND_API_VERSION;
	reg.iface.get_name = name;
	reg.iface.get_device_count = count;
	reg.iface.get_device = get;
	return &reg;
}
`

// A worker asked for a GPU it cannot use exits 1 with one line saying
// why, and never serves from the CPU: no backend library, a library that
// is no ggml backend, one whose init fails, and a backend (loaded, bound
// to the binary's ggml) without that GPU.
func TestWorkerRefusesAGPUItCannotUse(t *testing.T) {
	model := testModelPath(t)
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, dir string)
		want  string
	}{
		{"no backend library", func(*testing.T, string) {}, "is not there"},
		{"not a ggml backend", func(t *testing.T, dir string) { compileBackend(t, dir, "int answer(void) { return 42; }\n") },
			"is not a ggml backend (it has no ggml_backend_init)"},
		{"a backend whose init fails", func(t *testing.T, dir string) {
			compileBackend(t, dir, "#include \"ggml-backend-impl.h\"\nggml_backend_reg_t ggml_backend_init(void) { return 0; }\n")
		}, "ggml could not load the backend"},
		{"a backend without the GPU", func(t *testing.T, dir string) { compileBackend(t, dir, noDeviceBackend) },
			"sees 0 GPU(s); there is no GPU 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			tc.setup(t, dir)
			p := startApiary(t, []string{gpu.BackendDirEnv + "=" + dir}, "worker", "--model", model, "--port", "0", "--gpu-device", "0")
			code := p.exitCode(t)
			out := p.output()
			lines := strings.Split(strings.TrimSpace(out), "\n")
			last := lines[len(lines)-1]
			if code != 1 || !strings.Contains(last, "--gpu-device 0: no usable GPU backend") || !strings.Contains(last, tc.want) ||
				!strings.Contains(last, filepath.Join(dir, gpu.CUDALibrary)) {
				t.Errorf("exit %d, want 1 with a last line naming the library and %q; stderr:\n%s", code, tc.want, out)
			}
			if strings.Contains(out, "listening") || strings.Contains(out, "model loaded") {
				t.Errorf("the worker went on without its GPU:\n%s", out)
			}
			t.Logf("stderr:\n%s", out)
		})
	}
}
