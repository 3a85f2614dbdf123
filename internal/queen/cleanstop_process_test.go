//go:build !race

package queen

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/apiary-llm/apiary/internal/keeper"
	"github.com/apiary-llm/apiary/internal/testbin"
	"github.com/apiary-llm/apiary/internal/testmodel"
)

// startHiveProcIn runs `apiary hive` for pool id at addr with data dir
// dir (the test model in it), so that it can be started again as the same
// hive.
func startHiveProcIn(t *testing.T, queenURL, id, dir, addr string) *proc {
	t.Helper()
	model := filepath.Join(dir, "models", "tiny.gguf")
	if _, err := os.Stat(model); err != nil {
		if err := os.MkdirAll(filepath.Dir(model), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := testmodel.WriteFile(model, testmodel.Options{}); err != nil {
			t.Fatal(err)
		}
	}
	return startProc(t, "hive "+id, nil, "hive", "--addr", addr, "--queen", queenURL, "--pool-id", id,
		"--data-dir", dir, "--heartbeat-interval", "200ms", "--worker-ports", "22000-22999", "--worker-threads", "1")
}

// The README's stop line, `kill $hive $queen`, stops the hive's worker
// cleanly ("graceful stop: exit code 0" in the hive's log), but the
// queen was gone before the worker's last events reached it: after the
// queen came back its pool was shown healthy with no hive behind it, and
// the row RUNNING, then FAILED "lost: the hive's inventory after it
// registered does not have this worker" when the hive came back. Now the
// hive keeps the events the queen did not take (in its data dir) and
// sends them when it registers again, before its inventory; the restored
// pool is unhealthy until its hive is heard from. With the queen and the
// hive stopped together, and with the queen stopped first: after the
// queen restarts no row is FAILED and the pool is not healthy; after the
// hive restarts the worker's row is STOPPED with the hive's reason.
func TestProcessCleanStopOfHiveAndQueenLeavesTruthfulRows(t *testing.T) {
	for _, together := range []bool{true, false} {
		name := "together"
		if !together {
			name = "queen first"
		}
		t.Run(name, func(t *testing.T) {
			dir, hiveDir := t.TempDir(), t.TempDir()
			q, qURL := startQueenProc(t, dir, "")
			addr, hiveAddr := strings.TrimPrefix(qURL, "http://"), testbin.FreeAddr(t)
			h := startHiveProcIn(t, qURL, "node-1", hiveDir, hiveAddr)
			q.logs.wait(t, 0, "pool status changed", map[string]string{"pool_id": "node-1", "to": "healthy"})
			c := keeper.NewClient(qURL, "", "")
			resp, err := c.StartWorker(t.Context(), "tiny", "node-1", nil, "clean stop test")
			if err != nil {
				t.Fatal(err)
			}
			q.logs.wait(t, 0, "lifecycle row changed", map[string]string{"lifecycle_id": resp.LifecycleID, "to": "RUNNING"})

			if together {
				h.Signal(syscall.SIGTERM)
				if err := q.stop(t, syscall.SIGTERM); err != nil {
					t.Errorf("queen exit: %v", err)
				}
			} else if err := q.stop(t, syscall.SIGTERM); err != nil {
				t.Errorf("queen exit: %v", err)
			}
			if err := h.stop(t, syscall.SIGTERM); err != nil {
				t.Errorf("hive exit: %v", err)
			}
			rec, _ := h.logs.wait(t, 0, "worker state", map[string]string{"to": "stopped"})
			if !strings.Contains(rec.Attrs["reason"], "graceful stop: exit code 0") {
				t.Fatalf("the worker did not stop cleanly: %s", rec.Attrs["reason"])
			}

			q, _ = startQueenProc(t, dir, "", "--addr", addr)
			pools, err := c.Pools(t.Context(), keeper.PoolFilter{})
			if err != nil {
				t.Fatal(err)
			}
			if len(pools) != 1 || pools[0].Status == "healthy" {
				t.Errorf("pools after the queen came back without its hive: %+v", pools)
			}
			rows, err := c.Workers(t.Context(), keeper.WorkerFilter{})
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range rows {
				if r.Status == "FAILED" {
					t.Errorf("a row is FAILED after the queen came back: %+v", r)
				}
			}

			h = startHiveProcIn(t, qURL, "node-1", hiveDir, hiveAddr)
			q.logs.wait(t, 0, "pool inventory reconciled", map[string]string{"pool_id": "node-1"})
			if rows, err = c.Workers(t.Context(), keeper.WorkerFilter{}); err != nil || len(rows) != 1 {
				t.Fatalf("rows after the hive came back: %+v %v", rows, err)
			}
			if r := rows[0]; r.ID != resp.LifecycleID || r.Status != "STOPPED" || !strings.Contains(r.Reason, "graceful stop: exit code 0") {
				t.Errorf("the cleanly stopped worker's row after the hive came back: %s %q, want STOPPED with the hive's reason", rows[0].Status, rows[0].Reason)
			}
			if err := h.stop(t, syscall.SIGTERM); err != nil {
				t.Errorf("hive exit: %v", err)
			}
			if err := q.stop(t, syscall.SIGTERM); err != nil {
				t.Errorf("queen exit: %v", err)
			}
		})
	}
}
