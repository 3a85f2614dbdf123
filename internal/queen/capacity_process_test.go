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
	"sync"
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
// that request and the next get 503 no_capacity naming the drain. The
// long stream (holdingModel) outlasts the drain.
func TestProcessDrainedPoolAnswersNoCapacity(t *testing.T) {
	c := startClusterWith(t, clusterOptions{model: holdingModel}, []string{"--queue-timeout", longQueue.String(), "--log-level", "debug"})
	ctx := t.Context()
	first := make(chan struct{})
	var wg sync.WaitGroup
	long, stop := context.WithCancel(ctx)
	defer wg.Wait()
	defer stop() // the stream that holds the one slot is not waited for
	wg.Go(func() { c.stream(long, completion(1800), first) })
	<-first
	queued := make(chan error, 1)
	go func() {
		_, err := c.client.Completions.New(context.Background(), completion(4), ignoreEOS)
		queued <- err
	}()
	c.queen.logs.wait(t, 0, "request queued", map[string]string{"model_ref": "tiny"})

	drained := time.Now()
	if _, err := c.admin.DrainPool(ctx, "node-1", "capacity test"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-queued:
		refusedFast(t, "waiting when the pool was drained", drained, err, "node-1: pool is draining")
	case <-time.After(waitLimit):
		t.Fatal("the waiting request got no answer")
	}
	start := time.Now()
	_, err := c.client.Completions.New(ctx, completion(4), ignoreEOS)
	refusedFast(t, "sent after the drain", start, err, "node-1: pool is draining")
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
