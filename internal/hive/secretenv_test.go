package hive

import (
	"bytes"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/apiary-llm/apiary/internal/lifecycle"
)

// environOf reads the environment a process was started with.
func environOf(t *testing.T, pid int) map[string]string {
	t.Helper()
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil {
		t.Fatalf("environment of %d: %v", pid, err)
	}
	env := map[string]string{}
	for _, kv := range bytes.Split(data, []byte{0}) {
		if k, v, ok := strings.Cut(string(kv), "="); ok {
			env[k] = v
		}
	}
	return env
}

// Regression: the hive's scrub of its workers' environment
// missed APIARY_API_TOKEN and APIARY_DATABASE_URL. A real `apiary hive`
// run with every secret in its environment starts a real worker whose
// environment holds none of them, only its own worker token.
func TestWorkerInheritsNoSecretOfTheHive(t *testing.T) {
	secrets := map[string]string{
		"APIARY_API_TOKEN":    "api-s3cret-0123456789",
		"APIARY_ADMIN_TOKEN":  "admin-s3cret-0123456789",
		"APIARY_DATABASE_URL": "postgres://u:db-s3cret@127.0.0.1:1/db",
		"APIARY_WORKER_TOKEN": "hives-own-s3cret-0123456789",
		"PGPASSWORD":          "pg-s3cret",
	}
	for k, v := range secrets {
		t.Setenv(k, v)
	}
	q := newFakeQueen(t, "cluster-s3cret-0123456789")
	hp := startHiveProcess(t, apiaryBin(t), q, "")
	id := hp.start(t)
	pid := q.waitEvent(t, id, lifecycle.Ready).Worker.PID
	env := environOf(t, pid)
	for k, v := range env {
		if strings.Contains(v, "s3cret") {
			t.Errorf("worker %d inherited %s=%s", pid, k, v)
		}
	}
	if tok := env["APIARY_WORKER_TOKEN"]; tok == "" {
		t.Errorf("worker %d has no worker token of its own", pid)
	}
	if env["PATH"] == "" {
		t.Errorf("worker %d lost the ordinary environment (PATH)", pid)
	}
}
