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
	v3, v4 := exe+"-"+V3, exe+"-"+V4
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
	refuse := func(env, want string) {
		t.Helper()
		Name = Portable
		t.Setenv(Env, env)
		if c, err := Choose(exe); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s=%q: %+v %v, want an error saying %q", Env, env, c, err, want)
		}
	}

	// No siblings: the portable build stays, saying why.
	switch {
	case SupportsV4():
		check(Portable, "", Choice{exe, Portable, "this CPU has x86-64-v4, but there is no executable apiary-x86-64-v4 beside apiary; this CPU has x86-64-v3, but there is no executable apiary-x86-64-v3"})
	case SupportsV3():
		check(Portable, "", Choice{exe, Portable, "this CPU lacks x86-64-v4"})
		check(Portable, "", Choice{exe, Portable, "no executable apiary-x86-64-v3 beside apiary"})
	default:
		check(Portable, "", Choice{exe, Portable, "this CPU lacks x86-64-v3"})
	}
	write(v3, 0o644) // not executable
	if SupportsV3() {
		check(Portable, "", Choice{exe, Portable, "no executable apiary-x86-64-v3"})
	}
	if err := os.Chmod(v3, 0o755); err != nil {
		t.Fatal(err)
	}
	if SupportsV3() {
		check(Portable, "", Choice{v3, V3, "this CPU has x86-64-v3"})
		check(Portable, V3, Choice{v3, V3, Env + "=x86-64-v3"})
	} else {
		check(Portable, "", Choice{exe, Portable, "this CPU lacks x86-64-v3"})
		refuse(V3, "this CPU lacks x86-64-v3 (AVX2, FMA, F16C, BMI2)")
	}
	write(v4, 0o755)
	switch {
	case SupportsV4():
		check(Portable, "", Choice{v4, V4, "this CPU has x86-64-v4"})
		check(Portable, V3, Choice{v3, V3, Env + "=x86-64-v3"})
		check(Portable, V4, Choice{v4, V4, Env + "=x86-64-v4"})
	case SupportsV3():
		check(Portable, "", Choice{v3, V3, "this CPU has x86-64-v3 (AVX2, FMA, F16C, BMI2); this CPU lacks x86-64-v4"})
		refuse(V4, "this CPU lacks x86-64-v4")
	}
	check(Portable, Portable, Choice{exe, Portable, Env + "=portable"})
	if SupportsV4() {
		if err := os.Remove(v4); err != nil {
			t.Fatal(err)
		}
		refuse(V4, "but there is no executable apiary-x86-64-v4 beside apiary")
	}
	check(V3, "", Choice{exe, V3, "this binary is the x86-64-v3 build"})
	check(V4, Portable, Choice{exe, V4, "this binary is the x86-64-v4 build"})
	check("", "", Choice{exe, "", "built without the Makefile"})

	refuse("avx512", `APIARY_CPU_VARIANT="avx512"`)
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

// SupportsV4 must agree with what the kernel says of the CPU.
func TestSupportsV4MatchesCPUInfo(t *testing.T) {
	info, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		t.Fatal(err)
	}
	has := map[string]bool{}
	for line := range strings.SplitSeq(string(info), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "flags" {
			for _, f := range strings.Fields(v) {
				has[f] = true
			}
			break
		}
	}
	want := SupportsV3() && has["avx512f"] && has["avx512bw"] && has["avx512cd"] && has["avx512dq"] && has["avx512vl"] && has["avx512_vnni"]
	if got := SupportsV4(); got != want {
		t.Errorf("SupportsV4() = %v; /proc/cpuinfo flags say %v", got, want)
	}
	if want && Best() != V4 || !want && SupportsV3() && Best() != V3 {
		t.Errorf("Best() = %s", Best())
	}
}
