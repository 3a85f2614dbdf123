package testbin

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

var llamaServer builtOnce

// LlamaServer returns llama.cpp's llama-server for the external-engine
// tests: $APIARY_LLAMA_SERVER when set, else the one
// scripts/bench-llama-server.sh builds into the user's cache (once per
// version; `make test` builds it before the tests, so that here it is
// only looked up). A build that fails fails the test; none skips.
func LlamaServer(t testing.TB) string {
	t.Helper()
	return llamaServer.get(t, "APIARY_LLAMA_SERVER", "these tests need llama-server", buildLlamaServer)
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
