package apiary_test

import (
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// ggml's x86 CPU levels (ggml/src/CMakeLists.txt, GGML_CPU_ALL_VARIANTS).
var cpuLevels = []string{"x64", "sse42", "sandybridge", "ivybridge", "piledriver", "haswell", "skylakex",
	"cannonlake", "cascadelake", "icelake", "cooperlake", "zen4", "alderlake", "sapphirerapids"}

// The CPU levels each LLAMA_CPU_LEVELS builds (scripts/llamacpp.sh
// levels, what its build uses): make demo's (host) and make test's
// (test) are named levels, host's among test's, test's with sse42; all
// is every level. A build of host once made nothing (a
// pipeline in the level list failed under set -e), which only a build
// from cold showed.
func TestLlamaCppLevelsOfEachBuild(t *testing.T) {
	levels := func(mode string) []string {
		t.Helper()
		cmd := exec.Command("scripts/llamacpp.sh", "levels")
		cmd.Env = append(os.Environ(), "LLAMA_CPU_LEVELS="+mode)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("LLAMA_CPU_LEVELS=%s scripts/llamacpp.sh levels: %v", mode, err)
		}
		return strings.Fields(string(out))
	}
	host, test := levels("host"), levels("test")
	if len(host) == 0 || len(host) > 2 {
		t.Errorf("host: %q, want this CPU's best level, and the best without AMX when that is another", host)
	}
	for _, l := range host {
		if !slices.Contains(cpuLevels, l) {
			t.Errorf("host: %q is no level of ggml's", l)
		}
		if !slices.Contains(test, l) {
			t.Errorf("test: %q lacks host's %q", test, l)
		}
	}
	for _, l := range []string{"sse42"} {
		if !slices.Contains(test, l) {
			t.Errorf("test: %q lacks %s", test, l)
		}
	}
	if got := levels("all"); !slices.Equal(got, []string{"all"}) {
		t.Errorf("all: %q", got)
	}
	cmd := exec.Command("scripts/llamacpp.sh", "levels")
	cmd.Env = append(os.Environ(), "LLAMA_CPU_LEVELS=some")
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "want all, host or test") {
		t.Errorf("LLAMA_CPU_LEVELS=some: %v, %s", err, out)
	}
}
