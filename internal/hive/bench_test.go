package hive

import (
	"regexp"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/lifecycle"
)

// Benchmarks of the hive's own costs (make bench, or
// go test -run '^$' -bench . -benchtime 200x ./internal/hive).

var loadMS = regexp.MustCompile(`load_ms[":= ]+(\d+)`)

// BenchmarkSpawnToReady measures POST /v2/workers/start → ready. For real
// workers it also reports the overhead beyond the worker's own model load
// (its "model loaded" load_ms); the fake worker loads nothing, so its time
// is all overhead (preflight, port, fork/exec, runtime start, callback).
func BenchmarkSpawnToReady(b *testing.B) {
	for _, kind := range []string{"real", "fake"} {
		b.Run(kind, func(b *testing.B) {
			opts := []hiveOpt{}
			if kind == "real" {
				opts = append(opts, withReal(b))
			}
			th := startHive(b, opts...)
			var totals, overheads []time.Duration
			b.ResetTimer()
			for b.Loop() {
				t0 := time.Now()
				id := th.start()
				ev := th.rec.wait(b, id, lifecycle.Ready)
				total := ev.At.Sub(t0)
				totals = append(totals, total)
				b.StopTimer()
				th.do("POST", "/v2/workers/"+id+"/stop", nil, nil)
				th.gone(id)
				if kind == "real" {
					// The output is complete once the worker is gone.
					w, _ := th.reg.get(id, true)
					m := loadMS.FindSubmatch(w.out.Bytes())
					if m == nil {
						b.Fatalf("worker log has no load_ms:\n%s", w.out.Bytes())
					}
					ms, _ := strconv.Atoi(string(m[1]))
					overheads = append(overheads, total-time.Duration(ms)*time.Millisecond)
				}
				b.StartTimer()
			}
			report(b, "spawn-to-ready", totals)
			if kind == "real" {
				report(b, "overhead", overheads)
			}
		})
	}
}

// BenchmarkCrashToFailed measures from SIGKILL of a ready worker (a crash
// the hive did not cause) to its transition to failed.
func BenchmarkCrashToFailed(b *testing.B) {
	th := startHive(b)
	var lat []time.Duration
	for b.Loop() {
		b.StopTimer()
		id := th.start()
		ready := th.rec.wait(b, id, lifecycle.Ready)
		b.StartTimer()
		t0 := time.Now()
		if err := syscall.Kill(ready.Worker.PID, syscall.SIGKILL); err != nil {
			b.Fatal(err)
		}
		ev := th.rec.wait(b, id, lifecycle.Failed)
		lat = append(lat, ev.At.Sub(t0))
		b.StopTimer()
		th.gone(id)
		b.StartTimer()
	}
	report(b, "crash-to-failed", lat)
}

// BenchmarkCascade8 measures a hive's shutdown with 8 ready real workers:
// from Shutdown to every worker reaped and Run returned.
func BenchmarkCascade8(b *testing.B) {
	real := withReal(b)
	var lat []time.Duration
	for b.Loop() {
		b.StopTimer()
		th := startHive(b, real)
		ids := make([]string, 8)
		for i := range ids {
			ids[i] = th.start()
		}
		for _, id := range ids {
			th.rec.wait(b, id, lifecycle.Ready)
		}
		b.StartTimer()
		t0 := time.Now()
		th.Shutdown()
		err := <-th.runErr
		lat = append(lat, time.Since(t0))
		b.StopTimer()
		if time.Since(t0) > time.Second {
			b.Logf("slow cascade (%s):\n%s", time.Since(t0), th.logs.String())
			for _, id := range ids {
				w, _ := th.reg.get(id, true)
				b.Logf("worker %s:\n%s", id, w.out.Bytes())
			}
		}
		th.runErr <- err
		for _, id := range ids {
			th.rec.wait(b, id, lifecycle.Stopped)
		}
		b.StartTimer()
	}
	report(b, "cascade", lat)
}

func report(b *testing.B, name string, d []time.Duration) {
	if len(d) == 0 {
		return
	}
	slices.Sort(d)
	q := func(p float64) float64 {
		return float64(d[min(len(d)-1, int(p*float64(len(d))))].Microseconds()) / 1000
	}
	b.ReportMetric(q(0.50), name+"-p50-ms")
	b.ReportMetric(q(0.99), name+"-p99-ms")
	b.ReportMetric(0, "ns/op")
}
