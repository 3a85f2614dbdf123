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
	llamaOnce sync.Once
	llamaPath string
	llamaErr  error
)

// LlamaServer returns llama.cpp's llama-server for the external-engine
// tests: $APIARY_LLAMA_SERVER when set, else the one
// scripts/bench-llama-server.sh builds into the user's cache (once per
// version; `make test` builds it before the tests, so that here it is
// only looked up). A build that fails fails the test; none skips.
func LlamaServer(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("APIARY_LLAMA_SERVER"); p != "" {
		return p
	}
	llamaOnce.Do(func() { llamaPath, llamaErr = buildLlamaServer() })
	if llamaErr != nil {
		t.Fatalf("these tests need llama-server: %v", llamaErr)
	}
	return llamaPath
}

func buildLlamaServer() (string, error) {
	_, root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	script := filepath.Join(root, "scripts", "bench-llama-server.sh")
	cmd := exec.Command(script, "server")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	b, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s server: %w\n%s", script, err, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	p := lines[len(lines)-1]
	if st, err := os.Stat(p); err != nil || st.Mode()&0o111 == 0 {
		return "", fmt.Errorf("%s server printed %q, which is not an executable: %v", script, p, err)
	}
	return p, nil
}
