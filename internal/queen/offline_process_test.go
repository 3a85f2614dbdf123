//go:build !race

package queen

import (
	"syscall"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/keeper"
)

// A hive stopped with SIGTERM stopped its workers at once but
// its pool stayed healthy for the heartbeat timeout (30s here), and
// requests meanwhile failed against a hive that was gone. Now the hive
// takes its pool offline as its last act.
func TestProcessHiveSIGTERMTakesItsPoolOfflineAtOnce(t *testing.T) {
	c := startCluster(t, nil)
	if _, err := c.client.Completions.New(t.Context(), completion(2)); err != nil {
		t.Fatal(err)
	}
	sent := time.Now()
	if err := c.hive.stop(t, syscall.SIGTERM); err != nil {
		t.Fatalf("hive exit: %v", err)
	}
	rec, _ := c.queen.logs.wait(t, 0, "pool status changed", map[string]string{"pool_id": "node-1", "to": "offline"})
	if at := logTime(t, rec); at.Sub(sent) > 10*time.Second {
		t.Errorf("offline %s after SIGTERM: that is the heartbeat timeout, not the hive's word", at.Sub(sent))
	}
	pools, err := c.admin.Pools(t.Context(), keeper.PoolFilter{})
	if err != nil || len(pools) != 1 || pools[0].Status != "offline" {
		t.Fatalf("pools %+v %v", pools, err)
	}
	entries, err := c.admin.Audit(t.Context(), "", 20)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, e := range entries {
		found = found || (e.Action == "pool.offline" && e.Actor == "hive:node-1" && e.Reason == "the hive stopped")
	}
	if !found {
		t.Errorf("no pool.offline by hive:node-1 in the audit: %+v", entries)
	}
	for _, r := range c.rows() {
		if r.Status != "STOPPED" {
			t.Errorf("row %s is %s after the hive stopped", r.ID, r.Status)
		}
	}
}
