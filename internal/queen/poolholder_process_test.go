package queen

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/keeper"
)

// Two real hives started with one --pool-id (as clones of one machine
// were by default): the second is refused while the first lives, says
// so, and keeps trying; the first one's worker keeps running. When the
// first is killed, its pool goes unhealthy and the second takes it over.
func TestProcessTwoHivesWithOnePoolID(t *testing.T) {
	q, qURL := startQueenProc(t, t.TempDir(), "", "--heartbeat-timeout", "1s", "--unhealthy-grace", "500ms")
	a := startHiveProc(t, qURL, "node-1", 200*time.Millisecond)
	q.logs.wait(t, 0, "pool status changed", map[string]string{"pool_id": "node-1", "to": "healthy"})
	c := keeper.NewClient(qURL, "", "")
	resp, err := c.StartWorker(t.Context(), "tiny", "node-1", nil, "two hives test")
	if err != nil {
		t.Fatal(err)
	}
	_, next := q.logs.wait(t, 0, "lifecycle row changed", map[string]string{"lifecycle_id": resp.LifecycleID, "to": "RUNNING"})

	b := startHiveProc(t, qURL, "node-1", 200*time.Millisecond)
	rec, _ := b.logs.wait(t, 0, "the queen refuses this hive: another live hive holds its pool id; working standalone and "+
		"registering again every heartbeat interval until that hive stops, or give this hive its own --pool-id", map[string]string{"pool_id": "node-1"})
	if err := rec.Attrs["err"]; !strings.Contains(err, "409") || !strings.Contains(err, "--pool-id") || !strings.Contains(err, a.hiveURL(t)) {
		t.Errorf("the refused hive's error names neither the holder nor --pool-id: %s", err)
	}
	// Past the queen's heartbeat timeout (and well past two heartbeats
	// of each hive), the first one's worker still runs.
	time.Sleep(2 * time.Second)
	rows, err := c.Workers(t.Context(), keeper.WorkerFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].Status != "RUNNING" {
		t.Fatalf("rows while the second hive retries: %+v", rows)
	}
	pools, err := c.Pools(t.Context(), keeper.PoolFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(pools) != 1 || pools[0].Endpoint != a.hiveURL(t) || pools[0].Status != "healthy" {
		t.Fatalf("pools while the second hive retries: %+v", pools)
	}

	if err := a.stop(t, syscall.SIGKILL); err == nil {
		t.Fatal("hive exited cleanly after SIGKILL")
	}
	_, next = q.logs.wait(t, next, "pool status changed", map[string]string{"pool_id": "node-1", "to": "unhealthy"})
	q.logs.wait(t, next, "pool status changed", map[string]string{"pool_id": "node-1", "to": "healthy"})
	b.logs.wait(t, 0, "registered with queen", nil)
	rec, _ = q.logs.wait(t, next, "lifecycle row changed", map[string]string{"lifecycle_id": resp.LifecycleID, "to": "FAILED"})
	if !strings.HasPrefix(rec.Attrs["reason"], "lost") {
		t.Errorf("the killed hive's worker's row failed with %q", rec.Attrs["reason"])
	}
	if pools, err = c.Pools(t.Context(), keeper.PoolFilter{}); err != nil || len(pools) != 1 || pools[0].Endpoint != b.hiveURL(t) {
		t.Errorf("pools after the takeover: %+v %v", pools, err)
	}
	if err := b.stop(t, syscall.SIGTERM); err != nil {
		t.Errorf("hive exit: %v", err)
	}
	if err := q.stop(t, syscall.SIGTERM); err != nil {
		t.Errorf("queen exit: %v", err)
	}
}

// hiveURL is the URL a hive process registers (its endpoint), from its
// log.
func (p *proc) hiveURL(t *testing.T) string {
	t.Helper()
	rec, _ := p.logs.wait(t, 0, "hive serving", nil)
	return rec.Attrs["url"]
}
