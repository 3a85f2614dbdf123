// Package cpuvariant picks the CPU backend that suits the CPU it runs on.
//
// llama.cpp's CPU kernels are chosen when they are compiled, and code built
// for an instruction set does not run on a CPU without it. ggml's own scheme
// is the one apiary ships: `make build` puts one CPU backend library per
// instruction-set level beside bin/apiary (libggml-cpu-<level>.so: x64,
// sse42, haswell, skylakex, icelake, …), and a worker loads the best one
// this CPU runs. Each library scores the running CPU itself
// (ggml_backend_score: 0 when the CPU lacks an instruction it was built
// for, otherwise higher for more features); the highest score wins, as in
// ggml's own loader. APIARY_CPU_VARIANT names one level instead.
//
// A score reads the CPU's feature flags, which is not the same as the
// instructions working: on an H200 machine (a Firecracker VM whose CPU
// reports amx_tile and amx_int8) the sapphirerapids backend scored best,
// the kernel granted AMX, and the first matrix product killed the worker
// (and llama-server) with SIGILL in ggml's AMX kernel. So a level that
// uses AMX is taken only after a probe process has run an AMX
// instruction and lived.
package cpuvariant

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <errno.h>
#include <immintrin.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

// amx_touch asks the kernel for the AMX tile state as ggml does, then
// zeroes a tile: the first use of the tile data, where an AMX the
// machine cannot run raises SIGILL. It returns 3 when the kernel refuses
// (ggml then uses no AMX either) unless ask is 0 (tests: the instruction
// on a CPU without AMX).
__attribute__((target("amx-tile"))) static int amx_touch(int ask) {
	if (ask && syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) return 3;
	struct {
		uint8_t palette, start_row, reserved[14];
		uint16_t colsb[16];
		uint8_t rows[16];
	} __attribute__((aligned(64))) cfg;
	memset(&cfg, 0, sizeof cfg);
	cfg.palette = 1;
	cfg.colsb[0] = 64;
	cfg.rows[0] = 16;
	_tile_loadconfig(&cfg);
	_tile_zero(0);
	_tile_release();
	return 0;
}

// amx_probe runs amx_touch in a child process (fork: the child runs only
// this C code, then _exit) and returns its wait status, or -errno. The
// child puts the fault signals back to their default: the Go runtime's
// handler, inherited, would print a Go crash and exit 2 instead of dying
// by the signal.
static int amx_probe(int ask) {
	pid_t pid = fork();
	if (pid < 0) return -errno;
	if (pid == 0) {
		signal(SIGILL, SIG_DFL);
		signal(SIGSEGV, SIG_DFL);
		signal(SIGBUS, SIG_DFL);
		signal(SIGFPE, SIG_DFL);
		_exit(amx_touch(ask));
	}
	int st;
	while (waitpid(pid, &st, 0) < 0) {
		if (errno != EINTR) return -errno;
	}
	return st;
}

static int status_exited(int st) { return WIFEXITED(st); }
static int status_code(int st) { return WEXITSTATUS(st); }
static int status_signaled(int st) { return WIFSIGNALED(st); }
static int status_signal(int st) { return WTERMSIG(st); }

// score loads a CPU backend library, asks it how well it suits this CPU
// and unloads it: -1 when it does not load or has no score function.
static int score(const char *path, char **err) {
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		*err = dlerror();
		return -1;
	}
	int (*fn)(void) = (int (*)(void))dlsym(h, "ggml_backend_score");
	int s = fn ? fn() : -1;
	if (!fn) *err = "no ggml_backend_score";
	dlclose(h);
	return s;
}
*/
import "C"

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"unsafe"
)

// Env names the environment variable that picks the CPU backend by level
// (haswell, skylakex, …) instead of by score: to compare levels, or to
// rule one out.
const Env = "APIARY_CPU_VARIANT"

// Prefix and Suffix make a level's library name: libggml-cpu-<level>.so.
const (
	Prefix = "libggml-cpu-"
	Suffix = ".so"
)

// Level is one CPU backend library and how it suits this CPU.
type Level struct {
	Name  string // haswell, skylakex, …
	Path  string
	Score int    // 0: this CPU lacks what it was built for, or it failed a probe; -1: it does not load
	Err   string // why it does not load, or the probe that failed
}

// amxLevels are the levels built with AMX (ggml's sapphirerapids: AMX_TILE
// and AMX_INT8, whose kernels ggml uses for q4_0, q4_1 and q8_0 weights).
var amxLevels = map[string]bool{"sapphirerapids": true}

// AMXUsable says whether AMX instructions run in a process here: nil, or
// why not. A probe process runs them once per process; a test may replace it.
var AMXUsable = sync.OnceValue(func() error { return probeAMX(true) })

// probeAMX runs the probe; ask false skips asking the kernel for the tile
// state (tests).
func probeAMX(ask bool) error {
	a := 0
	if ask {
		a = 1
	}
	st := int(C.amx_probe(C.int(a)))
	switch {
	case st < 0:
		return fmt.Errorf("the AMX probe process did not start: %v", syscall.Errno(-st))
	case C.status_exited(C.int(st)) != 0 && (C.status_code(C.int(st)) == 0 || C.status_code(C.int(st)) == 3):
		// 3: the kernel refused the tile state, and ggml asks the same
		// way, so it uses no AMX: the level's other code runs.
		return nil
	case C.status_signaled(C.int(st)) != 0:
		return fmt.Errorf("the CPU reports AMX but an AMX instruction killed a probe process with %v", syscall.Signal(C.status_signal(C.int(st))))
	default:
		return fmt.Errorf("the AMX probe process exited with status %d", int(C.status_code(C.int(st))))
	}
}

// Choice is the CPU backend a worker loads, and why.
type Choice struct {
	Level
	Reason string
}

// Levels are the CPU backend libraries in dir, each scored on this CPU,
// best first.
func Levels(dir string) ([]Level, error) {
	paths, err := filepath.Glob(filepath.Join(dir, Prefix+"*"+Suffix))
	if err != nil {
		return nil, err
	}
	var out []Level
	for _, p := range paths {
		name := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(p), Prefix), Suffix)
		l := Level{Name: name, Path: p}
		cp := C.CString(p)
		var cerr *C.char
		l.Score = int(C.score(cp, &cerr))
		C.free(unsafe.Pointer(cp))
		if l.Score < 0 && cerr != nil {
			l.Err = C.GoString(cerr)
		}
		if l.Score > 0 && amxLevels[name] {
			if err := AMXUsable(); err != nil {
				l.Score, l.Err = 0, err.Error()
			}
		}
		out = append(out, l)
	}
	slices.SortStableFunc(out, func(a, b Level) int { return cmp.Or(cmp.Compare(b.Score, a.Score), cmp.Compare(a.Name, b.Name)) })
	return out, nil
}

// Choose picks the CPU backend of dir for this CPU: the one
// APIARY_CPU_VARIANT names, else the highest-scoring one. It fails when
// dir has none this CPU runs, or the named one is missing or unusable here.
func Choose(dir string) (Choice, error) {
	levels, err := Levels(dir)
	if err != nil {
		return Choice{}, err
	}
	var runs, not []string
	for _, l := range levels {
		switch {
		case l.Score > 0:
			runs = append(runs, l.Name)
		case l.Score == 0 && l.Err != "":
			not = append(not, l.Name+" ("+l.Err+")")
		case l.Score == 0:
			not = append(not, l.Name)
		default:
			not = append(not, l.Name+" (does not load: "+l.Err+")")
		}
	}
	if len(levels) == 0 {
		return Choice{}, fmt.Errorf("no CPU backend (%s*%s) in %s: build with `make build`", Prefix, Suffix, dir)
	}
	if want := os.Getenv(Env); want != "" {
		i := slices.IndexFunc(levels, func(l Level) bool { return l.Name == want })
		switch {
		case i < 0:
			return Choice{}, fmt.Errorf("%s=%q: no such CPU backend in %s (there are %s)", Env, want, dir, strings.Join(names(levels), ", "))
		case levels[i].Score == 0 && levels[i].Err != "":
			return Choice{}, fmt.Errorf("%s=%q: this CPU cannot run it: %s (it runs %s)", Env, want, levels[i].Err, strings.Join(runs, ", "))
		case levels[i].Score <= 0:
			return Choice{}, fmt.Errorf("%s=%q: this CPU cannot run it (it runs %s)", Env, want, strings.Join(runs, ", "))
		}
		return Choice{levels[i], Env + "=" + want}, nil
	}
	best := levels[0]
	if best.Score <= 0 {
		return Choice{}, fmt.Errorf("this CPU runs none of the CPU backends in %s (%s)", dir, strings.Join(not, ", "))
	}
	reason := fmt.Sprintf("the best of the %d CPU backends this CPU runs (score %d)", len(runs), best.Score)
	if len(not) > 0 {
		reason += "; it cannot run " + strings.Join(not, ", ")
	}
	return Choice{best, reason}, nil
}

func names(levels []Level) []string {
	out := make([]string, len(levels))
	for i, l := range levels {
		out[i] = l.Name
	}
	slices.Sort(out)
	return out
}
