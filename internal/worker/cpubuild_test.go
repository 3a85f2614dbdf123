package worker

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/apiary-llm/apiary/internal/cpuvariant"
)

// `make build` puts one CPU backend per instruction-set level beside
// bin/apiary; a worker loads the best one this CPU runs, and
// APIARY_CPU_VARIANT names another. Every level this CPU runs serves the
// model; one it cannot run, or no such level, is refused with exit 2.
func TestBinaryLoadsTheCPUBackendForThisCPU(t *testing.T) {
	bin := apiaryBin(t)
	levels, err := cpuvariant.Levels(filepath.Dir(bin))
	if err != nil || len(levels) < 2 {
		t.Fatalf("CPU backends beside %s: %+v, %v; build with `make build`", bin, levels, err)
	}
	best := levels[0]
	type runCase struct{ name, env, want string }
	cases := []runCase{{"by CPU", "", best.Name}}
	var cannot string
	for _, l := range levels {
		switch {
		case l.Score > 0 && (l.Name == "x64" || l.Name == "sse42" || l.Name == "haswell"):
			cases = append(cases, runCase{"forced " + l.Name, cpuvariant.Env + "=" + l.Name, l.Name})
		case l.Score == 0:
			cannot = l.Name
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
			if rec["cpu_backend"] != tc.want {
				t.Errorf("worker loaded the %v CPU backend (%v), want %s", rec["cpu_backend"], rec["cpu_backend_reason"], tc.want)
			}
			maps := procMaps(t, p.cmd.Process.Pid)
			if !strings.Contains(maps, filepath.Join(filepath.Dir(bin), cpuvariant.Prefix+tc.want+cpuvariant.Suffix)) {
				t.Errorf("the worker's memory maps no %s%s%s beside %s", cpuvariant.Prefix, tc.want, cpuvariant.Suffix, bin)
			}
			greedy(t, url, "tiny", "Once upon a time", 8, tc.want)
		})
	}

	refused := map[string]string{"avx512": `APIARY_CPU_VARIANT="avx512": no such CPU backend`}
	if cannot != "" {
		refused[cannot] = `APIARY_CPU_VARIANT="` + cannot + `": this CPU cannot run it`
	}
	for env, want := range refused {
		p := startApiary(t, []string{cpuvariant.Env + "=" + env}, "worker", "--model", testModelPath(t), "--port", "0")
		if code := p.exitCode(t); code != 2 || !strings.Contains(p.output(), want) {
			t.Errorf("%s=%s: exit %d, want 2 saying %q; stderr:\n%s", cpuvariant.Env, env, code, want, p.output())
		}
	}

	out, err := exec.Command(bin, "version").Output()
	if err != nil || !strings.Contains(string(out), "llama.cpp: v0.5.0 de3ff815ea7d559ee917f063901b8986f038abc6 2026-09-28") ||
		!strings.Contains(string(out), "CPU backend: "+best.Name+", ") {
		t.Errorf("apiary version: %v\n%s", err, out)
	}
}

// emulatedCPU is a CPU without AVX (SSE4.2 at most), for qemu-x86_64.
const emulatedCPU = "Nehalem"

// On a CPU without AVX (qemu-user emulating a Nehalem) the same apiary
// loads the CPU backend for it (sse42), says so, and serves the model.
func TestBinaryRunsWithoutAVX(t *testing.T) {
	qemu, err := exec.LookPath("qemu-x86_64")
	if err != nil {
		t.Fatalf("this test runs apiary on an emulated CPU without AVX and needs qemu-x86_64 (Debian's qemu-user; scripts/deps.sh installs it): %v", err)
	}
	bin := apiaryBin(t)
	out, err := exec.Command(qemu, "-cpu", emulatedCPU, bin, "version").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "CPU backend: sse42,") || !strings.Contains(string(out), "it cannot run") {
		t.Fatalf("apiary version on an emulated %s: %v\n%s", emulatedCPU, err, out)
	}

	p := startCommand(t, nil, qemu, "-cpu", emulatedCPU, bin, "worker", "--model", testModelPath(t), "--port", "0", "--log-json", "--threads", "1")
	rec := p.waitLog(t, "listening", nil)
	if rec["cpu_backend"] != "sse42" {
		t.Errorf("worker on an emulated %s: CPU backend %v (%v), want sse42", emulatedCPU, rec["cpu_backend"], rec["cpu_backend_reason"])
	}
	p.waitLog(t, "worker status changed", func(r map[string]any) bool { return r["to"] == "ready" })
	addr, _ := rec["addr"].(string)
	greedy(t, "http://"+addr, "tiny", "Once upon a time", 8, "an emulated "+emulatedCPU)
}

// procMaps is the memory map of process pid.
func procMaps(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
