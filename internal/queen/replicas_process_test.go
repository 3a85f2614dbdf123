//go:build !race

package queen

// Replicas with real processes: `apiary models scale` brings a worker up
// with no request, a worker killed with SIGKILL is replaced, a model
// whose file is corrupt is a crash loop (audited once, retried slowly),
// and the settings survive a queen restart.

import (
	"bytes"
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/keeper"
	"github.com/apiary-llm/apiary/internal/testmodel"
)

// writeBrokenModel writes the test model with a wrong
// llama.embedding_length in its header: the hive's preflight reads it,
// llama.cpp refuses to load it (its tensors have another shape), so each
// worker of it exits while loading.
func writeBrokenModel(t *testing.T, path string) {
	t.Helper()
	if err := testmodel.WriteFile(path, testmodel.Options{}); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	key := []byte("llama.embedding_length")
	i := bytes.Index(data, key)
	if i < 0 {
		t.Fatal("the test model has no llama.embedding_length")
	}
	v := i + len(key) + 4 // the key, then its value's type (uint32), then the value
	if typ := binary.LittleEndian.Uint32(data[i+len(key):]); typ != 4 {
		t.Fatalf("llama.embedding_length has GGUF type %d, want 4 (uint32)", typ)
	}
	binary.LittleEndian.PutUint32(data[v:], binary.LittleEndian.Uint32(data[v:])+32)
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

func auditActions(t *testing.T, c *keeper.Client, target, action string) []api.AuditEntry {
	t.Helper()
	entries, err := c.Audit(context.Background(), "", 1000)
	if err != nil {
		t.Fatal(err)
	}
	var out []api.AuditEntry
	for _, e := range entries {
		if e.Target == target && e.Action == action {
			out = append(out, e)
		}
	}
	return out
}

func TestProcessReplicas(t *testing.T) {
	const slow = 4 * time.Second
	dataDir := t.TempDir()
	queenArgs := []string{"--crashloop-failures", "3", "--crashloop-window", "5m", "--crashloop-backoff", slow.String()}
	q, qURL := startQueenProc(t, dataDir, "", queenArgs...)
	dir := t.TempDir()
	models := filepath.Join(dir, "models")
	if err := os.MkdirAll(models, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := testmodel.WriteFile(filepath.Join(models, "tiny.gguf"), testmodel.Options{}); err != nil {
		t.Fatal(err)
	}
	writeBrokenModel(t, filepath.Join(models, "broken.gguf"))
	hive := startProc(t, "hive node-1", nil, "hive", "--addr", "127.0.0.1:0", "--queen", qURL, "--pool-id", "node-1", "--data-dir", dir,
		"--heartbeat-interval", "500ms", "--worker-ports", "24000-24999", "--worker-threads", "1")
	q.logs.wait(t, 0, "pool status changed", map[string]string{"pool_id": "node-1", "to": "healthy"})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("queen logs:\n%s", q.logs.String())
			t.Logf("hive logs:\n%s", hive.logs.String())
		}
		if err := hive.stop(t, syscall.SIGTERM); err != nil {
			t.Errorf("hive exit: %v", err)
		}
	})
	ctx := t.Context()
	admin := keeper.NewClient(qURL, "", "")

	// min 1: a worker comes up with no request.
	scaled := time.Now()
	if _, err := admin.ScaleModel(ctx, "tiny", 1, nil, "keep one warm"); err != nil {
		t.Fatal(err)
	}
	rec, _ := q.logs.wait(t, 0, "worker placed on demand", map[string]string{"model_ref": "tiny", "kind": "replica"})
	first := rec.Attrs["lifecycle_id"]
	// From the start: the worker may call back ready before its placement is logged.
	rec, next := q.logs.wait(t, 0, "lifecycle row changed", map[string]string{"lifecycle_id": first, "to": "RUNNING"})
	t.Logf("min_workers 1: replica RUNNING %s after apiary models scale, with no request", logTime(t, rec).Sub(scaled).Round(time.Millisecond))
	if n := q.logs.Count("request queued", nil); n != 0 {
		t.Errorf("%d requests queued; the replica must come with none", n)
	}

	// SIGKILL the worker: a new one replaces it.
	row := workerRow(t, admin, first)
	if row.PID == nil {
		t.Fatalf("RUNNING row without a pid: %+v", row)
	}
	killed := time.Now()
	if err := syscall.Kill(*row.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	rec, afterFailed := q.logs.wait(t, next, "lifecycle row changed", map[string]string{"lifecycle_id": first, "to": "FAILED"})
	failedAt := logTime(t, rec)
	rec, _ = q.logs.wait(t, afterFailed, "worker placed on demand", map[string]string{"model_ref": "tiny", "kind": "replica"})
	second := rec.Attrs["lifecycle_id"]
	// The replacement may call back ready before the controller logs its
	// placement: its RUNNING line is looked for from the failure on.
	rec, _ = q.logs.wait(t, afterFailed, "lifecycle row changed", map[string]string{"lifecycle_id": second, "to": "RUNNING"})
	t.Logf("SIGKILL of the replica: row FAILED after %s, replacement RUNNING %s after the kill (%s)",
		failedAt.Sub(killed).Round(time.Millisecond), logTime(t, rec).Sub(killed).Round(time.Millisecond), second)

	// A corrupt model file: its workers fail to load; the third failure
	// is a crash loop, audited once, and the next tries are slow.
	if _, err := admin.ScaleModel(ctx, "broken", 1, nil, "crash loop test"); err != nil {
		t.Fatal(err)
	}
	rec, next = q.logs.wait(t, 0, "model in a crash loop: it is replaced only at the slow pace until a worker serves", map[string]string{"model_ref": "broken"})
	// The crash loop's own start: the line is logged once it is audited.
	loopAt, err := time.Parse(time.RFC3339Nano, rec.Attrs["since"])
	if err != nil {
		t.Fatalf("crash loop line without its start: %v", rec)
	}
	t.Logf("crash loop: %s", rec.Attrs["last_failure"])
	// One slow retry, which fails too (maybe before its placement is
	// logged: its FAILED line is looked for from the crash loop on).
	beforeRetry := next
	rec, next = q.logs.wait(t, next, "worker placed on demand", map[string]string{"model_ref": "broken"})
	retry := rec.Attrs["lifecycle_id"]
	gap := logTime(t, rec).Sub(loopAt)
	t.Logf("the next try of broken came %s after the crash loop began (--crashloop-backoff %s)", gap.Round(time.Millisecond), slow)
	if gap < slow {
		t.Errorf("a try %s after the crash loop began, before --crashloop-backoff %s", gap, slow)
	}
	q.logs.wait(t, beforeRetry, "lifecycle row changed", map[string]string{"lifecycle_id": retry, "to": "FAILED"})
	q.logs.wait(t, next, "a worker of a model with min_workers failed; it is replaced after a backoff", map[string]string{"model_ref": "broken", "lifecycle_id": retry})

	loops := auditActions(t, admin, "model:broken", "worker.crashloop")
	if len(loops) != 1 {
		t.Fatalf("%d worker.crashloop entries for broken, want 1", len(loops))
	}
	t.Logf("worker.crashloop: %s", loops[0].Reason)
	fails, _ := loops[0].Metadata["failures"].([]any)
	lines, _ := loops[0].Metadata["last_log_lines"].([]any)
	if len(fails) != 3 || len(lines) == 0 {
		t.Errorf("worker.crashloop metadata: %d failures, %d log lines, want 3 and some: %v", len(fails), len(lines), loops[0].Metadata)
	}
	for _, l := range lines {
		t.Logf("  log: %v", l)
	}
	settings, err := admin.ModelSettings(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(settings) != 2 || settings[0].Model != "broken" || settings[0].CrashLoop == nil || settings[1].CrashLoop != nil || settings[1].Running != 1 {
		t.Errorf("settings: %+v", settings)
	}
	if got := metricOf(t, qURL, `apiary_queen_model_crashloop{model="broken"}`); got != "1" {
		t.Errorf("crash loop gauge %q, want 1", got)
	}

	// Scaled down to 0, then a queen restart: the settings are kept, and
	// the running replica of tiny is adopted, not doubled.
	if _, err := admin.ScaleModel(ctx, "broken", 0, nil, "stop trying"); err != nil {
		t.Fatal(err)
	}
	if err := q.stop(t, syscall.SIGTERM); err != nil {
		t.Fatalf("queen exit: %v", err)
	}
	q2, qURL2 := startQueenProc(t, dataDir, "", append(queenArgs, "--addr", strings.TrimPrefix(qURL, "http://"))...)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("second queen logs:\n%s", q2.logs.String())
		}
		if err := q2.stop(t, syscall.SIGTERM); err != nil {
			t.Errorf("queen exit: %v", err)
		}
	})
	if qURL2 != qURL {
		t.Fatalf("queen came back on %s, want %s", qURL2, qURL)
	}
	q2.logs.wait(t, 0, "pool inventory reconciled", map[string]string{"pool_id": "node-1", "adopted": "1"})
	settings, err = admin.ModelSettings(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(settings) != 2 || settings[0].MinWorkers != 0 || settings[0].Reason != "stop trying" || settings[1].MinWorkers != 1 || settings[1].Running != 1 {
		t.Errorf("settings after the restart: %+v", settings)
	}
	if n := q2.logs.Count("worker placed on demand", nil); n != 0 {
		t.Errorf("the restarted queen placed %d workers; tiny's replica runs and broken's min is 0", n)
	}
}

func workerRow(t *testing.T, c *keeper.Client, id string) api.LifecycleRow {
	t.Helper()
	rows, err := c.Workers(context.Background(), keeper.WorkerFilter{})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		if r.ID == id {
			return r
		}
	}
	t.Fatalf("no row %s", id)
	return api.LifecycleRow{}
}

// metricOf is the value of the first /metrics line of the queen at url
// that starts with prefix.
func metricOf(t *testing.T, url, prefix string) string {
	t.Helper()
	return (&cluster{t: t, url: url}).metric(prefix)
}
