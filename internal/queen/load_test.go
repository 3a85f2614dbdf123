//go:build !race

package queen

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/keeper"
	"github.com/apiary-llm/apiary/internal/testbin"
)

// Load benchmark: one queen process (SQLite), pools simulated hives, each
// beating once a second with two devices and one worker that has a
// lifecycle row, each over its own keep-alive connection (as hives do).
// Each iteration is one loadWindow of steady beating; reported:
// client-side heartbeat latency (p50/p99/max), the CPU of the queen
// process and of this one (the simulated hives) in cores, read from
// /proc, and registry query latency over HTTP during the load.
//
//	go test -run '^$' -bench 'HeartbeatLoad/pools=2000' -benchtime 1x ./internal/queen/
const loadWindow = 10 * time.Second

// loadSettle is the unmeasured beating between the warm-up and the
// first window.
const loadSettle = 5 * time.Second

// BenchmarkHeartbeatLoad runs the load at 2,000 and 10,000 pools.
//
// beat=full sends every heartbeat whole and the same each time (hives
// that send only full beats, to a queen without unchanged ones);
// beat=changing sends every heartbeat whole and different from the one
// before (hives whose state changes every second); beat=unchanged sends the full one first and then unchanged
// beats, as a hive does while nothing the queen acts on changes.
// via=stream beats on each pool's heartbeat stream, as hives do; via=post
// sends one request a beat, as hives of a queen without streams do.
func BenchmarkHeartbeatLoad(b *testing.B) {
	for _, pools := range []int{2000, 10000} {
		for _, kind := range []string{"full", "unchanged", "changing"} {
			for _, stream := range []bool{true, false} {
				via := map[bool]string{false: "post", true: "stream"}[stream]
				b.Run(fmt.Sprintf("pools=%d/beat=%s/via=%s", pools, kind, via), func(b *testing.B) { benchHeartbeats(b, pools, kind, stream) })
			}
		}
	}
}

// raiseFileLimit makes room for n more open files (the simulated hives'
// connections here, the queen's end of them in its process, which
// inherits the limit).
func raiseFileLimit(b *testing.B, n int) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		b.Fatal(err)
	}
	want := uint64(n) + 1024
	if lim.Cur >= want {
		return
	}
	lim.Cur = min(want, lim.Max)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil || lim.Cur < want {
		b.Fatalf("open files limit %d (hard %d), need %d: %v", lim.Cur, lim.Max, want, err)
	}
}

func benchHeartbeats(b *testing.B, loadPools int, kind string, stream bool) {
	unchanged := kind == "unchanged"
	raiseFileLimit(b, loadPools)
	// A fake hive accepts every start, so that each pool gets a row.
	var seq struct {
		sync.Mutex
		n int
	}
	fake := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seq.Lock()
		seq.n++
		id := fmt.Sprintf("w-%d", seq.n)
		seq.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(api.StartWorkerResponse{WorkerID: id, Status: "starting"})
	}))
	// Every pool has an endpoint of its own (the queen refuses a second
	// live pool at one): the fake listens on every address, and pool i
	// is at 127.0.x.y, which all reach it.
	all, err := net.Listen("tcp4", ":0")
	if err != nil {
		b.Fatal(err)
	}
	fake.Listener.Close()
	fake.Listener = all
	fake.Start()
	defer fake.Close()
	port := all.Addr().(*net.TCPAddr).Port

	q, qURL := startQueenProcB(b)
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: loadPools + 1, MaxIdleConns: loadPools + 1}, Timeout: 30 * time.Second}
	defer hc.CloseIdleConnections()
	// post sends a body marshalled once: the simulated hives must cost
	// this process as little as they can, since it shares the CPUs with
	// the queen.
	post := func(path string, data []byte) (time.Duration, error) {
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
	marshal := func(v any) []byte {
		data, err := json.Marshal(v)
		if err != nil {
			b.Fatal(err)
		}
		return data
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
			id := poolName(i)
			if _, err := post("/v2/pools/register", marshal(api.RegisterPool{PoolID: id, Endpoint: fmt.Sprintf("http://127.0.%d.%d:%d", 1+i/250, 1+i%250, port), NodeID: id, Version: "bench", GPUs: gpus})); err != nil {
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
	u, err := url.Parse(qURL)
	if err != nil {
		b.Fatal(err)
	}
	pools := make([]string, loadPools)
	for i := range pools {
		pools[i] = poolName(i)
	}
	full := func(i int) []byte { return marshal(api.Heartbeat{GPUs: gpus, Workers: []api.Worker{workers[i]}}) }
	var alt func(i int) []byte
	if kind == "changing" {
		// A device's free memory that moves by 1 MiB and back: every
		// beat is news to the queen, which keeps and stores it.
		moved := slices.Clone(gpus)
		moved[0].FreeBytes -= 1 << 20
		alt = func(i int) []byte { return marshal(api.Heartbeat{GPUs: moved, Workers: []api.Worker{workers[i]}}) }
	}
	load, err := newBeatLoad(u.Host, pools, full, alt, marshal(api.Heartbeat{Unchanged: true}), stream)
	if err != nil {
		b.Fatal(err)
	}
	defer load.close()
	// Warm up: the first heartbeat of each pool is its full inventory and
	// adopts its worker (a row write each); measure the steady state after.
	if err := load.warm(16, 5*time.Minute); err != nil {
		b.Fatal(err)
	}

	// Then beat for loadSettle unmeasured: the warm-up's aftermath (the
	// flush of every pool's first inventory, the collection of the
	// registrations' garbage) is a start's, not the steady state's. And
	// this process's own garbage is collected before the windows: the
	// latencies are timed here, and a collection of its own in a window
	// is the generator's delay, not the queen's.
	if res := load.run(loadSettle, time.Second, unchanged); res.fails > 0 {
		b.Fatalf("%d heartbeats failed while settling; the first: %v", res.fails, res.err)
	}
	runtime.GC()
	var allLat, lag, queryLat []time.Duration
	var windowP99 []float64 // each window's p99 (ms): a collection in one shows there
	var queenCPU, benchCPU, genCPU, wall time.Duration
	load1 := loadAverage(b)
	hist0 := serverHistogram(b, hc, qURL) // the windows' beats only, not the warm-up's
	b.ResetTimer()
	for range b.N {
		q0, p0 := procCPU(b, q.cmd.Process.Pid), procCPU(b, os.Getpid())
		res, qlat := runLoad(b, load, qURL, hc, unchanged, loadPools)
		queenCPU += procCPU(b, q.cmd.Process.Pid) - q0
		benchCPU += procCPU(b, os.Getpid()) - p0
		genCPU += res.cpu
		wall += res.wall
		allLat = append(allLat, res.lat...)
		if w := slices.Sorted(slices.Values(res.lat)); len(w) > 0 {
			windowP99 = append(windowP99, float64(w[min(len(w)-1, len(w)*99/100)].Microseconds())/1000)
		}
		lag = append(lag, res.lag...)
		queryLat = append(queryLat, qlat...)
	}
	b.StopTimer()
	slices.Sort(allLat)
	slices.Sort(lag)
	slices.Sort(queryLat)
	pct := func(d []time.Duration, p float64) float64 {
		if len(d) == 0 {
			return 0
		}
		return float64(d[min(len(d)-1, int(float64(len(d))*p))].Microseconds()) / 1000
	}
	b.ReportMetric(pct(allLat, 0.50), "hb_p50_ms")
	b.ReportMetric(pct(allLat, 0.99), "hb_p99_ms")
	b.ReportMetric(pct(allLat, 0.999), "hb_p999_ms")
	if len(windowP99) > 0 {
		b.ReportMetric(slices.Max(windowP99), "hb_p99_worst_window_ms")
		b.ReportMetric(slices.Min(windowP99), "hb_p99_best_window_ms")
	}
	b.ReportMetric(pct(allLat, 1), "hb_max_ms")
	b.ReportMetric(float64(len(allLat))/wall.Seconds(), "hb/s")
	b.ReportMetric(queenCPU.Seconds()/wall.Seconds(), "queen_cores")
	b.ReportMetric(genCPU.Seconds()/wall.Seconds(), "gen_cores")
	b.ReportMetric(benchCPU.Seconds()/wall.Seconds(), "bench_cores")
	b.ReportMetric(pct(lag, 0.99), "gen_lag_p99_ms")
	b.ReportMetric(pct(queryLat, 0.50), "query_p50_ms")
	b.ReportMetric(pct(queryLat, 0.99), "query_p99_ms")
	b.ReportMetric(load1, "loadavg1_before")
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(procMemMB(b, q.cmd.Process.Pid, "VmHWM"), "queen_peak_rss_mb")
	hist := serverHistogram(b, hc, qURL)
	b.ReportMetric(histQuantile(hist0, hist, 0.50)*1000, "server_p50_le_ms")
	b.ReportMetric(histQuantile(hist0, hist, 0.99)*1000, "server_p99_le_ms")
	if err := q.stop(b, syscall.SIGTERM); err != nil {
		b.Errorf("queen exit: %v", err)
	}
}

// runLoad beats every pool for loadWindow, and queries the registry 4
// times a second meanwhile (a keeper or a dashboard: the query's client
// runs in this process, beside the generator's threads).
func runLoad(b *testing.B, load *beatLoad, qURL string, hc *http.Client, unchanged bool, pools int) (beatResult, []time.Duration) {
	ctx, cancel := context.WithCancel(context.Background())
	var qlat []time.Duration
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		var body bytes.Buffer
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
				b.Errorf("query %s: %v", path, err)
				continue
			}
			// Counted, not decoded: decoding 1,000 pools four times a
			// second made this process collect garbage often enough to
			// delay its beats (the generator's lag p99 1.5 -> 4 ms).
			body.Reset()
			_, err = body.ReadFrom(resp.Body)
			resp.Body.Close()
			took := time.Since(start)
			if n := bytes.Count(body.Bytes(), []byte(`"endpoint":`)); err != nil || n != pools/10 {
				b.Errorf("query %s: %d pools, want %d (%v)", path, n, pools/10, err)
			}
			qlat = append(qlat, took)
		}
	})
	res := load.run(loadWindow, time.Second, unchanged)
	cancel()
	wg.Wait()
	if res.fails > 0 {
		b.Errorf("%d heartbeats failed; the first: %v", res.fails, res.err)
	}
	return res, qlat
}

// loadAverage is the machine's 1-minute load average.
func loadAverage(b *testing.B) float64 {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		b.Fatal(err)
	}
	v, err := strconv.ParseFloat(strings.Fields(string(data))[0], 64)
	if err != nil {
		b.Fatal(err)
	}
	return v
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

// procMemMB is a memory figure of process pid (a field of
// /proc/<pid>/status: VmHWM is the peak resident set) in MiB.
func procMemMB(b *testing.B, pid int, field string) float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for _, l := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(l, field+":"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			if err != nil {
				b.Fatalf("/proc/%d/status %s: %v", pid, field, err)
			}
			return kb / 1024
		}
	}
	b.Fatalf("/proc/%d/status has no %s", pid, field)
	return 0
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

// queenCPUsEnv pins the load benchmark's queen to these CPUs;
// queenArgsEnv adds flags to its command line (e.g. --models-refresh 1h).
const (
	queenCPUsEnv = "APIARY_BENCH_QUEEN_CPUS"
	queenArgsEnv = "APIARY_BENCH_QUEEN_ARGS"
)

// startQueenProcB runs `apiary queen` for a benchmark. The heartbeat
// timeout is long enough that no pool times out while thousands of others
// register (a lease costs the same to renew whatever its length).
//
// With APIARY_BENCH_QUEEN_CPUS set (taskset's list), the queen runs on those
// CPUs only: e.g. APIARY_BENCH_QUEEN_CPUS=1 with `taskset -c 0 go test …`
// gives the queen and the load generator one core each.
func startQueenProcB(b *testing.B) (*proc, string) {
	args := []string{"queen", "--addr", "127.0.0.1:0", "--data-dir", b.TempDir(), "--heartbeat-timeout", "5m"}
	args = append(append(args, strings.Fields(os.Getenv(queenArgsEnv))...), "--log-json")
	var p *proc
	if cpus := os.Getenv(queenCPUsEnv); cpus != "" {
		tp := testbin.StartCmd(b, "queen", nil, "taskset", append([]string{"-c", cpus, testbin.Path(b)}, args...)...)
		p = &proc{Proc: tp, logs: &logWatch{Lines: tp.Lines}, cmd: tp.Cmd, done: tp.Done(), name: "queen"}
	} else {
		p = startProc(b, "queen", nil, args[:len(args)-1]...)
	}
	rec, _ := p.logs.wait(b, 0, "queen serving", nil)
	return p, "http://" + rec.Attrs["addr"]
}

// histQuantile is the upper bound of the histogram bucket holding
// quantile p of the observations made between before and after
// (Prometheus texts of one histogram).
func histQuantile(before, after string, p float64) float64 {
	bs := histBuckets(after)
	for i, b := range histBuckets(before) {
		if i < len(bs) && bs[i].le == b.le {
			bs[i].n -= b.n
		}
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

type histBucket struct{ le, n float64 }

// histBuckets reads the cumulative buckets of the heartbeat histogram.
func histBuckets(text string) []histBucket {
	var bs []histBucket
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
		bs = append(bs, histBucket{v, n})
	}
	return bs
}
