//go:build !race

package queen

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/keeper"
	"github.com/apiary-llm/apiary/internal/testbin"
	"github.com/apiary-llm/apiary/internal/testmodel"
)

// Ownership and the cascading shutdown with real processes: a queen with a
// hive it started (--local-hive: its child, lifeline on stdin, lease on the
// queen) and a hive an operator started, each with a worker. Tests are
// named after the ownership rules and their checks (docs/ownership.md).

// ownCluster is a queen that owns a local hive, and an operator's hive
// registered with it; each runs one worker of tiny.
type ownCluster struct {
	queen                 *proc
	url                   string
	owned, op             string // markers: every process of the queen's tree / the operator's hive names its dir
	opHive                *proc
	ownedRow, opRow       string // lifecycle ids
	ownedWorker, opWorker int
}

func ownModelsDir(t *testing.T, dir string) string {
	t.Helper()
	m := filepath.Join(dir, "models")
	if err := os.MkdirAll(m, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := testmodel.WriteFile(filepath.Join(m, "tiny.gguf"), testmodel.Options{}); err != nil {
		t.Fatal(err)
	}
	return m
}

func startOwnCluster(t *testing.T, addr string, extra ...string) *ownCluster {
	t.Helper()
	c := &ownCluster{owned: t.TempDir(), op: t.TempDir()}
	models := ownModelsDir(t, c.owned)
	args := []string{"--local-hive", "--hive-arg=--models-dir=" + models, "--hive-arg=--worker-threads=1",
		"--hive-arg=--worker-ports=25000-25499", "--hive-arg=--stop-grace=2s", "--hive-arg=--shutdown-ack=1s"}
	if addr != "" {
		args = append(args, "--addr", addr)
	}
	c.queen, c.url = startQueenProc(t, filepath.Join(c.owned, "queen"), "", append(args, extra...)...)
	c.opHive = startProc(t, "operator hive", nil, "hive", "--addr", "127.0.0.1:0", "--queen", c.url, "--pool-id", "op",
		"--data-dir", filepath.Join(c.op, "hive"), "--models-dir", ownModelsDir(t, c.op), "--worker-threads", "1",
		"--heartbeat-interval", "200ms", "--worker-ports", "25500-25999")
	c.queen.logs.wait(t, 0, "pool status changed", map[string]string{"pool_id": "local", "to": "healthy"})
	c.queen.logs.wait(t, 0, "pool status changed", map[string]string{"pool_id": "op", "to": "healthy"})
	cl := keeper.NewClient(c.url, "", "")
	for _, w := range []struct {
		pool string
		row  *string
	}{{LocalPoolID, &c.ownedRow}, {"op", &c.opRow}} {
		resp, err := cl.StartWorker(t.Context(), "tiny", w.pool, nil, "cascade test")
		if err != nil {
			t.Fatal(err)
		}
		*w.row = resp.LifecycleID
		c.queen.logs.wait(t, 0, "lifecycle row changed", map[string]string{"lifecycle_id": resp.LifecycleID, "to": "RUNNING"})
	}
	c.ownedWorker = ownWorkerOf(t, c.owned)
	c.opWorker = ownWorkerOf(t, c.op)
	return c
}

// workerOf is the pid of the one worker process whose command line names
// marker.
func ownWorkerOf(t *testing.T, marker string) int {
	t.Helper()
	return testbin.AwaitProcess(t, marker, " worker --worker-id")
}

// operatorUntouched checks rule 1's other half: the queen does not stop
// the hive it did not start, nor that hive's worker.
func (c *ownCluster) operatorUntouched(t *testing.T) {
	t.Helper()
	select {
	case <-c.opHive.done:
		t.Errorf("the operator's hive exited: %v", c.opHive.Err())
	default:
	}
	if !testbin.Alive(c.opWorker) {
		t.Errorf("the operator's worker %d died", c.opWorker)
	}
}

// ownedGone checks that the queen's hive and its worker are gone, and that
// the worker stopped gracefully (its row STOPPED) before the hive and the
// queen exited.
func (c *ownCluster) ownedGone(t *testing.T, graceful bool) {
	t.Helper()
	testbin.AwaitGone(t, c.owned, waitLimit)
	if graceful {
		rec, _ := c.queen.logs.wait(t, 0, "lifecycle row changed", map[string]string{"lifecycle_id": c.ownedRow, "to": "STOPPED"})
		stopped := logTime(t, rec)
		hiveStopped, _ := c.queen.logs.wait(t, 0, "hive stopped", map[string]string{"node": LocalPoolID})
		queenDone, _ := c.queen.logs.wait(t, 0, "hives of the queen stopped", nil)
		if !(stopped.Before(logTime(t, hiveStopped)) && !logTime(t, hiveStopped).After(logTime(t, queenDone))) {
			t.Errorf("cascade order: worker STOPPED %s, hive stopped %s, queen done with hives %s",
				stopped.Format(time.RFC3339Nano), logTime(t, hiveStopped).Format(time.RFC3339Nano), logTime(t, queenDone).Format(time.RFC3339Nano))
		}
		if rec.Attrs["actor"] != "hive:local" || !strings.Contains(rec.Attrs["reason"], "graceful stop") {
			t.Errorf("worker row stopped by %s: %s", rec.Attrs["actor"], rec.Attrs["reason"])
		}
	}
}

// Rule 1 and "Cascading shutdown on SIGTERM (SSH to rbee-hive)": SIGTERM
// to the queen stops the hive it started (workers first), then the queen
// exits; the operator's hive and worker are left running.
func TestCascade_QueenSIGTERM_StopsHivesItStarted_LeavesOperatorsHive(t *testing.T) {
	c := startOwnCluster(t, "")
	if err := c.queen.stop(t, syscall.SIGTERM); err != nil {
		t.Fatalf("queen exit after SIGTERM: %v", err)
	}
	c.ownedGone(t, true)
	c.operatorUntouched(t)
}

// POST /api/admin/shutdown does what SIGTERM does.
func TestCascade_AdminShutdown_StopsHivesItStarted_LeavesOperatorsHive(t *testing.T) {
	c := startOwnCluster(t, "")
	body, _ := json.Marshal(api.ShutdownRequest{Reason: "maintenance"})
	resp, err := http.Post(c.url+"/api/admin/shutdown", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	var sr api.ShutdownResponse
	_ = json.NewDecoder(resp.Body).Decode(&sr)
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted || sr.Status != "shutting_down" || len(sr.Hives) != 1 || sr.Hives[0] != LocalPoolID {
		t.Fatalf("shutdown answer %s %+v", resp.Status, sr)
	}
	select {
	case <-c.queen.done:
		if c.queen.Err() != nil {
			t.Errorf("queen exit: %v", c.queen.Err())
		}
	case <-time.After(waitLimit):
		t.Fatal("queen did not exit after /api/admin/shutdown")
	}
	c.ownedGone(t, true)
	c.operatorUntouched(t)
	c.queen.logs.wait(t, 0, "shutdown requested", map[string]string{"reason": "maintenance"})
}

// "WHENEVER queen-rbee DIES, ALL rbee-hive instances and ALL workers STOP
// GRACEFULLY": a queen killed with SIGKILL cannot cascade, but the hive it
// started notices (its lifeline ends; the kernel sends it SIGTERM) and
// stops its worker within the heartbeat timeout. The operator's hive keeps
// serving and registers with the next queen.
func TestCascade_QueenSIGKILL_HivesItStartedGoWithinTimeout_OperatorsHiveReregisters(t *testing.T) {
	const timeout = 2 * time.Second
	c := startOwnCluster(t, "", "--heartbeat-timeout", timeout.String())
	killed := time.Now()
	if err := c.queen.stop(t, syscall.SIGKILL); err == nil {
		t.Fatal("queen exited cleanly after SIGKILL")
	}
	took := testbin.AwaitGone(t, c.owned, waitLimit)
	t.Logf("the queen's hive and worker gone %s after its SIGKILL", time.Since(killed).Round(time.Millisecond))
	if took > timeout {
		t.Errorf("the queen's hive and worker took %s to go, want at most --heartbeat-timeout %s", took, timeout)
	}
	c.operatorUntouched(t)

	// The next queen, on the same store (a restart), finds the operator's
	// hive registering again and adopts its worker.
	q2, url2 := startQueenProc(t, filepath.Join(c.owned, "queen"), "", "--addr", strings.TrimPrefix(c.url, "http://"))
	if url2 != c.url {
		t.Fatalf("second queen on %s, want %s", url2, c.url)
	}
	q2.logs.wait(t, 0, "pool inventory reconciled", map[string]string{"pool_id": "op", "adopted": "1", "unknown": "0"})
	row, err := keeper.NewClient(url2, "", "").Workers(t.Context(), keeper.WorkerFilter{PoolID: "op"})
	if err != nil || len(row) != 1 || row[0].ID != c.opRow || row[0].Status != "RUNNING" {
		t.Errorf("operator's row with the next queen: %+v %v", row, err)
	}
	c.operatorUntouched(t)
	if err := q2.stop(t, syscall.SIGTERM); err != nil {
		t.Errorf("second queen exit: %v", err)
	}
	c.operatorUntouched(t) // an operator's hive is no queen's to stop
}

// "After 5 Minutes Idle" (shortened): the worker dies, the hive and the
// queen stay up, and the row records the stop.
func TestWhatDiesWhen_AfterIdleTimeout_WorkerDies_QueenAndHiveStay(t *testing.T) {
	dir := t.TempDir()
	q, url := startQueenProc(t, filepath.Join(dir, "queen"), "", "--local-hive", "--hive-arg=--models-dir="+ownModelsDir(t, dir),
		"--hive-arg=--worker-threads=1", "--hive-arg=--idle-timeout=1s", "--hive-arg=--health-interval=200ms",
		"--hive-arg=--worker-ports=26000-26499")
	q.logs.wait(t, 0, "pool status changed", map[string]string{"pool_id": "local", "to": "healthy"})
	resp, err := keeper.NewClient(url, "", "").StartWorker(t.Context(), "tiny", LocalPoolID, nil, "idle test")
	if err != nil {
		t.Fatal(err)
	}
	q.logs.wait(t, 0, "lifecycle row changed", map[string]string{"lifecycle_id": resp.LifecycleID, "to": "RUNNING"})
	worker := ownWorkerOf(t, dir)
	rec, _ := q.logs.wait(t, 0, "lifecycle row changed", map[string]string{"lifecycle_id": resp.LifecycleID, "to": "DRAINING"})
	if !strings.Contains(rec.Attrs["reason"], "idle for 1s") {
		t.Errorf("row drained with reason %q", rec.Attrs["reason"])
	}
	q.logs.wait(t, 0, "lifecycle row changed", map[string]string{"lifecycle_id": resp.LifecycleID, "to": "STOPPED"})
	testbin.AwaitDead(t, worker, waitLimit)
	hive := testbin.AwaitProcess(t, dir, " hive ")
	select {
	case <-q.done:
		t.Fatalf("queen exited: %v", q.Err())
	default:
	}
	if !testbin.Alive(hive) {
		t.Error("hive died with its idle worker")
	}
	if err := q.stop(t, syscall.SIGTERM); err != nil {
		t.Errorf("queen exit: %v", err)
	}
	testbin.AwaitGone(t, dir, waitLimit)
}
