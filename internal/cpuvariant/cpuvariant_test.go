package cpuvariant

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// level builds dir/libggml-cpu-<name>.so whose ggml_backend_score answers
// score (none: no score function).
func level(t *testing.T, dir, name string, score int) {
	t.Helper()
	src := filepath.Join(t.TempDir(), name+".c")
	code := "int answer(void) { return 1; }\n"
	if score >= 0 {
		code = fmt.Sprintf("int ggml_backend_score(void) { return %d; }\n", score)
	}
	if err := os.WriteFile(src, []byte(code), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := exec.Command("gcc", "-shared", "-fPIC", "-o", filepath.Join(dir, Prefix+name+Suffix), src).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, b)
	}
}

func TestChoose(t *testing.T) {
	dir := t.TempDir()
	level(t, dir, "x64", 1)
	level(t, dir, "haswell", 57)
	level(t, dir, "skylakex", 185)
	level(t, dir, "zen4", 0)
	level(t, dir, "broken", -1)
	if err := os.WriteFile(filepath.Join(dir, Prefix+"garbage"+Suffix), []byte("not a library"), 0o644); err != nil {
		t.Fatal(err)
	}

	t.Setenv(Env, "")
	c, err := Choose(dir)
	if err != nil || c.Name != "skylakex" || c.Score != 185 || c.Path != filepath.Join(dir, Prefix+"skylakex"+Suffix) ||
		!strings.Contains(c.Reason, "the best of the 3 CPU backends this CPU runs (score 185)") ||
		!strings.Contains(c.Reason, "it cannot run zen4, broken (does not load: no ggml_backend_score), garbage (does not load:") {
		t.Errorf("Choose = %+v, %v", c, err)
	}

	t.Setenv(Env, "haswell")
	if c, err := Choose(dir); err != nil || c.Name != "haswell" || c.Reason != Env+"=haswell" {
		t.Errorf("forced haswell: %+v, %v", c, err)
	}
	for env, want := range map[string]string{
		"zen4":   `APIARY_CPU_VARIANT="zen4": this CPU cannot run it (it runs skylakex, haswell, x64)`,
		"avx512": `APIARY_CPU_VARIANT="avx512": no such CPU backend in ` + dir + ` (there are broken, garbage, haswell, skylakex, x64, zen4)`,
	} {
		t.Setenv(Env, env)
		if c, err := Choose(dir); err == nil || err.Error() != want {
			t.Errorf("%s=%s: %+v, %v; want %q", Env, env, c, err, want)
		}
	}

	t.Setenv(Env, "")
	empty := t.TempDir()
	if _, err := Choose(empty); err == nil || !strings.Contains(err.Error(), "no CPU backend (libggml-cpu-*.so) in "+empty) {
		t.Errorf("no backends: %v", err)
	}
	none := t.TempDir()
	level(t, none, "zen4", 0)
	if _, err := Choose(none); err == nil || !strings.Contains(err.Error(), "this CPU runs none of the CPU backends in "+none+" (zen4)") {
		t.Errorf("none this CPU runs: %v", err)
	}
}

// TestChooseSkipsALevelWhoseAMXFails: a level built with AMX that scores
// best is passed over, with why, when AMX does not run here (as on the
// H200 machine where it killed the worker with SIGILL), and taken when it
// does; forced, it is refused with the probe's answer.
func TestChooseSkipsALevelWhoseAMXFails(t *testing.T) {
	dir := t.TempDir()
	level(t, dir, "icelake", 1500)
	level(t, dir, "sapphirerapids", 4032)
	t.Setenv(Env, "")
	defer func(f func() error) { AMXUsable = f }(AMXUsable)

	AMXUsable = func() error { return fmt.Errorf("an AMX instruction killed a probe process") }
	c, err := Choose(dir)
	if err != nil || c.Name != "icelake" ||
		!strings.Contains(c.Reason, "it cannot run sapphirerapids (an AMX instruction killed a probe process)") {
		t.Errorf("AMX failing: %+v, %v", c, err)
	}
	t.Setenv(Env, "sapphirerapids")
	if _, err := Choose(dir); err == nil || err.Error() !=
		`APIARY_CPU_VARIANT="sapphirerapids": this CPU cannot run it: an AMX instruction killed a probe process (it runs icelake)` {
		t.Errorf("forced, AMX failing: %v", err)
	}

	t.Setenv(Env, "")
	AMXUsable = func() error { return nil }
	if c, err := Choose(dir); err != nil || c.Name != "sapphirerapids" || c.Score != 4032 {
		t.Errorf("AMX working: %+v, %v", c, err)
	}
}

// TestAMXProbe runs the real probe: in a process of its own, so the test
// binary lives whatever AMX does. On a CPU without AMX the instruction
// kills the probe with SIGILL and the probe says so; asking the kernel
// first (as ggml does) is refused there, which counts as usable (ggml then
// uses no AMX). On a CPU with AMX it says what it found.
func TestAMXProbe(t *testing.T) {
	info, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		t.Fatal(err)
	}
	hasAMX := strings.Contains(string(info), " amx_tile")
	forced := probeAMX(false)
	asked := probeAMX(true)
	t.Logf("CPU reports AMX: %v; instruction without asking: %v; as ggml asks: %v", hasAMX, forced, asked)
	if !hasAMX {
		if forced == nil || !strings.Contains(forced.Error(), "killed a probe process with illegal instruction") {
			t.Errorf("no AMX here, yet the instruction did not kill the probe with SIGILL: %v", forced)
		}
		if asked != nil {
			t.Errorf("no AMX here: the kernel must refuse the tile state, which counts as usable; got %v", asked)
		}
	}
}
