//go:build !race

package queen

import (
	"context"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	oai "github.com/openai/openai-go"
	"github.com/openai/openai-go/option"

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

// steadyLoad sends small completions from streams clients, one after the
// other each, and hands every result to the test as it comes, until stop
// is closed.
func steadyLoad(url string, streams int, stop <-chan struct{}) <-chan error {
	client := oai.NewClient(option.WithBaseURL(url+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	out := make(chan error, 1024)
	var wg sync.WaitGroup
	for range streams {
		wg.Go(func() {
			for {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				_, err := client.Completions.New(ctx, completion(2))
				cancel()
				select {
				case out <- err:
				case <-stop:
					return
				}
			}
		})
	}
	go func() { wg.Wait(); close(out) }()
	return out
}

// A second hive started with the pool id of a live one, then SIGTERMed,
// before and after a queen restart. After a restart the queen had
// forgotten which hive held the pool: the refused hive's going offline
// was taken, the pool went offline (requests 404 for ~12 s), the real
// worker's row FAILED ("lost: pool deregistered") and the worker was
// stopped when the real hive registered again. Now the holder is kept in
// the store: each time the second hive is refused, its going offline is
// refused (409), the pool stays healthy, the worker's row RUNNING, and
// every request sent meanwhile (and after) is answered 200.
func TestProcessDuplicateHiveChangesNothing(t *testing.T) {
	dir := t.TempDir()
	q, qURL := startQueenProc(t, dir, "")
	addr := strings.TrimPrefix(qURL, "http://")
	a := startHiveProc(t, qURL, "node-1", 200*time.Millisecond)
	t.Cleanup(func() { _ = a.stop(t, syscall.SIGTERM) })
	q.logs.wait(t, 0, "pool status changed", map[string]string{"pool_id": "node-1", "to": "healthy"})
	c := keeper.NewClient(qURL, "", "")
	resp, err := c.StartWorker(t.Context(), "tiny", "node-1", nil, "duplicate hive test")
	if err != nil {
		t.Fatal(err)
	}
	q.logs.wait(t, 0, "lifecycle row changed", map[string]string{"lifecycle_id": resp.LifecycleID, "to": "RUNNING"})
	holder := a.hiveURL(t)

	for round, restart := range []bool{false, true} {
		if restart {
			if err := q.stop(t, syscall.SIGTERM); err != nil {
				t.Fatalf("queen exit: %v", err)
			}
			var url string
			q, url = startQueenProc(t, dir, "", "--addr", addr)
			if url != qURL {
				t.Fatalf("the queen came back on %s, want %s", url, qURL)
			}
			// The holder answered the new queen: its pool is back.
			q.logs.wait(t, 0, "worker tokens fetched from the hive", map[string]string{"pool_id": "node-1"})
		}
		stop := make(chan struct{})
		results := steadyLoad(qURL, 2, stop)
		var sent, failed int
		var firstErr error
		take := func(n int) {
			for range n {
				err := <-results
				sent++
				if err != nil {
					failed++
					firstErr = cmp0(firstErr, err)
				}
			}
		}
		take(5)
		b := startHiveProc(t, qURL, "node-1", 200*time.Millisecond)
		b.logs.wait(t, 0, "the queen refuses this hive: another live hive holds its pool id; working standalone and "+
			"registering again every heartbeat interval until that hive stops, or give this hive its own --pool-id", map[string]string{"pool_id": "node-1"})
		take(5)
		if err := b.stop(t, syscall.SIGTERM); err != nil {
			t.Errorf("round %d: the second hive's exit: %v", round, err)
		}
		// "pool offline at the queen" (taken), or "could not take the
		// pool offline at the queen; …" (refused).
		rec, _ := b.logs.wait(t, 0, "pool offline at the queen", nil)
		if e := rec.Attrs["err"]; !strings.HasPrefix(rec.Msg, "could not") || !strings.Contains(e, "409") || !strings.Contains(e, holder) {
			t.Errorf("round %d: the second hive's going offline: %q %s, want it refused 409 naming the holder", round, rec.Msg, e)
		}
		// A going offline that was taken would fail these at once.
		take(20)
		close(stop)
		for err := range results {
			sent++
			if err != nil {
				failed++
				firstErr = cmp0(firstErr, err)
			}
		}
		t.Logf("round %d (queen restarted: %v): %d requests, %d failed", round, restart, sent, failed)
		if failed > 0 {
			t.Errorf("round %d: %d of %d requests failed; the first: %v", round, failed, sent, firstErr)
		}
		if q.logs.Has("pool status changed", map[string]string{"pool_id": "node-1", "to": "offline"}) {
			t.Errorf("round %d: the pool went offline", round)
		}
		pools, err := c.Pools(t.Context(), keeper.PoolFilter{})
		if err != nil {
			t.Fatal(err)
		}
		if len(pools) != 1 || pools[0].Status != "healthy" || pools[0].Endpoint != holder || len(pools[0].Workers) != 1 {
			t.Errorf("round %d: pools after the second hive stopped: %+v", round, pools)
		}
		rows, err := c.Workers(t.Context(), keeper.WorkerFilter{})
		if err != nil {
			t.Fatal(err)
		}
		if len(rows) != 1 || rows[0].Status != "RUNNING" {
			t.Errorf("round %d: rows after the second hive stopped: %+v", round, rows)
		}
	}
	if a.logs.Has("worker state", map[string]string{"to": "draining"}) {
		t.Errorf("the holder's worker was stopped:\n%s", a.logs.String())
	}
	if err := q.stop(t, syscall.SIGTERM); err != nil {
		t.Errorf("queen exit: %v", err)
	}
}
