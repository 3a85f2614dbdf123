//go:build !race

package queen

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/testbin"
)

// cliLogs runs `apiary workers logs ARGS` against the cluster's queen.
func (c *cluster) cliLogs(args ...string) *testbin.Proc {
	c.t.Helper()
	return testbin.Start(c.t, "apiary workers logs", nil, append(append([]string{"workers", "logs"}, args...), "--queen", c.url)...)
}

// logsOf runs `apiary workers logs ARGS` to its end: exit code, stdout,
// stderr.
func (c *cluster) logsOf(args ...string) (int, string, string) {
	c.t.Helper()
	p := c.cliLogs(args...)
	code := p.Wait(c.t)
	return code, p.Stdout(), p.Lines.String()
}

// waitStdout waits until p's stdout satisfies ok.
func waitStdout(t *testing.T, p *testbin.Proc, what string, ok func(string) bool) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for !ok(p.Stdout()) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s; stdout:\n%s\nstderr:\n%s", what, waitLimit, p.Stdout(), p.Lines.String())
		}
		select {
		case <-p.Done():
			if !ok(p.Stdout()) {
				t.Fatalf("%s: the command ended first (exit %d); stdout:\n%s\nstderr:\n%s", what, p.Cmd.ProcessState.ExitCode(), p.Stdout(), p.Lines.String())
			}
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Worker logs within reach: `apiary workers logs` by
// lifecycle id, through the queen, with a real queen, hive and worker: a
// live worker's log and its last lines, --follow printing a line the
// worker writes while it is followed and ending with the worker, an ended
// worker's log (also after its hive restarted and forgot it), and the
// answer once that log is removed.
func TestWorkerLogsThroughTheQueen(t *testing.T) {
	c := startCluster(t, nil)
	ctx := t.Context()
	if s := c.stream(ctx, completion(4), nil); s.err != nil {
		t.Fatalf("first request: %v", s.err)
	}
	rows := c.rows()
	if len(rows) != 1 || rows[0].Status != "RUNNING" || rows[0].WorkerID == "" {
		t.Fatalf("rows: %+v", rows)
	}
	id, workerID := rows[0].ID, rows[0].WorkerID

	// A live worker.
	code, out, errOut := c.logsOf(id)
	if code != 0 || !strings.Contains(out, "serving") || !strings.Contains(out, "generation finished") {
		t.Fatalf("workers logs %s: exit %d\nstdout:\n%s\nstderr:\n%s", id, code, out, errOut)
	}
	// The worker's last line may be its "ready callback accepted", logged
	// when the callback's answer came, after the first generation.
	if code, out, _ := c.logsOf(id, "--tail", "1"); code != 0 || strings.Count(out, "\n") != 1 {
		t.Errorf("--tail 1: exit %d %q", code, out)
	}

	// --follow: the last line, then what the worker writes for a new
	// request, then the end when the worker ends.
	f := c.cliLogs(id, "--follow", "--tail", "1")
	waitStdout(t, f, "the followed tail", func(s string) bool { return strings.Count(s, "\n") >= 1 })
	before := strings.Count(f.Stdout(), "generation finished")
	if s := c.stream(ctx, completion(4), nil); s.err != nil {
		t.Fatalf("second request: %v", s.err)
	}
	waitStdout(t, f, "a line written while followed", func(s string) bool { return strings.Count(s, "generation finished") > before })
	if _, err := c.admin.StopWorker(ctx, id, false, "logs test"); err != nil {
		t.Fatal(err)
	}
	if code := f.Wait(t); code != 0 {
		t.Errorf("the follower ended with exit %d: %s", code, f.Lines.String())
	}
	if !strings.Contains(f.Stdout(), "draining") {
		t.Errorf("the follower missed the worker's last lines:\n%s", f.Stdout())
	}
	_, next := c.queen.logs.wait(t, 0, "lifecycle row changed", map[string]string{"lifecycle_id": id, "to": "STOPPED"})

	// An ended worker, from its hive's memory, then from its file once a
	// restarted hive no longer knows it.
	if code, out, _ := c.logsOf(id, "--tail", "3"); code != 0 || strings.Count(out, "\n") != 3 {
		t.Errorf("ended worker, --tail 3: exit %d %q", code, out)
	}
	args := c.hive.cmd.Args[1 : len(c.hive.cmd.Args)-1] // without startProc's --log-json
	if err := c.hive.stop(t, syscall.SIGTERM); err != nil {
		t.Fatalf("hive exit: %v", err)
	}
	c.hive = startProc(t, "hive node-1, again", nil, args...)
	c.queen.logs.wait(t, next, "pool inventory reconciled", map[string]string{"pool_id": "node-1"})
	if code, out, errOut := c.logsOf(id); code != 0 || !strings.Contains(out, "serving") || !strings.Contains(out, "draining") {
		t.Errorf("ended worker after a hive restart: exit %d\n%s\n%s", code, out, errOut)
	}
	var dataDir string
	for i, a := range args {
		if a == "--data-dir" {
			dataDir = args[i+1]
		}
	}
	if err := os.Remove(filepath.Join(dataDir, "hive", "logs", workerID+".log")); err != nil {
		t.Fatal(err)
	}
	if code, out, errOut := c.logsOf(id); code != 1 || out != "" || !strings.Contains(errOut, "log_not_found") || !strings.Contains(errOut, "ended (STOPPED)") {
		t.Errorf("ended worker whose log was removed: exit %d, stdout %q, stderr %q", code, out, errOut)
	}

	// Ids: an unknown lifecycle id, and the hive's own worker id.
	if code, _, errOut := c.logsOf("wk-0000000000000000"); code != 1 || !strings.Contains(errOut, "worker_not_found") {
		t.Errorf("unknown id: exit %d %q", code, errOut)
	}
	if code, _, errOut := c.logsOf(workerID); code != 2 || !strings.Contains(errOut, "not a lifecycle id") {
		t.Errorf("the hive's worker id: exit %d %q", code, errOut)
	}
}
