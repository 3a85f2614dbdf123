// Package testbin gives tests the real apiary binary: $APIARY_BIN when set
// (make test sets it), else one `make build` per test binary. A failed build fails the tests that need it; none skips.
package testbin

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

var (
	apiary builtOnce
	dir    string
)

// builtOnce is a program the tests build at most once per test binary.
type builtOnce struct {
	once sync.Once
	path string
	err  error
}

// get returns $env when it is set, else the program build makes (the
// first call builds it); a build that failed fails t with need and why.
func (b *builtOnce) get(t testing.TB, env, need string, build func() (string, error)) string {
	t.Helper()
	if env != "" {
		if p := os.Getenv(env); p != "" {
			return p
		}
	}
	b.once.Do(func() { b.path, b.err = build() })
	if b.err != nil {
		t.Fatalf("%s: %v", need, b.err)
	}
	return b.path
}

// Path returns the apiary binary, building it on first use.
func Path(t testing.TB) string {
	t.Helper()
	return apiary.get(t, "APIARY_BIN", "these tests need the apiary binary: set APIARY_BIN or run `make test`; building it failed", build)
}

// Cleanup removes a binary Path built; call it from TestMain.
func Cleanup() {
	if dir != "" {
		os.RemoveAll(dir)
	}
	for _, d := range engineDirs {
		os.RemoveAll(d)
	}
}

// build runs `make build` into a temporary directory: the Makefile is the
// one place that knows the cgo flags and the CPU builds, and the build
// cache it shares makes this quick after the first time.
func build() (string, error) {
	d, err := os.MkdirTemp("", "apiary-test-bin-")
	if err != nil {
		return "", err
	}
	dir = d
	goTool, root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	cmd := exec.Command("make", "-s", "build", "BIN="+d, "GO="+goTool)
	cmd.Dir = root
	if msg, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("make build: %w\n%s", err, msg)
	}
	return filepath.Join(d, "apiary"), nil
}

// moduleRoot returns the go command and the directory of the apiary
// module the tests run in, where its Makefile, scripts and test sources
// are.
func moduleRoot() (goTool, root string, err error) {
	goTool, err = exec.LookPath("go")
	if err != nil {
		return "", "", fmt.Errorf("the tests find the module with the go command: %w", err)
	}
	out, err := exec.Command(goTool, "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		return "", "", fmt.Errorf("go list -m: %w", err)
	}
	return goTool, strings.TrimSpace(string(out)), nil
}
