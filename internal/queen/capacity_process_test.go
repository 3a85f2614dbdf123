//go:build !race

package queen

// Failing fast with real processes: with the only pool drained, or its
// hive SIGKILLed with a RUNNING row, a request gets 503 no_capacity with
// the reason within seconds, not a 504 at the (minute-long) queue
// timeout.

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	oai "github.com/openai/openai-go"
	"github.com/openai/openai-go/option"

	"github.com/apiary-llm/apiary/internal/keeper"
)

// refusedFast checks that err is a 503 no_capacity, with Retry-After and
// a message that has each of want, answered within fastAnswer of start.
func refusedFast(t *testing.T, what string, start time.Time, err error, want ...string) {
	t.Helper()
	took := time.Since(start)
	var apiErr *oai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusServiceUnavailable || apiErr.Code != "no_capacity" ||
		apiErr.Response.Header.Get("Retry-After") == "" || took > fastAnswer {
		t.Errorf("%s: %v after %s, want 503 no_capacity with Retry-After within %s", what, err, took, fastAnswer)
		return
	}
	for _, w := range want {
		if !strings.Contains(apiErr.Message, w) {
			t.Errorf("%s: %q, want it to name %q", what, apiErr.Message, w)
		}
	}
	t.Logf("%s: 503 after %s: %s", what, took.Round(time.Millisecond), apiErr.Message)
}

// The only pool is drained while a request waits for its busy worker:
// drained means no new workers, and the running one serves on — the
// waiting request when the slot frees, and the next one (before, both
// got 503 no_capacity, an outage). A request pinned to another model
// needs a new worker there, which a drained pool does not get.
func TestProcessDrainedPoolKeepsServing(t *testing.T) {
	h := newHolds(t)
	c := startClusterWith(t, clusterOptions{hiveEnv: h.env()}, []string{"--queue-timeout", longQueue.String(), "--log-level", "debug"}, h.hiveArgs()...)
	ctx := t.Context()
	first := make(chan struct{})
	done := make(chan struct{})
	h.hold("tiny") // the stream keeps the slot until the test lets it go
	var long streamed
	go func() {
		defer close(done)
		long = c.stream(ctx, completion(32), first)
	}()
	<-first
	queued := make(chan error, 1)
	go func() {
		_, err := c.client.Completions.New(context.Background(), completion(4), ignoreEOS)
		queued <- err
	}()
	c.queen.logs.wait(t, 0, "request queued", map[string]string{"model_ref": "tiny"})

	if _, err := c.admin.DrainPool(ctx, "node-1", "capacity test"); err != nil {
		t.Fatal(err)
	}
	c.queen.logs.wait(t, 0, "pool status changed", map[string]string{"pool_id": "node-1", "to": "draining"})
	select {
	case err := <-queued:
		t.Fatalf("the waiting request was answered while the slot was still taken: %v", err)
	default:
	}
	h.release("tiny") // the slot frees once the stream ends
	<-done
	if long.err != nil || long.tokens != 32 {
		t.Errorf("the stream that held the slot: %d tokens, %v; want all 32", long.tokens, long.err)
	}
	select {
	case err := <-queued:
		if err != nil {
			t.Fatalf("the request waiting when the pool was drained: %v", err)
		}
	case <-time.After(waitLimit):
		t.Fatal("the waiting request got no answer")
	}
	if _, err := c.client.Completions.New(ctx, completion(4), ignoreEOS); err != nil {
		t.Fatalf("a request after the drain: %v", err)
	}
	rows, err := c.admin.Workers(ctx, keeper.WorkerFilter{})
	if err != nil || len(rows) != 1 {
		t.Errorf("rows %+v %v: want the one worker, no new one", rows, err)
	}
}

// kill -9 of the only hive, its worker RUNNING: a request right after
// the kill, and one after the pool went unhealthy, get 503 no_capacity
// with a reason within seconds.
func TestProcessHiveKilledAnswersNoCapacity(t *testing.T) {
	const timeout, interval = 2 * time.Second, 250 * time.Millisecond
	q, qURL := startQueenProc(t, t.TempDir(), "", "--heartbeat-timeout", timeout.String(), "--unhealthy-grace", time.Hour.String(),
		"--queue-timeout", longQueue.String())
	hive := startHiveProc(t, qURL, "node-k", interval)
	q.logs.wait(t, 0, "pool status changed", map[string]string{"pool_id": "node-k", "to": "healthy"})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("queen logs:\n%s", q.logs.String())
		}
		if err := q.stop(t, syscall.SIGTERM); err != nil {
			t.Errorf("queen exit: %v", err)
		}
	})
	client := oai.NewClient(option.WithBaseURL(qURL+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	ctx := t.Context()
	if _, err := client.Completions.New(ctx, completion(4), ignoreEOS); err != nil {
		t.Fatalf("cold request: %v", err)
	}
	rows, err := keeper.NewClient(qURL, "", "").Workers(ctx, keeper.WorkerFilter{})
	if err != nil || len(rows) != 1 || rows[0].Status != "RUNNING" {
		t.Fatalf("rows %+v %v, want one RUNNING", rows, err)
	}

	killed := time.Now()
	if err := hive.stop(t, syscall.SIGKILL); err == nil {
		t.Fatal("hive exited cleanly after SIGKILL")
	}
	_, err = client.Completions.New(ctx, completion(4), ignoreEOS)
	refusedFast(t, "right after the kill", killed, err, "node-k")

	q.logs.wait(t, 0, "pool status changed", map[string]string{"pool_id": "node-k", "to": "unhealthy"})
	start := time.Now()
	_, err = client.Completions.New(ctx, completion(4), ignoreEOS)
	refusedFast(t, "after the pool went unhealthy", start, err, "node-k: pool is unhealthy")
}
