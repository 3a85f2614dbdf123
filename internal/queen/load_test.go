package queen

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/keeper"
)

// Load benchmark: one queen process (SQLite), loadPools simulated hives,
// each beating once a second with two devices and one worker that has a
// lifecycle row. Each iteration is one loadWindow of steady beating;
// reported: client-side heartbeat latency (p50/p99/max), the queen's CPU
// use (of one core), and registry query latency over HTTP during the load.
//
//	go test -run '^$' -bench Heartbeats2000Pools -benchtime 1x ./internal/queen/
const (
	loadPools  = 2000
	loadWindow = 10 * time.Second
)

func BenchmarkHeartbeats2000Pools(b *testing.B) {
	// A fake hive accepts every start, so that each pool gets a row.
	var seq struct {
		sync.Mutex
		n int
	}
	fake := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seq.Lock()
		seq.n++
		id := fmt.Sprintf("w-%d", seq.n)
		seq.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(api.StartWorkerResponse{WorkerID: id, Status: "starting"})
	}))
	defer fake.Close()

	q, qURL := startQueenProcB(b)
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: loadPools, MaxIdleConns: loadPools}, Timeout: 30 * time.Second}
	defer hc.CloseIdleConnections()
	post := func(path string, body any) (time.Duration, error) {
		data, _ := json.Marshal(body)
		start := time.Now()
		resp, err := hc.Post(qURL+path, "application/json", bytes.NewReader(data))
		if err != nil {
			return 0, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		took := time.Since(start)
		if resp.StatusCode != http.StatusOK {
			return took, fmt.Errorf("POST %s: %s", path, resp.Status)
		}
		return took, nil
	}
	gpus := []api.GPU{{ID: 0, Kind: "cuda", Name: "sim", TotalBytes: 24 << 30, FreeBytes: 12 << 30, Workers: []string{}},
		{ID: 1, Kind: "cuda", Name: "sim", TotalBytes: 24 << 30, FreeBytes: 20 << 30, Workers: []string{}}}

	// Register every pool and give each one row.
	c := keeper.NewClient(qURL, "", "")
	workers := make([]api.Worker, loadPools)
	var wg sync.WaitGroup
	errs := make(chan error, loadPools)
	sem := make(chan struct{}, 16)
	for i := range loadPools {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			id := fmt.Sprintf("pool-%04d", i)
			if _, err := post("/v2/pools/register", api.RegisterPool{PoolID: id, Endpoint: fake.URL, NodeID: id, Version: "bench", GPUs: gpus}); err != nil {
				errs <- err
				return
			}
			resp, err := c.StartWorker(context.Background(), fmt.Sprintf("m%d", i%10), id, nil, "load benchmark")
			if err != nil {
				errs <- err
				return
			}
			workers[i] = api.Worker{WorkerID: resp.Worker.WorkerID, LifecycleID: resp.LifecycleID, ModelRef: resp.Worker.ModelRef,
				GPUDevice: 0, VRAMBytes: 4 << 30, URI: "http://127.0.0.1:1", Status: "ready", PID: 1000 + i, StartedAt: time.Now()}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}

	// Warm up: the first heartbeat of each pool is its full inventory and
	// adopts its worker (a row write each); measure the steady state after.
	warm := make(chan error, loadPools)
	for i := range loadPools {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			_, err := post(fmt.Sprintf("/v2/pools/pool-%04d/heartbeat", i), api.Heartbeat{GPUs: gpus, Workers: []api.Worker{workers[i]}})
			warm <- err
		})
	}
	wg.Wait()
	close(warm)
	for err := range warm {
		if err != nil {
			b.Fatal(err)
		}
	}

	var allLat []time.Duration
	var cpuShare []float64
	var queryLat []time.Duration
	b.ResetTimer()
	for range b.N {
		cpu0 := procCPU(b, q.cmd.Process.Pid)
		wall0 := time.Now()
		lat, qlat := runLoad(b, post, qURL, hc, gpus, workers)
		cpu := procCPU(b, q.cmd.Process.Pid) - cpu0
		cpuShare = append(cpuShare, cpu.Seconds()/time.Since(wall0).Seconds())
		allLat = append(allLat, lat...)
		queryLat = append(queryLat, qlat...)
	}
	b.StopTimer()
	slices.Sort(allLat)
	slices.Sort(queryLat)
	pct := func(d []time.Duration, p float64) float64 {
		if len(d) == 0 {
			return 0
		}
		return float64(d[min(len(d)-1, int(float64(len(d))*p))].Microseconds()) / 1000
	}
	var share float64
	for _, s := range cpuShare {
		share += s
	}
	share /= float64(len(cpuShare))
	b.ReportMetric(pct(allLat, 0.50), "hb_p50_ms")
	b.ReportMetric(pct(allLat, 0.99), "hb_p99_ms")
	b.ReportMetric(pct(allLat, 1), "hb_max_ms")
	b.ReportMetric(float64(len(allLat))/(float64(b.N)*loadWindow.Seconds()), "hb/s")
	b.ReportMetric(share*100, "queen_cpu_%core")
	b.ReportMetric(pct(queryLat, 0.50), "query_p50_ms")
	b.ReportMetric(pct(queryLat, 0.99), "query_p99_ms")
	b.ReportMetric(0, "ns/op")
	hist := serverHistogram(b, hc, qURL)
	b.ReportMetric(histQuantile(hist, 0.50)*1000, "server_p50_le_ms")
	b.ReportMetric(histQuantile(hist, 0.99)*1000, "server_p99_le_ms")
	if err := q.stop(b, syscall.SIGTERM); err != nil {
		b.Errorf("queen exit: %v", err)
	}
}

// runLoad beats every pool once a second (each at its own phase) for
// loadWindow, and queries the registry 4 times a second meanwhile.
func runLoad(b *testing.B, post func(string, any) (time.Duration, error), qURL string, hc *http.Client, gpus []api.GPU, workers []api.Worker) ([]time.Duration, []time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), loadWindow)
	defer cancel()
	var mu sync.Mutex
	var lat, qlat []time.Duration
	var failures int
	var wg sync.WaitGroup
	for i := range loadPools {
		wg.Go(func() {
			path := fmt.Sprintf("/v2/pools/pool-%04d/heartbeat", i)
			hb := api.Heartbeat{GPUs: gpus, Workers: []api.Worker{workers[i]}}
			phase := time.NewTimer(time.Duration(rand.Int64N(int64(time.Second))))
			defer phase.Stop()
			select {
			case <-ctx.Done():
				return
			case <-phase.C:
			}
			tick := time.NewTicker(time.Second)
			defer tick.Stop()
			for {
				took, err := post(path, hb)
				mu.Lock()
				if err != nil {
					failures++
				} else {
					lat = append(lat, took)
				}
				mu.Unlock()
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
			}
		})
	}
	wg.Go(func() {
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for n := 0; ; n++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			path := "/v2/pools?status=healthy&model=m" + strconv.Itoa(n%10)
			start := time.Now()
			resp, err := hc.Get(qURL + path)
			if err != nil {
				continue
			}
			var list api.PoolList
			_ = json.NewDecoder(resp.Body).Decode(&list)
			resp.Body.Close()
			took := time.Since(start)
			if len(list.Pools) != loadPools/10 {
				b.Errorf("query %s: %d pools, want %d", path, len(list.Pools), loadPools/10)
			}
			mu.Lock()
			qlat = append(qlat, took)
			mu.Unlock()
		}
	})
	wg.Wait()
	if failures > 0 {
		b.Errorf("%d heartbeats failed", failures)
	}
	return lat, qlat
}

// procCPU is the user+system CPU time of pid so far.
func procCPU(b *testing.B, pid int) time.Duration {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// Fields after the command name (which may hold spaces) in parens.
	fields := strings.Fields(string(data[bytes.LastIndexByte(data, ')')+2:]))
	utime, _ := strconv.ParseInt(fields[11], 10, 64)
	stime, _ := strconv.ParseInt(fields[12], 10, 64)
	const clkTck = 100 // USER_HZ on Linux
	return time.Duration(utime+stime) * time.Second / clkTck
}

// serverHistogram is the queen's heartbeat histogram lines.
func serverHistogram(b *testing.B, hc *http.Client, qURL string) string {
	resp, err := hc.Get(qURL + "/metrics")
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return grep(string(data), "apiary_queen_heartbeat_duration_seconds")
}

// startQueenProcB runs `apiary queen` for a benchmark.
func startQueenProcB(b *testing.B) (*proc, string) {
	args := []string{"queen", "--addr", "127.0.0.1:0", "--data-dir", b.TempDir(), "--heartbeat-timeout", "30s"}
	p := startProc(b, "queen", nil, args...)
	rec, _ := p.logs.wait(b, 0, "queen serving", nil)
	return p, "http://" + rec.Attrs["addr"]
}

// histQuantile is the upper bound of the histogram bucket holding
// quantile p (Prometheus text of one histogram).
func histQuantile(text string, p float64) float64 {
	type bucket struct{ le, n float64 }
	var bs []bucket
	for _, l := range strings.Split(text, "\n") {
		rest, ok := strings.CutPrefix(l, `apiary_queen_heartbeat_duration_seconds_bucket{le="`)
		if !ok {
			continue
		}
		le, count, _ := strings.Cut(rest, `"} `)
		n, _ := strconv.ParseFloat(count, 64)
		v, err := strconv.ParseFloat(le, 64)
		if err != nil {
			v = 1e9 // +Inf
		}
		bs = append(bs, bucket{v, n})
	}
	if len(bs) == 0 {
		return 0
	}
	total := bs[len(bs)-1].n
	for _, b := range bs {
		if b.n >= p*total {
			return b.le
		}
	}
	return bs[len(bs)-1].le
}
