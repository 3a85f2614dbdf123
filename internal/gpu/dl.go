//go:build cgo && linux

package gpu

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

// check_backend opens path without running it as a backend and reports
// 0 when it has ggml_backend_init, 1 when it does not, -1 when it does not
// load (dlerror copied into msg).
static int check_backend(const char *path, char *msg, size_t n) {
	void *h = dlopen(path, RTLD_LAZY | RTLD_LOCAL);
	if (h == NULL) {
		const char *e = dlerror();
		strncpy(msg, e ? e : "unknown error", n - 1);
		msg[n - 1] = 0;
		return -1;
	}
	int rc = dlsym(h, "ggml_backend_init") != NULL ? 0 : 1;
	dlclose(h);
	return rc;
}
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"unsafe"
)

// CheckBackendLibrary says whether path is a shared library that loads and
// is a ggml backend (it exports ggml_backend_init); it does not initialise
// the backend.
func CheckBackendLibrary(path string) error {
	st, err := os.Stat(path)
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("%w: %s is not there (build it with scripts/gpu-proof.sh, see docs/gpu.md)", ErrNoBackend, path)
	}
	if err != nil {
		return fmt.Errorf("%w: %v", ErrNoBackend, err)
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("%w: %s is not a regular file", ErrNoBackend, path)
	}
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var msg [512]C.char
	switch C.check_backend(cpath, &msg[0], C.size_t(len(msg))) {
	case -1:
		return fmt.Errorf("%w: %s does not load: %s", ErrNoBackend, path, C.GoString(&msg[0]))
	case 1:
		return fmt.Errorf("%w: %s is not a ggml backend (it has no ggml_backend_init)", ErrNoBackend, path)
	}
	return nil
}
