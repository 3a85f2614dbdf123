package testbin

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var llamaServer builtOnce

// LlamaServer returns llama.cpp's llama-server for the external-engine
// tests: $APIARY_LLAMA_SERVER when set, else the one scripts/llamacpp.sh
// builds with the worker's libraries, from the same source and commit,
// into the user's cache (`make test` builds it before the tests, so that
// here it is only looked up). A build that fails fails the test; none
// skips.
func LlamaServer(t testing.TB) string {
	t.Helper()
	return llamaServer.get(t, "APIARY_LLAMA_SERVER", "these tests need llama-server", buildLlamaServer)
}

func buildLlamaServer() (string, error) {
	prefix, err := llamaScript("server")
	if err != nil {
		return "", err
	}
	p := filepath.Join(prefix, "server", "llama-server")
	if st, err := os.Stat(p); err != nil || st.Mode()&0o111 == 0 {
		return "", fmt.Errorf("no llama-server at %s (run `make llama-server`): %v", p, err)
	}
	return p, nil
}

var llamaPrefix builtOnce

// LlamaPrefix is where scripts/llamacpp.sh built llama.cpp (building it
// first if it has not: minutes from cold).
func LlamaPrefix() (string, error) {
	llamaPrefix.once.Do(func() { llamaPrefix.path, llamaPrefix.err = llamaScript("build") })
	return llamaPrefix.path, llamaPrefix.err
}

// llamaScript runs scripts/llamacpp.sh step and returns the prefix it
// prints.
func llamaScript(step string) (string, error) {
	_, root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	script := filepath.Join(root, "scripts", "llamacpp.sh")
	cmd := exec.Command(script, step)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	b, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s %s: %w\n%s", script, step, err, stderr.String())
	}
	return strings.TrimSpace(string(b)), nil
}

// StartLlamaServer starts llama-server bin with args on a free loopback
// port and returns its URL once /health answers 200; the test's end stops
// it.
func StartLlamaServer(t testing.TB, bin string, args ...string) string {
	t.Helper()
	port := FreePort(t)
	var out SyncBuffer
	cmd := exec.Command(bin, append(args, "--host", "127.0.0.1", "--port", fmt.Sprint(port))...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	deadline := time.Now().Add(time.Minute)
	for {
		resp, err := http.Get(base + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return base
			}
		}
		select {
		case err := <-exited:
			t.Fatalf("llama-server exited (%v):\n%s", err, out.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("llama-server not healthy within a minute:\n%s", out.String())
		}
	}
}
