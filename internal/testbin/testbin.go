// Package testbin gives tests the real apiary binary: $APIARY_BIN when set
// (make test sets it), else one build per test binary with the Makefile's
// cgo flags. A failed build fails the tests that need it; none skips.
package testbin

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
)

var (
	once     sync.Once
	path     string
	buildErr error
	dir      string
)

// Path returns the apiary binary, building it on first use.
func Path(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("APIARY_BIN"); p != "" {
		return p
	}
	once.Do(func() { path, buildErr = build() })
	if buildErr != nil {
		t.Fatalf("these tests need the apiary binary: set APIARY_BIN or run `make test`; building it failed: %v", buildErr)
	}
	return path
}

// Cleanup removes a binary Path built; call it from TestMain.
func Cleanup() {
	if dir != "" {
		os.RemoveAll(dir)
	}
}

func build() (string, error) {
	d, err := os.MkdirTemp("", "apiary-test-bin-")
	if err != nil {
		return "", err
	}
	dir = d
	goTool := filepath.Join(runtime.GOROOT(), "bin", "go")
	out, err := exec.Command(goTool, "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		return "", fmt.Errorf("go list -m: %w", err)
	}
	modDir := strings.TrimSpace(string(out))
	env := os.Environ()
	if os.Getenv("CGO_CPPFLAGS") == "" {
		out, err := exec.Command(goTool, "list", "-m", "-f", "{{.Dir}}", "github.com/ollama/ollama").Output()
		if err != nil {
			return "", fmt.Errorf("locate github.com/ollama/ollama (go mod download): %w", err)
		}
		ollama := strings.TrimSpace(string(out))
		home, err := os.UserHomeDir()
		if err != nil {
			return "", err
		}
		include := filepath.Join(home, ".cache", "apiary", "include")
		stub, err := os.ReadFile(filepath.Join(modDir, "cgo", "include", "miniaudio", "miniaudio.h"))
		if err != nil {
			return "", err
		}
		if err := os.MkdirAll(filepath.Join(include, "miniaudio"), 0o755); err != nil {
			return "", err
		}
		if have, _ := os.ReadFile(filepath.Join(include, "miniaudio", "miniaudio.h")); !bytes.Equal(have, stub) {
			if err := os.WriteFile(filepath.Join(include, "miniaudio", "miniaudio.h"), stub, 0o644); err != nil {
				return "", err
			}
		}
		flags := "-O2"
		if cpu, _ := os.ReadFile("/proc/cpuinfo"); bytes.Contains(cpu, []byte(" avx2")) {
			flags += " -march=x86-64-v3" // as the Makefile, so the build cache is shared
		}
		env = append(env, "CGO_ENABLED=1", "CGO_CFLAGS="+flags, "CGO_CXXFLAGS="+flags,
			"CGO_CPPFLAGS=-I"+include+" -I"+ollama+"/llama/llama.cpp/include -I"+ollama+"/ml/backend/ggml/ggml/include")
	}
	bin := filepath.Join(d, "apiary")
	cmd := exec.Command(goTool, "build", "-o", bin, "./cmd/apiary")
	cmd.Dir = modDir
	cmd.Env = env
	if msg, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/apiary: %w\n%s", err, msg)
	}
	return bin, nil
}
