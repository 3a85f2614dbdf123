package hive

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

// The real apiary binary, for the tests that run real workers: $APIARY_BIN
// (make test sets it), or built once for this test binary with the
// Makefile's cgo flags (so the llama.cpp objects come from the build
// cache). A failed build fails the tests that need it; none skips.
var (
	binOnce sync.Once
	binPath string
	binErr  error
	binDir  string // removed by TestMain's cleanup
)

func apiaryBin(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("APIARY_BIN"); p != "" {
		return p
	}
	binOnce.Do(func() { binPath, binErr = buildApiary() })
	if binErr != nil {
		t.Fatalf("these tests need the apiary binary: set APIARY_BIN or run `make test`; building it failed: %v", binErr)
	}
	return binPath
}

func buildApiary() (string, error) {
	dir, err := os.MkdirTemp("", "apiary-hive-test-bin-")
	if err != nil {
		return "", err
	}
	binDir = dir
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
	bin := filepath.Join(dir, "apiary")
	cmd := exec.Command(goTool, "build", "-o", bin, "./cmd/apiary")
	cmd.Dir = modDir
	cmd.Env = env
	if msg, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/apiary: %w\n%s", err, msg)
	}
	return bin, nil
}

// withReal runs real `apiary worker` processes.
func withReal(t testing.TB) hiveOpt {
	bin := apiaryBin(t)
	return func(c *Config) {
		c.WorkerPath = bin
		c.WorkerEnv = []string{}
	}
}
