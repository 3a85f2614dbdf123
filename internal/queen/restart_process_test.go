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

// loadResult is one request of restartLoad.
type loadResult struct {
	sent time.Time
	took time.Duration
	err  error
}

// restartLoad sends small completions from streams clients, each one after
// the other, until stop is closed; it returns every request's result.
func restartLoad(url string, streams int, stop <-chan struct{}) func() []loadResult {
	client := oai.NewClient(option.WithBaseURL(url+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	var mu sync.Mutex
	var out []loadResult
	var wg sync.WaitGroup
	for range streams {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				sent := time.Now()
				p := completion(2)
				_, err := client.Completions.New(ctx, p)
				cancel()
				mu.Lock()
				out = append(out, loadResult{sent: sent, took: time.Since(sent), err: err})
				mu.Unlock()
				if err != nil {
					time.Sleep(20 * time.Millisecond) // the queen is down: do not spin
				}
			}
		})
	}
	return func() []loadResult { wg.Wait(); return out }
}

// A queen that restarts (SIGKILL, then SIGTERM) under 8 streams of
// steady load routes to the worker it knows at once: its hive is asked
// for the worker's token instead of waiting for the next heartbeat (5 s
// here), so no request sent after the new queen serves waits more than
// 2 s longer than at rest, and none fails. Before, requests in that
// window were refused 401 by the worker and waited out the queue timeout.
func TestProcessQueenRestartUnderLoad(t *testing.T) {
	dir := t.TempDir()
	q, qURL := startQueenProc(t, dir, "")
	addr := strings.TrimPrefix(qURL, "http://")
	hive := startHiveProc(t, qURL, "node-1", 5*time.Second)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("hive logs:\n%s", hive.logs.String())
		}
		_ = hive.stop(t, syscall.SIGTERM)
	})
	q.logs.wait(t, 0, "pool status changed", map[string]string{"pool_id": "node-1", "to": "healthy"})
	resp, err := keeper.NewClient(qURL, "", "").StartWorker(t.Context(), "tiny", "node-1", nil, "restart under load")
	if err != nil {
		t.Fatal(err)
	}
	q.logs.wait(t, 0, "lifecycle row changed", map[string]string{"lifecycle_id": resp.LifecycleID, "to": "RUNNING"})

	for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGTERM} {
		stop := make(chan struct{})
		results := restartLoad(qURL, 8, stop)
		time.Sleep(2 * time.Second) // at rest
		restarted := time.Now()
		_ = q.stop(t, sig)
		next, url := startQueenProc(t, dir, "", "--addr", addr)
		serving := time.Now()
		if url != qURL {
			t.Fatalf("the queen came back on %s, want %s", url, qURL)
		}
		q = next
		time.Sleep(3 * time.Second) // after the restart
		close(stop)
		var rest time.Duration
		var after, failed int
		var worst time.Duration
		var firstErr error
		for _, r := range results() {
			switch {
			case r.sent.Before(restarted):
				if r.err == nil {
					rest = max(rest, r.took)
				}
			case r.sent.After(serving):
				after++
				worst = max(worst, r.took)
				if r.err != nil {
					failed++
					firstErr = cmp0(firstErr, r.err)
				}
			}
		}
		t.Logf("%v: restart took %s; the slowest request at rest %s, after the new queen served %s (%d requests, %d failed)",
			sig, serving.Sub(restarted).Round(time.Millisecond), rest.Round(time.Millisecond), worst.Round(time.Millisecond), after, failed)
		if rest == 0 || after == 0 {
			t.Fatalf("%v: no request answered at rest (%s) or none sent after the restart (%d)", sig, rest, after)
		}
		if failed > 0 {
			t.Errorf("%v: %d requests sent after the new queen served failed; the first: %v", sig, failed, firstErr)
		}
		if worst > rest+2*time.Second {
			t.Errorf("%v: a request sent after the new queen served took %s, more than 2s over the slowest at rest (%s)", sig, worst, rest)
		}
		q.logs.wait(t, 0, "worker tokens fetched from the hive", map[string]string{"pool_id": "node-1"})
	}
	if err := q.stop(t, syscall.SIGTERM); err != nil {
		t.Errorf("queen exit: %v", err)
	}
}

func cmp0(a, b error) error {
	if a != nil {
		return a
	}
	return b
}
