//go:build !race

package queen

import (
	"context"
	"net/http"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/keeper"
	"github.com/apiary-llm/apiary/internal/testbin"
	"github.com/apiary-llm/apiary/internal/testmodel"
)

// BenchmarkEngineColdStart measures what running an external engine as a
// worker adds to the engine's own start: from the hive's spawn (its
// "worker spawned" line) to the row RUNNING at the queen (its "lifecycle
// row changed" line), less the time the same engine, started directly
// right before, takes from its start to its first 200 on /health (asked
// every millisecond). The difference is the front's start, its health
// polling, the ready callback, the hive's transition and the queen's row
// write. For the scripted fake engine and for llama-server on the test
// model:
//
//	go test -run '^$' -bench EngineColdStart -benchtime 20x ./internal/queen
func BenchmarkEngineColdStart(b *testing.B) {
	fake, server := testbin.FakeEngine(b), testbin.LlamaServer(b)
	for _, tc := range []struct {
		name, engine, prog string
		own                func(model string, port int) []string // the engine's own command line
	}{
		{"fake", "vllm", fake, func(model string, port int) []string {
			return []string{fake, "serve", model, "--host", "127.0.0.1", "--port", strconv.Itoa(port)}
		}},
		{"llama-server", "llama", server, func(model string, port int) []string {
			return []string{server, "-m", model, "--host", "127.0.0.1", "--port", strconv.Itoa(port), "-c", "2048", "-np", "1", "-t", "1", "-ngl", "999"}
		}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			engines := docsEngines(b, map[string]string{tc.engine: tc.prog})
			q, hive, qURL := startEngineCluster(b, engines, "models:\n  tiny:\n    engine: "+tc.engine+"\n", "tiny")
			model := filepath.Join(b.TempDir(), "tiny.gguf")
			if err := testmodel.WriteFile(model, testmodel.Options{}); err != nil {
				b.Fatal(err)
			}
			admin := keeper.NewClient(qURL, "", "")
			ctx := b.Context()
			var own, total, over []time.Duration
			qFrom, hFrom := 0, 0
			for b.Loop() {
				o := ownStart(b, tc.own(model, testbin.FreePort(b)))
				resp, err := admin.StartWorker(ctx, "tiny", "node-1", nil, "bench")
				if err != nil {
					b.Fatal(err)
				}
				id := resp.LifecycleID
				spawned, n := hive.logs.wait(b, hFrom, "worker spawned", map[string]string{"engine": tc.engine})
				hFrom = n
				ready, m := q.logs.wait(b, qFrom, "lifecycle row changed", map[string]string{"lifecycle_id": id, "to": "RUNNING"})
				qFrom = m
				d := recordTime(b, ready).Sub(recordTime(b, spawned))
				own, total, over = append(own, o), append(total, d), append(over, d-o)
				if _, err := admin.StopWorker(ctx, id, false, "bench"); err != nil {
					b.Fatal(err)
				}
				_, qFrom = q.logs.wait(b, qFrom, "lifecycle row changed", map[string]string{"lifecycle_id": id, "to": "STOPPED"})
			}
			b.StopTimer()
			report := func(name string, d []time.Duration) {
				slices.Sort(d)
				q := func(p float64) float64 {
					return float64(d[min(len(d)-1, int(p*float64(len(d))))].Microseconds()) / 1000
				}
				b.ReportMetric(q(0.5), name+"-p50-ms")
				b.ReportMetric(q(0.1), name+"-p10-ms")
				b.ReportMetric(q(0.9), name+"-p90-ms")
			}
			report("own", own)
			report("spawn-to-row", total)
			report("overhead", over)
			b.ReportMetric(0, "ns/op")
			if err := hive.stop(b, syscall.SIGTERM); err != nil {
				b.Errorf("hive exit: %v", err)
			}
		})
	}
}

// ownStart starts argv, asks its /health every millisecond until it
// answers 200, and returns the time from the start to that answer; the
// engine is then killed.
func ownStart(b *testing.B, argv []string) time.Duration {
	b.Helper()
	port := ""
	for i, a := range argv {
		if a == "--port" {
			port = argv[i+1]
		}
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	t0 := time.Now()
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	ctx, cancel := context.WithTimeout(b.Context(), waitLimit)
	defer cancel()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.1:"+port+"/health", nil)
		resp, err := c.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return time.Since(t0)
			}
		}
		if ctx.Err() != nil {
			b.Fatalf("%s never answered 200 on /health", argv[0])
		}
		time.Sleep(time.Millisecond)
	}
}

// recordTime is the time a JSON log record was written.
func recordTime(b *testing.B, rec testbin.Record) time.Time {
	at, err := time.Parse(time.RFC3339Nano, rec.Attrs["time"])
	if err != nil {
		b.Fatalf("log record without a time: %v", rec)
	}
	return at
}
