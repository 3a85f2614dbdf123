//go:build !race

package queen

// Benchmarks of routing with real processes: what the queen adds to time
// to first token and to inter-token latency against the same worker, and
// what a cold start costs beyond the worker's own load.
//
//	go test -run '^$' -bench 'RelayOverhead|ColdStartOverhead' -benchtime 1x ./internal/queen/

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/keeper"
	"github.com/apiary-llm/apiary/internal/testbin"
	"github.com/apiary-llm/apiary/internal/testmodel"
)

// workerCPUsEnv pins the benchmark's hive and workers to these CPUs
// (taskset's list), e.g. APIARY_BENCH_WORKER_CPUS=0 with
// `taskset -c 1 go test …`, to measure the relay without the queen taking
// the worker's CPU.
const workerCPUsEnv = "APIARY_BENCH_WORKER_CPUS"

// benchModelEnv names a GGUF file the benchmarks' hive serves as "tiny"
// instead of the default generated model, e.g. one written by
// `apiary models testmodel --layers 8 --dim 512 m.gguf`: a model whose
// token takes milliseconds, as a real one's does, next to fixed costs
// (scheduling, HTTP, the relay) that the default model's 0.1 ms token
// makes look large.
const benchModelEnv = "APIARY_BENCH_MODEL"

// benchCluster runs a queen and a hive as processes for a benchmark.
func benchCluster(b *testing.B, queenArgs []string, hiveArgs ...string) (qURL string, admin *keeper.Client, q *proc) {
	return benchClusterTLS(b, testbin.TLSFiles{}, queenArgs, hiveArgs...)
}

// benchClusterTLS is benchCluster with queen, hive and workers serving
// TLS with certs (and trusting its CA) when certs.Cert is set; admin then
// works only if this process trusts the CA too.
func benchClusterTLS(b *testing.B, certs testbin.TLSFiles, queenArgs []string, hiveArgs ...string) (qURL string, admin *keeper.Client, q *proc) {
	b.Helper()
	qURL, admin, q, _ = benchClusterIn(b, b.TempDir(), nil, certs, queenArgs, hiveArgs...)
	return qURL, admin, q
}

// benchClusterIn is benchClusterTLS in dir (the hive's worker logs are
// under dir/hive/hive/logs) with env added to the daemons'.
func benchClusterIn(b *testing.B, dir string, env []string, certs testbin.TLSFiles, queenArgs []string, hiveArgs ...string) (qURL string, admin *keeper.Client, q *proc, _ string) {
	b.Helper()
	scheme := "http://"
	if certs.Cert != "" {
		env = append(env, "APIARY_CA_FILE="+certs.CA)
		scheme = "https://"
		queenArgs = append(queenArgs, "--tls-cert", certs.Cert, "--tls-key", certs.Key)
		hiveArgs = append(hiveArgs, "--tls-cert", certs.Cert, "--tls-key", certs.Key)
	}
	args := append([]string{"queen", "--addr", "127.0.0.1:0", "--data-dir", filepath.Join(dir, "queen")}, queenArgs...)
	q = startProc(b, "queen", env, args...)
	rec, _ := q.logs.wait(b, 0, "queen serving", nil)
	qURL = scheme + rec.Attrs["addr"]
	if err := os.MkdirAll(filepath.Join(dir, "hive", "models"), 0o755); err != nil {
		b.Fatal(err)
	}
	model := filepath.Join(dir, "hive", "models", "tiny.gguf")
	if from := os.Getenv(benchModelEnv); from != "" {
		// A link, not a copy: such a model may be gigabytes.
		abs, err := filepath.Abs(from)
		if err == nil {
			_, err = os.Stat(abs)
		}
		if err == nil {
			err = os.Symlink(abs, model)
		}
		if err != nil {
			b.Fatalf("%s: %v", benchModelEnv, err)
		}
	} else if err := testmodel.WriteFile(model, testmodel.Options{}); err != nil {
		b.Fatal(err)
	}
	hive := startProc(b, "hive", env, append([]string{"hive", "--addr", "127.0.0.1:0", "--queen", qURL, "--pool-id", "node-1",
		"--data-dir", filepath.Join(dir, "hive"), "--heartbeat-interval", "1s", "--worker-ports", "24000-24999", "--worker-threads", "1"}, hiveArgs...)...)
	q.logs.wait(b, 0, "pool status changed", map[string]string{"pool_id": "node-1", "to": "healthy"})
	if cpus := os.Getenv(workerCPUsEnv); cpus != "" {
		// The hive's threads, and so the workers it spawns, on their own
		// CPUs: run the benchmark itself (client and queen) under
		// `taskset -c` on the others to keep the queen off the worker's.
		if out, err := exec.Command("taskset", "-a", "-c", "-p", cpus, strconv.Itoa(hive.cmd.Process.Pid)).CombinedOutput(); err != nil {
			b.Fatalf("%s=%s: taskset: %v %s", workerCPUsEnv, cpus, err, out)
		}
	}
	b.Cleanup(func() {
		_ = hive.stop(b, syscall.SIGTERM)
		_ = q.stop(b, syscall.SIGTERM)
	})
	return qURL, keeper.NewClient(qURL, "", ""), q, dir
}

// relayCluster is a queen, a hive and one running worker with 64 slots
// (tiny model): the queen's URL and pid, the worker's URL and its token.
func relayCluster(b *testing.B) (qURL string, qPID int, direct, token string) {
	qURL, admin, q := benchCluster(b, []string{"--worker-slots", "64", "--queue-size", "512"}, "--worker-slots", "64")
	ctx := context.Background()
	resp, err := admin.StartWorker(ctx, "tiny", "node-1", nil, "relay benchmark")
	if err != nil {
		b.Fatal(err)
	}
	q.logs.wait(b, 0, "lifecycle row changed", map[string]string{"lifecycle_id": resp.LifecycleID, "to": "RUNNING"})
	rows, err := admin.Workers(ctx, keeper.WorkerFilter{})
	if err != nil || len(rows) != 1 || rows[0].URI == "" || rows[0].PID == nil {
		b.Fatalf("rows %+v %v", rows, err)
	}
	return qURL, q.cmd.Process.Pid, rows[0].URI, testbin.WorkerToken(b, *rows[0].PID)
}

// BenchmarkRelayOverhead: one worker with 64 slots; at 1, 16 and 64
// concurrent streams of 64 tokens, rounds alternate between the worker
// directly and the queen (direct first, then queen first, …) so that
// drift of the machine falls on both sides alike. Reported: p50 and p99
// of TTFT and inter-token latency on each side, and the queen's added
// p50 and p99 (queen minus direct).
func BenchmarkRelayOverhead(b *testing.B) {
	qURL, _, direct, token := relayCluster(b)
	ctx := context.Background()
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256, DisableCompression: true}}
	defer hc.CloseIdleConnections()
	const body = `{"model":"tiny","prompt":"Once upon a time","max_tokens":64,"temperature":0,"ignore_eos":true,"stream":true}`
	// Warm both paths (connections, the worker's first batch).
	for range 3 {
		roundAs(ctx, b, hc, direct, token, body, 4, &sample{})
		round(ctx, b, hc, qURL, body, 4, &sample{})
	}
	b.ResetTimer()
	for b.Loop() {
		var report []string
		for _, c := range []struct{ streams, rounds int }{{1, 40}, {16, 12}, {64, 6}} {
			var d, viaQueen sample
			for i := range c.rounds {
				if i%2 == 0 {
					roundAs(ctx, b, hc, direct, token, body, c.streams, &d)
					round(ctx, b, hc, qURL, body, c.streams, &viaQueen)
				} else {
					round(ctx, b, hc, qURL, body, c.streams, &viaQueen)
					roundAs(ctx, b, hc, direct, token, body, c.streams, &d)
				}
			}
			addTTFT50, addTTFT99 := pct(viaQueen.ttft, .5)-pct(d.ttft, .5), pct(viaQueen.ttft, .99)-pct(d.ttft, .99)
			addITL50, addITL99 := pct(viaQueen.itl, .5)-pct(d.itl, .5), pct(viaQueen.itl, .99)-pct(d.itl, .99)
			report = append(report, fmt.Sprintf("%2d streams: TTFT p50 %v / %v (added %v), p99 %v / %v (added %v); ITL p50 %v / %v (added %v), p99 %v / %v (added %v) [direct / queen; %d TTFT, %d ITL samples a side]",
				c.streams, pct(d.ttft, .5), pct(viaQueen.ttft, .5), addTTFT50, pct(d.ttft, .99), pct(viaQueen.ttft, .99), addTTFT99,
				pct(d.itl, .5), pct(viaQueen.itl, .5), addITL50, pct(d.itl, .99), pct(viaQueen.itl, .99), addITL99, len(d.ttft), len(d.itl)))
			b.ReportMetric(float64(addTTFT50.Microseconds()), fmt.Sprintf("added-ttft-p50-µs/%d", c.streams))
			b.ReportMetric(float64(addTTFT99.Microseconds()), fmt.Sprintf("added-ttft-p99-µs/%d", c.streams))
			b.ReportMetric(float64(addITL50.Microseconds()), fmt.Sprintf("added-itl-p50-µs/%d", c.streams))
			b.ReportMetric(float64(addITL99.Microseconds()), fmt.Sprintf("added-itl-p99-µs/%d", c.streams))
		}
		b.Log("\n" + strings.Join(report, "\n"))
	}
}

// BenchmarkColdStartOverhead: with no worker, a streamed request's time
// to its first token, minus the worker's own load time (its hive's spawn
// to its ready callback) and minus the worker's own time to first token
// when warm (straight to it): what the queen and the hive add to a cold
// start. Each round stops the worker again.
func BenchmarkColdStartOverhead(b *testing.B) {
	qURL, admin, q := benchCluster(b, nil)
	ctx := context.Background()
	hc := &http.Client{Transport: &http.Transport{DisableCompression: true}}
	defer hc.CloseIdleConnections()
	const body = `{"model":"tiny","prompt":"Once upon a time","max_tokens":4,"temperature":0,"ignore_eos":true,"stream":true}`
	var overheads []time.Duration
	var lines []string
	next := 0
	b.ResetTimer()
	for b.Loop() {
		for range 10 {
			cold, _, err := streamTimes(ctx, hc, qURL, "", body)
			if err != nil {
				b.Fatal(err)
			}
			rows, err := admin.Workers(ctx, keeper.WorkerFilter{Status: "RUNNING"})
			if err != nil || len(rows) != 1 {
				b.Fatalf("rows %+v %v", rows, err)
			}
			row := rows[0]
			// The pool's view comes with heartbeats: one taken while the
			// worker was starting may still be the latest, so wait for
			// the next (1s) rather than fail.
			var w api.Worker
			for wait := time.Now().Add(5 * time.Second); w.ReadyAt == nil; time.Sleep(50 * time.Millisecond) {
				pools, err := admin.Pools(ctx, keeper.PoolFilter{})
				if err != nil {
					b.Fatal(err)
				}
				for _, p := range pools {
					for _, x := range p.Workers {
						if x.LifecycleID == row.ID {
							w = x
						}
					}
				}
				if w.ReadyAt == nil && time.Now().After(wait) {
					b.Fatalf("worker of %s not ready in the registry: %+v", row.ID, pools)
				}
			}
			load := w.ReadyAt.Sub(w.StartedAt)
			token := testbin.WorkerToken(b, w.PID)
			var warm []time.Duration
			for range 5 {
				t, _, err := streamTimes(ctx, hc, row.URI, token, body)
				if err != nil {
					b.Fatal(err)
				}
				warm = append(warm, t)
			}
			own := pct(warm, .5)
			over := cold - load - own
			overheads = append(overheads, over)
			lines = append(lines, fmt.Sprintf("cold TTFT %v = worker load %v + warm TTFT %v + overhead %v (placement to spawn %v)",
				cold.Round(time.Microsecond), load.Round(time.Microsecond), own.Round(time.Microsecond), over.Round(time.Microsecond),
				w.StartedAt.Sub(row.CreatedAt).Round(time.Microsecond)))
			if _, err := admin.StopWorker(ctx, row.ID, false, "cold start benchmark"); err != nil {
				b.Fatal(err)
			}
			_, next = q.logs.wait(b, next, "lifecycle row changed", map[string]string{"lifecycle_id": row.ID, "to": "STOPPED"})
		}
	}
	b.ReportMetric(float64(pct(overheads, .5).Microseconds()), "overhead-p50-µs")
	b.ReportMetric(float64(slices.Max(overheads).Microseconds()), "overhead-max-µs")
	b.Log("\n" + strings.Join(lines, "\n"))
}
