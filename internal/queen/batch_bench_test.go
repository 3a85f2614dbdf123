//go:build !race

package queen

// Benchmarks of the Batch API with real processes (queen, hive, one
// worker on the generated test model): what a batch that keeps every
// slot busy does to interactive requests, and how fast a batch gets
// through its requests against a client sending them itself.
//
//	go test -run '^$' -bench 'BatchInteractiveTTFT|BatchThroughput' -benchtime 1x ./internal/queen/

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	oai "github.com/openai/openai-go"
	"github.com/openai/openai-go/option"

	"github.com/apiary-llm/apiary/internal/keeper"
	"github.com/apiary-llm/apiary/internal/testbin"
)

// batchBenchSlots is the worker's slots (and the queen's --worker-slots).
const batchBenchSlots = 4

// batchBench is a queen, a hive and one running worker of
// batchBenchSlots slots; --max-workers 1 keeps the controller from
// placing a second worker for the batch's demand.
func batchBench(b *testing.B) (qURL string, q *proc, client oai.Client, dir string) {
	slots := fmt.Sprint(batchBenchSlots)
	var env []string
	if os.Getenv(timelineEnv) != "" {
		env = []string{"APIARY_LOG_LEVEL=debug", "APIARY_LOG_JSON=1"}
	}
	qURL, admin, q, dir := benchClusterIn(b, b.TempDir(), env, testbin.TLSFiles{}, []string{"--worker-slots", slots, "--queue-size", "512", "--max-workers", "1"}, "--worker-slots", slots)
	resp, err := admin.StartWorker(context.Background(), "tiny", "node-1", nil, "batch benchmark")
	if err != nil {
		b.Fatal(err)
	}
	q.logs.wait(b, 0, "lifecycle row changed", map[string]string{"lifecycle_id": resp.LifecycleID, "to": "RUNNING"})
	if rows, err := admin.Workers(context.Background(), keeper.WorkerFilter{}); err != nil || len(rows) != 1 {
		b.Fatalf("rows %+v %v", rows, err)
	}
	return qURL, q, oai.NewClient(option.WithBaseURL(qURL+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0)), dir
}

// batchCounts is the part of apiary's batch object the benchmarks follow.
type batchCounts struct {
	Status        string
	Running       int
	RequestCounts struct{ Completed, Failed int } `json:"request_counts"`
}

// pollBatch reads the batch every 10 ms until until holds (or waitLimit
// passes, which fails the benchmark).
func pollBatch(b *testing.B, client oai.Client, id string, until func(batchCounts) bool) batchCounts {
	b.Helper()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(waitLimit)
	for {
		var c batchCounts
		if err := client.Get(context.Background(), "batches/"+id, nil, &c); err != nil {
			b.Fatal(err)
		}
		if until(c) {
			return c
		}
		select {
		case <-tick.C:
		case <-deadline:
			b.Fatalf("batch %s: %+v after %s", id, c, waitLimit)
		}
	}
}

// BenchmarkBatchInteractiveTTFT: time to first token of streamed
// interactive requests (8 tokens, one at a time) with the worker idle
// and while a batch keeps every slot busy (its requests waiting for each
// freed slot), rounds alternating idle and busy. An interactive request
// that finds every slot held by batch requests takes the youngest one's
// slot (that request is cancelled and queued again): it waits for the
// worker to see the batch request go, not for one to end; batches of
// short (8-token) and long (64-token) requests show whether the wait
// still grows with the batch requests' length. Reported: TTFT p50 and p99 of each side, the token time
// (inter-token latency p50) of each side, and the added p50 in token
// times of the busy worker.
func BenchmarkBatchInteractiveTTFT(b *testing.B) {
	qURL, q, client, dir := batchBench(b)
	var wins []window
	ctx := context.Background()
	hc := &http.Client{Transport: &http.Transport{DisableCompression: true}}
	defer hc.CloseIdleConnections()
	const body = `{"model":"tiny","prompt":"Once upon a time","max_tokens":8,"temperature":0,"ignore_eos":true,"stream":true}`
	const rounds, perRound = 4, 10
	for range 3 {
		round(ctx, b, hc, qURL, body, 1, &sample{})
	}
	b.ResetTimer()
	for b.Loop() {
		var report []string
		for _, batchTokens := range []int{8, 64} {
			var idle, busy sample
			measure := func(s *sample) {
				from := time.Now()
				for range perRound {
					round(ctx, b, hc, qURL, body, 1, s)
				}
				wins = append(wins, window{from: from, to: time.Now(), busy: s == &busy, tokens: batchTokens})
			}
			busyRound := func() {
				id := newBatch(b, client, 1000, batchTokens)
				// Every slot taken and the batch's own waiters queued.
				pollBatch(b, client, id, func(c batchCounts) bool {
					return c.RequestCounts.Completed >= batchBenchSlots && c.Running > batchBenchSlots
				})
				measure(&busy)
				c := pollBatch(b, client, id, func(batchCounts) bool { return true })
				if c.Status != "in_progress" || c.Running <= batchBenchSlots {
					b.Fatalf("the batch ran dry while measuring: %+v", c)
				}
				if _, err := client.Batches.Cancel(ctx, id); err != nil {
					b.Fatal(err)
				}
				pollBatch(b, client, id, func(c batchCounts) bool { return c.Status == "cancelled" })
			}
			for i := range rounds {
				if i%2 == 0 {
					measure(&idle)
					busyRound()
				} else {
					busyRound()
					measure(&idle)
				}
			}
			tok := pct(busy.itl, .5)
			added := pct(busy.ttft, .5) - pct(idle.ttft, .5)
			report = append(report, fmt.Sprintf("batch of %d-token requests: TTFT p50 idle %v, busy %v (added %v = %.1f token times); p99 idle %v, busy %v; token time p50 idle %v, busy %v [%d samples a side]",
				batchTokens, pct(idle.ttft, .5), pct(busy.ttft, .5), added, float64(added)/float64(tok), pct(idle.ttft, .99), pct(busy.ttft, .99),
				pct(idle.itl, .5), tok, len(idle.ttft)))
			sfx := fmt.Sprintf("/batch%d", batchTokens)
			b.ReportMetric(float64(pct(idle.ttft, .5).Microseconds()), "idle-ttft-p50-µs"+sfx)
			b.ReportMetric(float64(pct(busy.ttft, .5).Microseconds()), "busy-ttft-p50-µs"+sfx)
			b.ReportMetric(float64(pct(idle.ttft, .99).Microseconds()), "idle-ttft-p99-µs"+sfx)
			b.ReportMetric(float64(pct(busy.ttft, .99).Microseconds()), "busy-ttft-p99-µs"+sfx)
			b.ReportMetric(float64(pct(idle.itl, .5).Microseconds()), "idle-token-µs"+sfx)
			b.ReportMetric(float64(tok.Microseconds()), "busy-token-µs"+sfx)
			b.ReportMetric(float64(added)/float64(tok), "added-ttft-p50-tokens"+sfx)
			b.ReportMetric(float64(pct(busy.ttft, .5))/float64(pct(idle.ttft, .5)), "busy/idle-ttft-p50"+sfx)
		}
		b.Log("\n" + strings.Join(report, "\n"))
	}
	if os.Getenv(timelineEnv) != "" {
		reportTimeline(b, q.logs.String(), dir, wins)
	}
}

// BenchmarkBatchThroughput: requests per second to get N chat requests
// (16 tokens each) done through the Batch API (upload to the batch's
// end, as the queen logs it) against the same N requests sent by a
// client straight to /v1/chat/completions all at once, on the same
// worker, rounds alternating. Reported: the median of the per-round
// ratios (batch / direct), the median requests/s of each side and the
// queen's CPU time a request on each side.
func BenchmarkBatchThroughput(b *testing.B) {
	qURL, q, client, _ := batchBench(b)
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 512, DisableCompression: true}}
	defer hc.CloseIdleConnections()
	const n, tokens, rounds = 500, 16, 6
	chatDirect(b, hc, qURL, 8, tokens) // warm the connections and the worker
	next := 0
	qPID := q.cmd.Process.Pid
	var batchCPU, directCPU time.Duration // the queen's, over every round
	viaBatch := func() float64 {
		cpu0 := cpuTime(b, qPID)
		defer func() { batchCPU += cpuTime(b, qPID) - cpu0 }()
		start := time.Now()
		id := newBatch(b, client, n, tokens)
		rec, nx := q.logs.wait(b, next, "batch ended", map[string]string{"batch_id": id})
		took := time.Since(start)
		next = nx
		if rec.Attrs["status"] != "completed" || rec.Attrs["succeeded"] != fmt.Sprint(n) {
			b.Fatalf("batch ended: %v", rec.Attrs)
		}
		return float64(n) / took.Seconds()
	}
	direct := func() float64 {
		cpu0 := cpuTime(b, qPID)
		defer func() { directCPU += cpuTime(b, qPID) - cpu0 }()
		start := time.Now()
		chatDirect(b, hc, qURL, n, tokens)
		return float64(n) / time.Since(start).Seconds()
	}
	b.ResetTimer()
	for b.Loop() {
		var ratios, batchRPS, directRPS []float64
		for i := range rounds {
			var br, dr float64
			if i%2 == 0 {
				br = viaBatch()
				dr = direct()
			} else {
				dr = direct()
				br = viaBatch()
			}
			batchRPS, directRPS, ratios = append(batchRPS, br), append(directRPS, dr), append(ratios, br/dr)
		}
		med := func(x []float64) float64 {
			s := slices.Clone(x)
			slices.Sort(s)
			return (s[(len(s)-1)/2] + s[len(s)/2]) / 2
		}
		perReq := func(d time.Duration) time.Duration { return d / time.Duration(n*rounds) }
		b.Logf("%d requests of %d tokens, %d rounds: batch %.1f req/s, direct %.1f req/s (medians); ratios by round %.3f; the queen's CPU a request: batch %v, direct %v",
			n, tokens, rounds, med(batchRPS), med(directRPS), ratios, perReq(batchCPU), perReq(directCPU))
		b.ReportMetric(float64(perReq(batchCPU).Microseconds()), "batch-queen-cpu-µs/req")
		b.ReportMetric(float64(perReq(directCPU).Microseconds()), "direct-queen-cpu-µs/req")
		b.ReportMetric(med(ratios), "batch/direct-rps")
		b.ReportMetric(med(batchRPS), "batch-req/s")
		b.ReportMetric(med(directRPS), "direct-req/s")
	}
}
