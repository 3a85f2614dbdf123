package llamacpp

/*
#cgo LDFLAGS: -rdynamic
#include <stdlib.h>
#include "ggml-backend.h"

static int gpu_count(void) {
	int n = 0;
	for (size_t i = 0; i < ggml_backend_dev_count(); i++) {
		enum ggml_backend_dev_type t = ggml_backend_dev_type(ggml_backend_dev_get(i));
		if (t == GGML_BACKEND_DEVICE_TYPE_GPU || t == GGML_BACKEND_DEVICE_TYPE_IGPU) n++;
	}
	return n;
}

static int load_backend(const char *path) { return ggml_backend_load(path) != NULL; }
*/
import "C"

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"unsafe"

	"github.com/apiary-llm/apiary/internal/gpu"
)

// The binary exports its symbols (-rdynamic above) so that a backend
// library built from the same ggml sources binds to this binary's ggml,
// not to a second copy.

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
