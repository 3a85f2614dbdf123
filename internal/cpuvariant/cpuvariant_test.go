package cpuvariant

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestChoose(t *testing.T) {
	dir := t.TempDir()
	exe := filepath.Join(dir, "apiary")
	sib := exe + "-" + V3
	write := func(path string, mode os.FileMode) {
		t.Helper()
		if err := os.WriteFile(path, []byte("#!/bin/false\n"), mode); err != nil {
			t.Fatal(err)
		}
	}
	write(exe, 0o755)
	defer func(n string) { Name = n }(Name)

	check := func(name, env string, want Choice) {
		t.Helper()
		Name = name
		t.Setenv(Env, env)
		got, err := Choose(exe)
		if err != nil || got.Path != want.Path || got.Variant != want.Variant || !strings.Contains(got.Reason, want.Reason) {
			t.Errorf("Name %q, %s=%q: %+v %v, want %+v", name, Env, env, got, err, want)
		}
	}
	// No sibling: the portable build stays, and says why.
	if SupportsV3() {
		check(Portable, "", Choice{exe, Portable, "no executable apiary-x86-64-v3 beside apiary"})
	} else {
		check(Portable, "", Choice{exe, Portable, "this CPU lacks x86-64-v3"})
	}
	write(sib, 0o644)
	if SupportsV3() {
		check(Portable, "", Choice{exe, Portable, "no executable apiary-x86-64-v3"})
	}
	if err := os.Chmod(sib, 0o755); err != nil {
		t.Fatal(err)
	}
	if SupportsV3() {
		check(Portable, "", Choice{sib, V3, "this CPU has x86-64-v3"})
	} else {
		check(Portable, "", Choice{exe, Portable, "this CPU lacks x86-64-v3"})
	}
	check(Portable, Portable, Choice{exe, Portable, Env + "=portable"})
	check(V3, "", Choice{exe, V3, "this binary is the x86-64-v3 build"})
	check(V3, Portable, Choice{exe, V3, "this binary is the x86-64-v3 build"})
	check("", "", Choice{exe, "", "built without the Makefile"})

	Name = Portable
	t.Setenv(Env, "avx512")
	if _, err := Choose(exe); err == nil || !strings.Contains(err.Error(), `APIARY_CPU_VARIANT="avx512"`) {
		t.Errorf("bad %s: %v", Env, err)
	}
}

// The machine this runs on is amd64 with AVX2 in CI; SupportsV3 must agree
// with what the kernel says of the CPU.
func TestSupportsV3MatchesCPUInfo(t *testing.T) {
	info, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		t.Fatal(err)
	}
	var flags []string
	for line := range strings.SplitSeq(string(info), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "flags" {
			flags = strings.Fields(v)
			break
		}
	}
	has := map[string]bool{}
	for _, f := range flags {
		has[f] = true
	}
	want := has["avx"] && has["avx2"] && has["bmi1"] && has["bmi2"] && has["f16c"] && has["fma"] && has["abm"] && has["movbe"] && has["xsave"]
	if got := SupportsV3(); got != want {
		t.Errorf("SupportsV3() = %v; /proc/cpuinfo flags say %v (%v)", got, want, flags)
	}
}
