package worker

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	oai "github.com/openai/openai-go"
	"github.com/openai/openai-go/option"

	"github.com/apiary-llm/apiary/internal/cpuvariant"
)

// `make build` links a portable apiary and its x86-64-v3 and x86-64-v4
// builds beside it; a worker started from the portable one runs as the
// best build for this CPU (same pid), and APIARY_CPU_VARIANT picks one
// by name. Every build this CPU runs serves the model.
func TestBinaryRunsTheBuildForThisCPU(t *testing.T) {
	bin := apiaryBin(t)
	for _, v := range cpuvariant.Siblings {
		if _, err := os.Stat(bin + "-" + v); err != nil {
			t.Fatalf("%s has no %s build beside it (%v): build it with `make build`", bin, v, err)
		}
	}
	wantAuto, wantAutoExe := cpuvariant.Best(), bin
	if wantAuto != cpuvariant.Portable {
		wantAutoExe = bin + "-" + wantAuto
	}
	type runCase struct{ name, env, variant, exe string }
	cases := []runCase{
		{"by CPU", "", wantAuto, wantAutoExe},
		{"forced portable", cpuvariant.Env + "=" + cpuvariant.Portable, cpuvariant.Portable, bin},
	}
	for _, v := range cpuvariant.Siblings {
		if cpuvariant.Supports(v) {
			cases = append(cases, runCase{"forced " + v, cpuvariant.Env + "=" + v, v, bin + "-" + v})
		}
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var env []string
			if tc.env != "" {
				env = []string{tc.env}
			}
			p, url := startWorkerBinary(t, env)
			rec := p.waitLog(t, "listening", nil)
			exe, err := os.Readlink("/proc/" + strconv.Itoa(p.cmd.Process.Pid) + "/exe")
			if err != nil {
				t.Fatal(err)
			}
			if rec["cpu_build"] != tc.variant || filepath.Clean(exe) != filepath.Clean(tc.exe) {
				t.Errorf("worker runs %s as %v (%v), want %s as %s", exe, rec["cpu_build"], rec["cpu_build_reason"], tc.exe, tc.variant)
			}
			client := newOpenAIClient(url)
			got, err := client.Completions.New(t.Context(), oai.CompletionNewParams{
				Model: "tiny", Prompt: oai.CompletionNewParamsPromptUnion{OfString: oai.String("Once upon a time")},
				MaxTokens: oai.Int(16), Temperature: oai.Float(0),
			}, option.WithJSONSet("ignore_eos", true))
			if err != nil || len(got.Choices) != 1 || got.Usage.CompletionTokens != 16 || got.Choices[0].Text == "" {
				t.Fatalf("completion on the %s build: %+v %v", tc.variant, got, err)
			}
			t.Logf("%s build: %q", tc.variant, got.Choices[0].Text)
		})
	}

	p := startApiary(t, []string{cpuvariant.Env + "=avx512"}, "worker", "--model", testModelPath(t), "--port", "0")
	if code := p.exitCode(t); code != 2 || !strings.Contains(p.output(), `APIARY_CPU_VARIANT="avx512"`) {
		t.Errorf("bad %s: exit %d, stderr:\n%s", cpuvariant.Env, code, p.output())
	}
}

// emulatedCPU is a CPU without AVX (SSE4.2 at most), for qemu-x86_64.
const emulatedCPU = "Nehalem"

// On a CPU without AVX2 (qemu-user emulating a Nehalem) the v3 build does
// not even start (its C++ static initialisers use AVX: that is why it is
// never the entry point), while the portable apiary runs, stays portable,
// and serves the model.
func TestBinaryRunsWithoutAVX2(t *testing.T) {
	qemu, err := exec.LookPath("qemu-x86_64")
	if err != nil {
		t.Fatalf("this test runs apiary on an emulated CPU without AVX2 and needs qemu-x86_64 (Debian's qemu-user; scripts/deps.sh installs it): %v", err)
	}
	bin := apiaryBin(t)
	for _, v := range cpuvariant.Siblings {
		out, err := exec.Command(qemu, "-cpu", emulatedCPU, bin+"-"+v, "version").CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			t.Fatalf("the %s build ran on an emulated %s (%v): %s; the emulated CPU is not what this test needs", v, emulatedCPU, err, out)
		}
	}
	out, err := exec.Command(qemu, "-cpu", emulatedCPU, bin, "version").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "workers: portable build") || !strings.Contains(string(out), "lacks x86-64-v3") {
		t.Fatalf("apiary version on an emulated %s: %v\n%s", emulatedCPU, err, out)
	}

	p := startCommand(t, nil, qemu, "-cpu", emulatedCPU, bin, "worker", "--model", testModelPath(t), "--port", "0", "--log-json", "--threads", "1")
	rec := p.waitLog(t, "listening", nil)
	if rec["cpu_build"] != cpuvariant.Portable {
		t.Errorf("worker on an emulated %s: cpu build %v (%v), want portable", emulatedCPU, rec["cpu_build"], rec["cpu_build_reason"])
	}
	p.waitLog(t, "worker status changed", func(r map[string]any) bool { return r["to"] == "ready" })
	addr, _ := rec["addr"].(string)
	client := newOpenAIClient("http://" + addr)
	got, err := client.Completions.New(t.Context(), oai.CompletionNewParams{
		Model: "tiny", Prompt: oai.CompletionNewParamsPromptUnion{OfString: oai.String("Once upon a time")},
		MaxTokens: oai.Int(8), Temperature: oai.Float(0),
	}, option.WithJSONSet("ignore_eos", true))
	if err != nil || len(got.Choices) != 1 || got.Usage.CompletionTokens != 8 || got.Choices[0].Text == "" {
		t.Fatalf("completion on an emulated %s: %+v %v", emulatedCPU, got, err)
	}
}
