package queen

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/lifecycle"
)

// Benchmarks of the dashboard with 50 pools of two devices and 200
// worker slots (four a pool) whose rows change state every few seconds
// (uiFleet), in this process with the fake hive:
//
//	go test -run '^$' -bench 'Dashboard' -benchtime 1x ./internal/queen/
const (
	uiPools         = 50
	uiSlotsPerPool  = 4
	uiChangesPerSec = 50 // each of the 200 slots changes every 4 s
)

// uiFleet is a queen whose worker slots cycle STARTING → RUNNING →
// STOPPED → (a new row) STARTING …, one change at a time, through the
// queen's own event and start paths.
type uiFleet struct {
	x     *tq
	slots []uiSlot
	next  int
}

type uiSlot struct {
	pool, id, worker string
	status           lifecycle.Status
}

func newUIFleet(b *testing.B) *uiFleet {
	b.Helper()
	x := startQueen(b, sqliteDir(b), "", func(c *Config) {
		c.HeartbeatTimeout = time.Hour // no pool times out: the load sends events, not beats
	})
	f := &uiFleet{x: x}
	for p := range uiPools {
		id := poolName(p)
		x.ok("POST", "/v2/pools/register", api.RegisterPool{PoolID: id, Endpoint: fakeEndpoint(id), NodeID: id, Version: "t",
			GPUs: []api.GPU{{ID: 0, Kind: "cuda", Name: "sim", TotalBytes: 24 << 30, FreeBytes: 12 << 30},
				{ID: 1, Kind: "cuda", Name: "sim", TotalBytes: 24 << 30, FreeBytes: 20 << 30}}}, http.StatusOK, nil)
		for range uiSlotsPerPool {
			f.slots = append(f.slots, uiSlot{pool: id, status: rowStopped})
		}
	}
	for range f.slots { // every slot starts, then runs
		f.step(b)
		f.step(b)
	}
	return f
}

// step makes the next slot's row change state.
func (f *uiFleet) step(b *testing.B) {
	s := &f.slots[f.next%len(f.slots)]
	f.next++
	ctx := context.Background()
	q := f.x.q
	switch s.status {
	case rowStopped:
		row, err := q.StartWorker(ctx, StartRequest{Model: fmt.Sprintf("m%d", f.next%10), PoolID: s.pool, Reason: "bench", Actor: "admin", Owner: OwnerOperator})
		if err != nil {
			b.Fatal(err)
		}
		s.id, s.worker, s.status = row.ID, row.WorkerID, rowStarting
	case rowStarting:
		w := worker(s.worker, s.id, "ready")
		if _, err := q.event(ctx, api.WorkerEvent{PoolID: s.pool, WorkerID: s.worker, LifecycleID: s.id, From: "starting", To: "ready", Worker: w}); err != nil {
			b.Fatal(err)
		}
		s.status = rowRunning
	default:
		w := worker(s.worker, s.id, "stopped")
		if _, err := q.event(ctx, api.WorkerEvent{PoolID: s.pool, WorkerID: s.worker, LifecycleID: s.id, From: "ready", To: "stopped", Worker: w}); err != nil {
			b.Fatal(err)
		}
		s.status = rowStopped
	}
}

// run changes states at uiChangesPerSec for d.
func (f *uiFleet) run(b *testing.B, d time.Duration) {
	t := time.NewTicker(time.Second / uiChangesPerSec)
	defer t.Stop()
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		<-t.C
		f.step(b)
	}
}

// cpu is this process's user plus system CPU time.
func cpu(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkDashboardStreamCPU: the CPU the dashboard's live stream costs
// the queen. The fleet changes a row's state 50 times a second
// throughout; the process's CPU time is measured over windows without a
// page and with one page following /api/admin/ui/events (read and
// discarded here: its reading counts too, so the difference is an upper
// bound), alternating, four of each. Reported: the CPU of each as a share
// of one core, their difference, and the stream's bytes a second.
func BenchmarkDashboardStreamCPU(b *testing.B) {
	f := newUIFleet(b)
	const window = 5 * time.Second
	for b.Loop() {
		var off, on time.Duration
		var streamed int64
		for range 4 {
			c0 := cpu(b)
			f.run(b, window)
			off += cpu(b) - c0

			ctx, cancel := context.WithCancel(context.Background())
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, f.x.url+"/api/admin/ui/events", nil)
			resp, err := f.x.hc.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			n := make(chan int64, 1)
			go func() { c, _ := io.Copy(io.Discard, resp.Body); n <- c }()
			c0 = cpu(b)
			f.run(b, window)
			on += cpu(b) - c0
			cancel()
			resp.Body.Close()
			streamed += <-n
		}
		total := 4 * window
		offPct := 100 * off.Seconds() / total.Seconds()
		onPct := 100 * on.Seconds() / total.Seconds()
		b.ReportMetric(offPct, "%core-without")
		b.ReportMetric(onPct, "%core-with-stream")
		b.ReportMetric(onPct-offPct, "%core-stream")
		b.ReportMetric(float64(streamed)/total.Seconds(), "stream-B/s")
	}
}

// BenchmarkDashboardPush: one push of the hub as the fleet makes it: the
// whole state built from memory (50 pools, 200 rows live or recently
// ended, their models), marshalled item by item and diffed against the
// last, one row changed since. At most five pushes a second are made
// (dashboard.HubConfig.MinInterval), so five of these a second is the
// most the stream costs the queen, whatever the number of pages.
func BenchmarkDashboardPush(b *testing.B) {
	f := newUIFleet(b)
	for b.Loop() {
		b.StopTimer()
		f.step(b)
		b.StartTimer()
		snap := f.x.q.uiSnapshot()
		f.x.q.ui.hub.Push(snap)
	}
}

// BenchmarkDashboardPageLoad: what a browser fetches to show the
// dashboard, over one keep-alive connection with the fleet's 250 items:
// the page, its script, its style sheet and the first snapshot, one
// after the other. ns/op is one whole load.
func BenchmarkDashboardPageLoad(b *testing.B) {
	f := newUIFleet(b)
	paths := []string{"/ui/", "/ui/app.js", "/ui/app.css", "/api/admin/ui/snapshot"}
	var size int64
	for b.Loop() {
		size = 0
		for _, p := range paths {
			resp, err := f.x.hc.Get(f.x.url + p)
			if err != nil {
				b.Fatal(err)
			}
			n, _ := io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				b.Fatalf("GET %s: %d", p, resp.StatusCode)
			}
			size += n
		}
	}
	b.ReportMetric(float64(size), "B/load")
}
