package worker

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	oai "github.com/openai/openai-go"
	"github.com/openai/openai-go/option"

	"github.com/apiary-llm/apiary/internal/gpu"
	"github.com/apiary-llm/apiary/internal/testbin"
	"github.com/apiary-llm/apiary/internal/testmodel"
)

// compileBackend builds C source as dir/libggml-cuda.so with gcc, against
// the vendored ggml headers; the library's ggml symbols stay undefined,
// to be bound to the worker binary's own ggml when it is loaded.
func compileBackend(t *testing.T, dir, src string) {
	t.Helper()
	ggml, err := testbin.GGMLHeaders()
	if err != nil {
		t.Fatal(err)
	}
	c := filepath.Join(t.TempDir(), "backend.c")
	if err := os.WriteFile(c, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("gcc", "-shared", "-fPIC", "-I"+ggml[0], "-o", filepath.Join(dir, gpu.CUDALibrary), c)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, b)
	}
}

// A ggml backend that registers no device; its init calls ggml_time_us,
// which the worker's libggml-base defines.
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

// standinGPUs are two stand-in GPUs (internal/testbin/standin): device 1
// is the roomier.
func standinGPUs(t *testing.T) *testbin.Standin {
	return testbin.NewStandin(t,
		testbin.StandinDevice{TotalBytes: 4 << 30, UUID: "GPU-00000000-standin-0", Name: "Stand-in GPU 4 GiB"},
		testbin.StandinDevice{TotalBytes: 8 << 30, UUID: "GPU-00000000-standin-1", Name: "Stand-in GPU 8 GiB"})
}

// greedy is the greedy completion of n tokens of prompt from model by
// the OpenAI-compatible server at url (a worker, or llama-server), past end
// of text (what is run on is in what, for the failure).
func greedy(t *testing.T, url, model, prompt string, n int, what string) string {
	t.Helper()
	client := newOpenAIClient(url)
	got, err := client.Completions.New(t.Context(), oai.CompletionNewParams{
		Model: oai.CompletionNewParamsModel(model), Prompt: oai.CompletionNewParamsPromptUnion{OfString: oai.String(prompt)},
		MaxTokens: oai.Int(int64(n)), Temperature: oai.Float(0),
	}, option.WithJSONSet("ignore_eos", true))
	if err != nil || len(got.Choices) != 1 || got.Usage.CompletionTokens != int64(n) || got.Choices[0].Text == "" {
		t.Fatalf("completion with %s: %+v %v", what, got, err)
	}
	return got.Choices[0].Text
}

// A worker on --gpu-device 1 of a GPU backend (the stand-in: host memory,
// ggml's CPU compute) loads the model onto that device: every layer
// offloaded, the model's memory held on device 1 and none on device 0;
// it generates exactly the CPU worker's greedy output, and its memory
// goes back when it ends. (Before the fix, the device list passed to C
// was Go memory and the cgo check panicked here.)
func TestWorkerOffloadsToAGPU(t *testing.T) {
	s := standinGPUs(t)
	_, cpuURL := startWorkerBinary(t, nil)
	want := greedy(t, cpuURL, "tiny", "Once upon a time", 32, "the CPU")

	p, url := startWorkerBinary(t, s.Env(), "--gpu-device", "1", "--log-level", "debug")
	if got := greedy(t, url, "tiny", "Once upon a time", 32, "GPU 1"); got != want {
		t.Errorf("greedy output on the GPU %q, on the CPU %q", got, want)
	}
	out := p.output()
	if m := regexp.MustCompile(`offloaded (\d+)/(\d+) layers to GPU`).FindStringSubmatch(out); m == nil || m[1] != m[2] {
		t.Errorf("not every layer offloaded (%v); log:\n%s", m, out)
	}
	pid := p.cmd.Process.Pid
	held0, held1 := s.Held(0, pid), s.Held(1, pid)
	st, err := os.Stat(testModelPath(t))
	if err != nil {
		t.Fatal(err)
	}
	if held0 != 0 || held1 < uint64(st.Size())/2 {
		t.Errorf("device 0 holds %d bytes, device 1 %d, for a model of %d bytes: want it all on device 1", held0, held1, st.Size())
	}
	p.signal(t, syscall.SIGTERM)
	if code := p.exitCode(t); code != 0 {
		t.Errorf("exit %d after SIGTERM; log:\n%s", code, p.output())
	}
	if h := s.Held(1, pid); h != 0 {
		t.Errorf("device 1 still records %d bytes of the ended worker", h)
	}
	if strings.Contains(out, "panic") {
		t.Errorf("log has a panic:\n%s", out)
	}
}

// A model that does not fit the GPU's memory: the worker refuses with
// one line and exit 1, never a panic, and holds nothing on the device.
func TestWorkerRefusesAModelTooBigForTheGPU(t *testing.T) {
	s := testbin.NewStandin(t, testbin.StandinDevice{TotalBytes: 64 << 10, UUID: "GPU-00000000-standin-small", Name: "Stand-in GPU 64 KiB"})
	p := startApiary(t, s.Env(), "worker", "--model", testModelPath(t), "--port", "0", "--gpu-device", "0")
	code := p.exitCode(t)
	out := p.output()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 1 || !strings.Contains(lines[len(lines)-1], "could not load") || strings.Contains(out, "panic") {
		t.Errorf("exit %d, want 1 with a last line saying the model could not load; stderr:\n%s", code, out)
	}
	if h := s.Held(0, p.cmd.Process.Pid); h != 0 {
		t.Errorf("the device still records %d bytes of the ended worker", h)
	}
}

// A model split over two GPUs (--gpu-devices 0,1, the layer split): each
// stand-in GPU is too small for the whole model, as a worker on one GPU
// holds it; the split worker loads it over both, each holds a part, its
// greedy output is the CPU worker's exactly, and both devices record
// nothing once it ends.
func TestWorkerSplitsAModelOverTwoGPUs(t *testing.T) {
	s := standinGPUs(t)
	// A model whose weights outweigh llama.cpp's compute buffers (the
	// default test model's do not), as a model too big for a GPU's do.
	model := filepath.Join(t.TempDir(), "tiny.gguf")
	if err := testmodel.WriteFile(model, testmodel.Options{Seed: 7, Layers: 8, Dim: 256}); err != nil {
		t.Fatal(err)
	}
	_, cpuURL := startWorkerBinaryOn(t, model, nil, "--ctx-size", "512")
	want := greedy(t, cpuURL, "tiny", "Once upon a time", 32, "the CPU")

	// What the model takes on one GPU sizes the two small ones.
	one, url := startWorkerBinaryOn(t, model, s.Env(), "--ctx-size", "512", "--gpu-device", "1")
	greedy(t, url, "tiny", "Once upon a time", 4, "GPU 1")
	whole := s.Held(1, one.cmd.Process.Pid)
	one.signal(t, syscall.SIGTERM)
	one.exitCode(t)
	if whole == 0 {
		t.Fatal("the one-GPU worker held nothing on its GPU")
	}
	small := whole * 3 / 4
	split := testbin.NewStandin(t,
		testbin.StandinDevice{TotalBytes: small, UUID: "GPU-00000000-standin-split-0", Name: "Stand-in GPU a"},
		testbin.StandinDevice{TotalBytes: small, UUID: "GPU-00000000-standin-split-1", Name: "Stand-in GPU b"})

	// One of them alone cannot hold it.
	refused := startApiary(t, split.Env(), "worker", "--model", model, "--ctx-size", "512", "--port", "0", "--gpu-device", "0")
	if code := refused.exitCode(t); code != 1 {
		t.Fatalf("a model of %d bytes on a GPU of %d: exit %d, want 1; log:\n%s", whole, small, code, refused.output())
	}

	p, url := startWorkerBinaryOn(t, model, split.Env(), "--ctx-size", "512", "--gpu-devices", "0,1", "--log-level", "debug")
	if got := greedy(t, url, "tiny", "Once upon a time", 32, "GPUs 0 and 1"); got != want {
		t.Errorf("greedy output split over two GPUs %q, on the CPU %q", got, want)
	}
	out := p.output()
	if m := regexp.MustCompile(`offloaded (\d+)/(\d+) layers to GPU`).FindStringSubmatch(out); m == nil || m[1] != m[2] {
		t.Errorf("not every layer offloaded (%v); log:\n%s", m, out)
	}
	if !strings.Contains(out, "splitting the model over GPUs") {
		t.Errorf("no line of the split in the log:\n%s", out)
	}
	pid := p.cmd.Process.Pid
	held0, held1 := split.Held(0, pid), split.Held(1, pid)
	t.Logf("one GPU: %d bytes; split: %d on device 0, %d on device 1", whole, held0, held1)
	if held0 == 0 || held1 == 0 || held0 > small || held1 > small {
		t.Errorf("device 0 holds %d bytes, device 1 %d, each of %d: want a part of the model on each", held0, held1, small)
	}
	p.signal(t, syscall.SIGTERM)
	if code := p.exitCode(t); code != 0 {
		t.Errorf("exit %d after SIGTERM; log:\n%s", code, p.output())
	}
	if h0, h1 := split.Held(0, pid), split.Held(1, pid); h0 != 0 || h1 != 0 {
		t.Errorf("the ended worker still records %d bytes on device 0, %d on device 1", h0, h1)
	}
	if strings.Contains(out, "panic") {
		t.Errorf("log has a panic:\n%s", out)
	}
}

// --gpu-devices and --split-mode refuse what cannot be meant: exit 2.
func TestWorkerGPUDevicesUsage(t *testing.T) {
	for _, args := range [][]string{
		{"--gpu-devices", "0,0"},
		{"--gpu-devices", "0,-1"},
		{"--gpu-devices", "0,1", "--gpu-device", "0"},
		{"--gpu-devices", "0,1", "--split-mode", "tensor"},
	} {
		p := startApiary(t, nil, append([]string{"worker", "--model", testModelPath(t), "--port", "0"}, args...)...)
		if code := p.exitCode(t); code != 2 {
			t.Errorf("%v: exit %d, want 2; stderr:\n%s", args, code, p.output())
		}
	}
}
