package testbin

import (
	"bytes"
	"os"
	"strconv"
	"testing"

	"github.com/apiary-llm/apiary/internal/secret"
)

// WorkerToken is the bearer token of the worker process pid, as its hive
// gave it (APIARY_WORKER_TOKEN in its environment, read from
// /proc/<pid>/environ: the test runs as the same user). A test that calls
// a worker straight, not through the queen, needs it: the worker answers
// only /health without it. It fails the test if the process or the token
// is missing.
func WorkerToken(t testing.TB, pid int) string {
	t.Helper()
	if pid <= 0 {
		t.Fatalf("worker token: no pid (%d)", pid)
	}
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil {
		t.Fatalf("worker token of pid %d: %v", pid, err)
	}
	prefix := []byte(secret.WorkerTokenEnv + "=")
	for kv := range bytes.SplitSeq(data, []byte{0}) {
		if tok, ok := bytes.CutPrefix(kv, prefix); ok && len(tok) > 0 {
			return string(tok)
		}
	}
	t.Fatalf("worker token: pid %d (%s) has no %s in its environment", pid, Cmdline(pid), secret.WorkerTokenEnv)
	return ""
}
