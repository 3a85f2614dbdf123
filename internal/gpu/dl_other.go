//go:build !cgo || !linux

package gpu

import "fmt"

// CheckBackendLibrary always fails: loading a backend needs cgo on Linux.
func CheckBackendLibrary(path string) error {
	return fmt.Errorf("%w: %s: this build has no cgo, so it cannot load GPU backends", ErrNoBackend, path)
}
