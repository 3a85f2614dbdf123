// Package cpuvariant picks the build of apiary that suits the CPU it runs
// on.
//
// llama.cpp's CPU kernels are chosen when they are compiled. Built with
// -march=x86-64-v3 (AVX2, FMA, F16C) they generate 2.5 times and process
// prompts 7 times as fast as the portable x86-64 build (measured in
// docs/benchmarks.md), and they do not run at all on a CPU without
// those instructions: not even up to main, since the compiler uses them in
// C++ static initialisers too. So `make build` links two binaries from one
// source: bin/apiary, portable, and bin/apiary-x86-64-v3 beside it. The
// portable one is the entry point everywhere; the process that runs
// llama.cpp (a worker) is the v3 one when this CPU has x86-64-v3 and the
// sibling is there. A plain `go build` links one binary of no named
// variant, which never looks for another.
package cpuvariant

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"syscall"

	"golang.org/x/sys/cpu"
)

// Name is this binary's variant, set at link time with
// -ldflags "-X github.com/apiary-llm/apiary/internal/cpuvariant.Name=portable";
// "" for a binary built without the Makefile.
var Name string

// The variants `make build` links.
const (
	Portable = "portable"
	V3       = "x86-64-v3"
)

// Env names the environment variable that keeps a worker on the portable
// build (APIARY_CPU_VARIANT=portable), to compare the two or to rule the
// v3 build out.
const Env = "APIARY_CPU_VARIANT"

// SupportsV3 reports whether this CPU, and the OS for its registers, runs
// x86-64-v3 code.
func SupportsV3() bool {
	x := cpu.X86
	return runtime.GOARCH == "amd64" && x.HasAVX && x.HasAVX2 && x.HasBMI1 && x.HasBMI2 && x.HasF16C && x.HasFMA &&
		x.HasLZCNT && x.HasMOVBE && x.HasOSXSAVE
}

// Choice is the binary that runs llama.cpp on this machine, and why.
type Choice struct {
	Path    string
	Variant string // Portable, V3, or "" (a binary of no named variant)
	Reason  string
}

// Choose returns the binary a worker should run as, given the path of
// this one (os.Executable). It fails only on a bad APIARY_CPU_VARIANT.
func Choose(exe string) (Choice, error) {
	if Name == Portable {
		return ForPortable(exe)
	}
	if err := checkEnv(); err != nil {
		return Choice{}, err
	}
	if Name == "" {
		return Choice{exe, Name, "this binary was built without the Makefile: it is the only build"}, nil
	}
	return Choice{exe, Name, "this binary is the " + Name + " build"}, nil
}

// ForPortable is Choose for a portable build at exe that need not be this
// binary (a hive's --worker-path, a test's $APIARY_BIN): its x86-64-v3
// sibling when this CPU runs it, else exe.
func ForPortable(exe string) (Choice, error) {
	stay := Choice{Path: exe, Variant: Portable}
	if err := checkEnv(); err != nil {
		return Choice{}, err
	}
	switch {
	case os.Getenv(Env) == Portable:
		stay.Reason = Env + "=" + Portable
		return stay, nil
	case !SupportsV3():
		stay.Reason = "this CPU lacks x86-64-v3 (AVX2, FMA, F16C, BMI2)"
		return stay, nil
	}
	sib := exe + "-" + V3
	fi, err := os.Stat(sib)
	if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
		stay.Reason = "this CPU has x86-64-v3, but there is no executable " + filepath.Base(sib) + " beside " + filepath.Base(exe)
		return stay, nil
	}
	return Choice{Path: sib, Variant: V3, Reason: "this CPU has x86-64-v3"}, nil
}

// checkEnv refuses an APIARY_CPU_VARIANT other than portable.
func checkEnv() error {
	if env := os.Getenv(Env); env != "" && env != Portable {
		return fmt.Errorf("%s=%q: the only value it takes is %q (keep workers on the portable build); unset it to pick by CPU", Env, env, Portable)
	}
	return nil
}

// Exec replaces this process with c's binary (same pid, arguments and
// environment) when c is not this binary; it returns only on failure, or
// at once when there is nothing to do.
func Exec(c Choice, self string) error {
	if c.Path == self {
		return nil
	}
	if err := syscall.Exec(c.Path, append([]string{c.Path}, os.Args[1:]...), os.Environ()); err != nil {
		return fmt.Errorf("run the %s build %s: %w", c.Variant, c.Path, err)
	}
	return nil
}
