//go:build !race

package queen

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/keeper"
	"github.com/apiary-llm/apiary/internal/testbin"
	"github.com/apiary-llm/apiary/internal/testmodel"
)

// proc is an apiary daemon run as a process by a test (testbin.Proc),
// with its JSON log lines parsed as they come.
type proc struct {
	*testbin.Proc
	logs *logWatch // over Proc.Lines
	cmd  *exec.Cmd
	done <-chan struct{}
	name string
}

func startProc(t testing.TB, name string, env []string, args ...string) *proc {
	t.Helper()
	p := testbin.Start(t, name, env, append(args, "--log-json")...)
	return &proc{Proc: p, logs: &logWatch{Lines: p.Lines}, cmd: p.Cmd, done: p.Done(), name: name}
}

// stop sends sig and waits for the exit; it returns how the process
// ended (nil: exit code 0).
func (p *proc) stop(t testing.TB, sig syscall.Signal) error {
	p.Signal(sig)
	select {
	case <-p.done:
		return p.Err()
	case <-time.After(waitLimit):
		t.Fatalf("%s did not exit within %s of %v; logs:\n%s", p.name, waitLimit, sig, p.logs.String())
		return nil
	}
}

// logTime is the time a JSON log record was written.
func logTime(t *testing.T, rec testbin.Record) time.Time {
	t.Helper()
	at, err := time.Parse(time.RFC3339Nano, rec.Attrs["time"])
	if err != nil {
		t.Fatalf("log record without a time: %v", rec)
	}
	return at
}

// startQueenProc runs `apiary queen` on a free port and returns it with its
// URL.
func startQueenProc(t testing.TB, dataDir, dbURL string, extra ...string) (*proc, string) {
	t.Helper()
	args := []string{"queen", "--addr", "127.0.0.1:0", "--flush-interval", "100ms"}
	if dbURL != "" {
		args = append(args, "--database-url", dbURL)
	} else {
		args = append(args, "--data-dir", dataDir)
	}
	q := startProc(t, "queen", nil, append(args, extra...)...)
	rec, _ := q.logs.wait(t, 0, "queen serving", nil)
	return q, "http://" + rec.Attrs["addr"]
}

// startHiveProc runs `apiary hive` for pool id with the test model.
func startHiveProc(t *testing.T, queenURL, id string, interval time.Duration) *proc {
	t.Helper()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "models"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := testmodel.WriteFile(filepath.Join(dir, "models", "tiny.gguf"), testmodel.Options{}); err != nil {
		t.Fatal(err)
	}
	return startProc(t, "hive "+id, nil, "hive", "--addr", "127.0.0.1:0", "--queen", queenURL, "--pool-id", id,
		"--data-dir", dir, "--heartbeat-interval", interval.String(), "--worker-ports", "22000-22999", "--worker-threads", "1")
}

// A queen restart (SIGTERM, start again on the same store) keeps every
// row, the pool stays healthy, the hive's first heartbeat to the new queen
// adopts the running worker, and the worker can still be stopped.
func TestProcessQueenRestartKeepsRows(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		dir, url := b.new(t)
		q1, qURL := startQueenProc(t, dir, url)
		hive := startHiveProc(t, qURL, "node-1", 300*time.Millisecond)
		q1.logs.wait(t, 0, "pool status changed", map[string]string{"pool_id": "node-1", "to": "healthy"})

		ctx := t.Context()
		c := keeper.NewClient(qURL, "", "")
		resp, err := c.StartWorker(ctx, "tiny", "node-1", nil, "restart test")
		if err != nil {
			t.Fatal(err)
		}
		id := resp.LifecycleID
		q1.logs.wait(t, 0, "lifecycle row changed", map[string]string{"lifecycle_id": id, "to": "RUNNING"})
		before, err := c.Workers(ctx, keeper.WorkerFilter{})
		if err != nil {
			t.Fatal(err)
		}
		if err := q1.stop(t, syscall.SIGTERM); err != nil {
			t.Fatalf("queen exit after SIGTERM: %v", err)
		}

		q2, qURL2 := startQueenProc(t, dir, url, "--addr", strings.TrimPrefix(qURL, "http://"))
		if qURL2 != qURL {
			t.Fatalf("queen came back on %s, want %s", qURL2, qURL)
		}
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("hive logs:\n%s", hive.logs.String())
			}
		})
		q2.logs.wait(t, 0, "pool inventory reconciled", map[string]string{"pool_id": "node-1", "adopted": "1", "lost": "0", "unknown": "0"})
		after, err := c.Workers(ctx, keeper.WorkerFilter{})
		if err != nil {
			t.Fatal(err)
		}
		ignoreBeat := cmp.FilterPath(func(p cmp.Path) bool { return p.Last().String() == ".LastHeartbeatAt" }, cmp.Ignore())
		if diff := cmp.Diff(before, after, ignoreBeat); diff != "" {
			t.Errorf("rows after restart (-before +after):\n%s", diff)
		}
		pools, err := c.Pools(ctx, keeper.PoolFilter{})
		if err != nil {
			t.Fatal(err)
		}
		if len(pools) != 1 || pools[0].Status != "healthy" || len(pools[0].Workers) != 1 {
			t.Errorf("pools after restart: %+v", pools)
		}
		if _, err := c.StopWorker(ctx, id, true, "done"); err != nil {
			t.Fatal(err)
		}
		q2.logs.wait(t, 0, "lifecycle row changed", map[string]string{"lifecycle_id": id, "to": "STOPPED"})
		entries, err := c.Audit(ctx, "", 0)
		if err != nil {
			t.Fatal(err)
		}
		var actions []string
		for i := len(entries) - 1; i >= 0; i-- {
			if entries[i].Target == id {
				actions = append(actions, entries[i].Action)
			}
		}
		if actions[0] != "worker.start" || actions[len(actions)-1] != "worker.stopped" || !contains(actions, "worker.running") || !contains(actions, "worker.stop") {
			t.Errorf("audit of the row: %v", actions)
		}
		if err := hive.stop(t, syscall.SIGTERM); err != nil {
			t.Errorf("hive exit: %v", err)
		}
		if err := q2.stop(t, syscall.SIGTERM); err != nil {
			t.Errorf("queen exit: %v", err)
		}
	})
}

// kill -9 of a hive: its pool is unhealthy within the heartbeat timeout
// (plus one heartbeat interval, the most its last beat can predate the
// kill), and after the grace its rows are FAILED.
func TestProcessHiveKill9MakesPoolUnhealthy(t *testing.T) {
	const timeout, interval, grace = time.Second, 250 * time.Millisecond, 500 * time.Millisecond
	q, qURL := startQueenProc(t, t.TempDir(), "", "--heartbeat-timeout", timeout.String(), "--unhealthy-grace", grace.String())
	hive := startHiveProc(t, qURL, "node-k", interval)
	q.logs.wait(t, 0, "pool status changed", map[string]string{"pool_id": "node-k", "to": "healthy"})
	c := keeper.NewClient(qURL, "", "")
	resp, err := c.StartWorker(t.Context(), "tiny", "", nil, "kill test")
	if err != nil {
		t.Fatal(err)
	}
	_, next := q.logs.wait(t, 0, "lifecycle row changed", map[string]string{"lifecycle_id": resp.LifecycleID, "to": "RUNNING"})

	killed := time.Now()
	if err := hive.stop(t, syscall.SIGKILL); err == nil {
		t.Fatal("hive exited cleanly after SIGKILL")
	}
	rec, next := q.logs.wait(t, next, "pool status changed", map[string]string{"pool_id": "node-k", "to": "unhealthy"})
	took := logTime(t, rec).Sub(killed)
	t.Logf("pool unhealthy %s after kill -9 (timeout %s, heartbeat interval %s)", took.Round(time.Millisecond), timeout, interval)
	if took > timeout+interval+100*time.Millisecond {
		t.Errorf("pool unhealthy %s after the kill, want at most %s", took, timeout+interval)
	}
	if took < timeout-interval-100*time.Millisecond {
		t.Errorf("pool unhealthy after only %s, before the timeout could have passed", took)
	}
	rec, _ = q.logs.wait(t, next, "lifecycle row changed", map[string]string{"lifecycle_id": resp.LifecycleID, "to": "FAILED"})
	if !strings.HasPrefix(rec.Attrs["reason"], "lost: pool unhealthy") {
		t.Errorf("row failed with reason %q", rec.Attrs["reason"])
	}
	var pools []api.Pool
	if pools, err = c.Pools(context.Background(), keeper.PoolFilter{Status: "unhealthy"}); err != nil || len(pools) != 1 {
		t.Errorf("unhealthy pools: %v %v", pools, err)
	}
	if err := q.stop(t, syscall.SIGTERM); err != nil {
		t.Errorf("queen exit: %v", err)
	}
}
