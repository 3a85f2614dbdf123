// Package cpuvariant picks the build of apiary that suits the CPU it runs
// on.
//
// llama.cpp's CPU kernels are chosen when they are compiled. Built with
// -march=x86-64-v3 (AVX2, FMA, F16C) they generate 2.5 times and process
// prompts 7 times as fast as the portable x86-64 build (measured in
// docs/benchmarks.md), and they do not run at all on a CPU without
// those instructions: not even up to main, since the compiler uses them in
// C++ static initialisers too. AVX-512 hosts gain again from a build for
// x86-64-v4 with AVX-512 VNNI. So `make build` links three binaries from
// one source: bin/apiary, portable, and bin/apiary-x86-64-v3 and
// bin/apiary-x86-64-v4 beside it. The portable one is the entry point
// everywhere; the process that runs llama.cpp (a worker) is the best
// sibling this CPU runs. A plain `go build` links one binary of no named
// variant, which never looks for another.
package cpuvariant

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
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
	V4       = "x86-64-v4"
)

// Siblings are the variants a portable binary may find beside it, best
// first. Each is the file apiary-<variant>.
var Siblings = []string{V4, V3}

// Env names the environment variable that picks a worker's build by name
// (portable, x86-64-v3, x86-64-v4) instead of by CPU: to compare builds,
// or to rule one out.
const Env = "APIARY_CPU_VARIANT"

// needs says what each variant needs of the CPU, in words.
var needs = map[string]string{
	V3: "AVX2, FMA, F16C, BMI2",
	V4: "AVX-512 F/BW/CD/DQ/VL and AVX-512 VNNI",
}

// SupportsV3 reports whether this CPU, and the OS for its registers, runs
// x86-64-v3 code.
func SupportsV3() bool {
	x := cpu.X86
	return runtime.GOARCH == "amd64" && x.HasAVX && x.HasAVX2 && x.HasBMI1 && x.HasBMI2 && x.HasF16C && x.HasFMA &&
		x.HasLZCNT && x.HasMOVBE && x.HasOSXSAVE
}

// SupportsV4 reports whether this CPU, and the OS for its registers, runs
// the x86-64-v4 build: x86-64-v3, AVX-512 F, BW, CD, DQ and VL (x86-64-v4)
// and AVX-512 VNNI, which llama.cpp's quantized dot products use.
func SupportsV4() bool {
	x := cpu.X86
	return SupportsV3() && x.HasAVX512F && x.HasAVX512BW && x.HasAVX512CD && x.HasAVX512DQ && x.HasAVX512VL && x.HasAVX512VNNI
}

// Supports reports whether this CPU runs variant's code.
func Supports(variant string) bool {
	switch variant {
	case Portable:
		return true
	case V3:
		return SupportsV3()
	case V4:
		return SupportsV4()
	}
	return false
}

// Best is the best variant this CPU runs.
func Best() string {
	for _, v := range Siblings {
		if Supports(v) {
			return v
		}
	}
	return Portable
}

// Choice is the binary that runs llama.cpp on this machine, and why.
type Choice struct {
	Path    string
	Variant string // Portable, V3, V4, or "" (a binary of no named variant)
	Reason  string
}

// Choose returns the binary a worker should run as, given the path of
// this one (os.Executable). It fails only on a bad APIARY_CPU_VARIANT.
func Choose(exe string) (Choice, error) {
	if Name == Portable {
		return ForPortable(exe)
	}
	if _, err := envVariant(); err != nil {
		return Choice{}, err
	}
	if Name == "" {
		return Choice{exe, Name, "this binary was built without the Makefile: it is the only build"}, nil
	}
	return Choice{exe, Name, "this binary is the " + Name + " build"}, nil
}

// ForPortable is Choose for the portable build: the sibling that
// APIARY_CPU_VARIANT names, else the best sibling this CPU runs and that
// is there, else itself.
func ForPortable(exe string) (Choice, error) {
	stay := Choice{Path: exe, Variant: Portable}
	env, err := envVariant()
	if err != nil {
		return Choice{}, err
	}
	sibling := func(v string) (string, error) {
		sib := exe + "-" + v
		fi, err := os.Stat(sib)
		if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
			return "", fmt.Errorf("there is no executable %s beside %s", filepath.Base(sib), filepath.Base(exe))
		}
		return sib, nil
	}
	switch env {
	case Portable:
		stay.Reason = Env + "=" + Portable
		return stay, nil
	case V3, V4:
		if !Supports(env) {
			return Choice{}, fmt.Errorf("%s=%s, but this CPU lacks %s (%s)", Env, env, env, needs[env])
		}
		sib, err := sibling(env)
		if err != nil {
			return Choice{}, fmt.Errorf("%s=%s, but %w", Env, env, err)
		}
		return Choice{Path: sib, Variant: env, Reason: Env + "=" + env}, nil
	}
	var why []string
	for _, v := range Siblings {
		if !Supports(v) {
			why = append(why, fmt.Sprintf("this CPU lacks %s (%s)", v, needs[v]))
			continue
		}
		sib, err := sibling(v)
		if err != nil {
			why = append(why, fmt.Sprintf("this CPU has %s, but %v", v, err))
			continue
		}
		reason := fmt.Sprintf("this CPU has %s (%s)", v, needs[v])
		if len(why) > 0 {
			reason += "; " + strings.Join(why, "; ")
		}
		return Choice{Path: sib, Variant: v, Reason: reason}, nil
	}
	stay.Reason = strings.Join(why, "; ")
	return stay, nil
}

// envVariant is APIARY_CPU_VARIANT, checked: "" or a variant's name.
func envVariant() (string, error) {
	env := os.Getenv(Env)
	if env == "" || env == Portable || slices.Contains(Siblings, env) {
		return env, nil
	}
	return "", fmt.Errorf("%s=%q: it takes %s, %s or %s; unset it to pick by CPU", Env, env, Portable, V3, V4)
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
