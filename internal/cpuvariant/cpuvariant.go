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
package cpuvariant

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdlib.h>

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
	Score int    // 0: this CPU lacks what it was built for; -1: it does not load
	Err   string // why it does not load
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
