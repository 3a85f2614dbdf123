package llamacpp

/*
#cgo LDFLAGS: -lllama -lllama-common -lggml -lggml-base -ldl
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include "ggml-backend.h"
#include "llama.h"

static int gpu_count(void) {
	int n = 0;
	for (size_t i = 0; i < ggml_backend_dev_count(); i++) {
		enum ggml_backend_dev_type t = ggml_backend_dev_type(ggml_backend_dev_get(i));
		if (t == GGML_BACKEND_DEVICE_TYPE_GPU || t == GGML_BACKEND_DEVICE_TYPE_IGPU) n++;
	}
	return n;
}

static int load_backend(const char *path) { return ggml_backend_load(path) != NULL; }

// ggml_file is the path of the loaded libggml, or NULL.
static const char *ggml_file(void) {
	Dl_info info;
	if (dladdr((void *)ggml_backend_load, &info) == 0) return NULL;
	return info.dli_fname;
}
*/
import "C"

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"unsafe"

	"github.com/apiary-llm/apiary/internal/cpuvariant"
	"github.com/apiary-llm/apiary/internal/gpu"
)

// llama.cpp and ggml are shared libraries beside the binary (bin/, found
// through its $ORIGIN run path), and so are ggml's backends, which a
// process loads at run time: one CPU backend, the best of the
// instruction-set levels this CPU runs (internal/cpuvariant), and the
// CUDA backend where a worker is asked for a GPU (UseGPU). A backend
// library binds to the same libggml-base the binary links.

// LibDir is the directory of the llama.cpp libraries this process
// loaded, where the CPU backends are.
func LibDir() (string, error) {
	f := C.ggml_file()
	if f == nil {
		return "", fmt.Errorf("cannot tell where libggml was loaded from")
	}
	p, err := filepath.EvalSymlinks(C.GoString(f))
	if err != nil {
		return "", fmt.Errorf("libggml: %w", err)
	}
	return filepath.Dir(p), nil
}

var cpuBackend struct {
	once   sync.Once
	choice cpuvariant.Choice
	err    error
}

// CPUBackend loads the CPU backend for this CPU (once a process) and
// initialises llama.cpp, its log going to log; it says which level it
// loaded and why.
func CPUBackend(log *slog.Logger) (cpuvariant.Choice, error) {
	if log == nil {
		log = slog.Default()
	}
	cpuBackend.once.Do(func() {
		routeLogs(log)
		dir, err := LibDir()
		if err != nil {
			cpuBackend.err = err
			return
		}
		c, err := cpuvariant.Choose(dir)
		if err != nil {
			cpuBackend.err = err
			return
		}
		cpath := C.CString(c.Path)
		defer C.free(unsafe.Pointer(cpath))
		if C.load_backend(cpath) == 0 {
			cpuBackend.err = fmt.Errorf("ggml could not load the CPU backend %s", c.Path)
			return
		}
		C.llama_backend_init()
		cpuBackend.choice = c
	})
	return cpuBackend.choice, cpuBackend.err
}

// gpuBackends remembers the backend libraries loaded into ggml's registry
// (a library is loaded once per process).
var gpuBackends struct {
	mu     sync.Mutex
	loaded map[string]error
}

// UseGPU loads the CUDA backend from dir (gpu.CUDALibrary) into ggml's
// backend registry and checks that it has GPU device n. The errors say
// what is missing: the library, a ggml backend in it, or the device.
func UseGPU(dir string, n int, log *slog.Logger) error {
	if log == nil {
		log = slog.Default()
	}
	path := filepath.Join(dir, gpu.CUDALibrary)
	if err := loadBackend(path, log); err != nil {
		return err
	}
	if have := int(C.gpu_count()); n < 0 || n >= have {
		return fmt.Errorf("%w: the backend %s sees %d GPU(s); there is no GPU %d", gpu.ErrNoBackend, path, have, n)
	}
	return nil
}

func loadBackend(path string, log *slog.Logger) error {
	gpuBackends.mu.Lock()
	defer gpuBackends.mu.Unlock()
	if err, ok := gpuBackends.loaded[path]; ok {
		return err
	}
	err := gpu.CheckBackendLibrary(path)
	if err == nil {
		routeLogs(log)
		cpath := C.CString(path)
		defer C.free(unsafe.Pointer(cpath))
		if C.load_backend(cpath) == 0 {
			err = fmt.Errorf("%w: ggml could not load the backend %s (its reason is logged above)", gpu.ErrNoBackend, path)
		}
	}
	if gpuBackends.loaded == nil {
		gpuBackends.loaded = map[string]error{}
	}
	gpuBackends.loaded[path] = err
	return err
}
