package hive

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/gpu"
	"github.com/apiary-llm/apiary/internal/lifecycle"
)

func TestDecideHealth(t *testing.T) {
	miss := probeResult{err: errors.New("timeout")}
	ok := func(status string, inFlight int) probeResult {
		return probeResult{health: api.WorkerHealth{Status: status, InFlight: inFlight}}
	}
	tests := []struct {
		name   string
		state  lifecycle.State
		misses int
		r      probeResult
		want   healthDecision
	}{
		{"first miss degrades ready", lifecycle.Ready, 0, miss, healthDecision{to: lifecycle.Degraded, misses: 1, reason: "health check failed: timeout"}},
		{"first miss degrades busy", lifecycle.Busy, 0, miss, healthDecision{to: lifecycle.Degraded, misses: 1, reason: "health check failed: timeout"}},
		{"second miss stays degraded", lifecycle.Degraded, 1, miss, healthDecision{misses: 2}},
		{"third miss fails", lifecycle.Degraded, 2, miss, healthDecision{to: lifecycle.Failed, kill: true, misses: 3, reason: "3 health checks in a row failed: timeout"}},
		{"answer recovers degraded", lifecycle.Degraded, 2, ok("ready", 0), healthDecision{to: lifecycle.Ready, reason: "health check passed"}},
		{"in flight makes busy", lifecycle.Ready, 0, ok("ready", 2), healthDecision{to: lifecycle.Busy, reason: "worker reports 2 request(s) in flight"}},
		{"busy status makes busy", lifecycle.Ready, 0, ok("busy", 0), healthDecision{to: lifecycle.Busy, reason: "worker reports 1 request(s) in flight"}},
		{"idle again makes ready", lifecycle.Busy, 0, ok("ready", 0), healthDecision{to: lifecycle.Ready, reason: "worker reports no request in flight"}},
		{"ready stays ready", lifecycle.Ready, 0, ok("ready", 0), healthDecision{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := decideHealth(tt.state, tt.misses, 3, tt.r)
			if diff := cmp.Diff(tt.want, got, cmp.AllowUnexported(healthDecision{})); diff != "" {
				t.Errorf("(-want +got)\n%s", diff)
			}
			if got.to != "" && !lifecycle.CanTransition(tt.state, got.to) {
				t.Errorf("decision %s → %s breaks the table", tt.state, got.to)
			}
		})
	}
}

func TestIdleFor(t *testing.T) {
	t0 := time.Unix(1000, 0)
	tests := []struct {
		name     string
		state    lifecycle.State
		inFlight int
		now      time.Time
		timeout  time.Duration
		idle     bool
		wait     time.Duration
	}{
		{"disabled", lifecycle.Ready, 0, t0.Add(time.Hour), -1, false, -1},
		{"not yet", lifecycle.Ready, 0, t0.Add(time.Minute), 5 * time.Minute, false, 4 * time.Minute},
		{"exactly", lifecycle.Ready, 0, t0.Add(5 * time.Minute), 5 * time.Minute, true, 0},
		{"busy is never idle", lifecycle.Busy, 1, t0.Add(time.Hour), 5 * time.Minute, false, 5 * time.Minute},
		{"in flight is never idle", lifecycle.Ready, 1, t0.Add(time.Hour), 5 * time.Minute, false, 5 * time.Minute},
		{"degraded is not stopped as idle", lifecycle.Degraded, 0, t0.Add(time.Hour), 5 * time.Minute, false, 5 * time.Minute},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			idle, wait := idleFor(tt.state, tt.inFlight, t0, tt.now, tt.timeout)
			if idle != tt.idle || wait != tt.wait {
				t.Errorf("idleFor = %v, %s; want %v, %s", idle, wait, tt.idle, tt.wait)
			}
		})
	}
	later := t0.Add(time.Minute)
	if got := lastActivity(t0, &later); !got.Equal(later) {
		t.Errorf("lastActivity = %v", got)
	}
	if got := lastActivity(t0, nil); !got.Equal(t0) {
		t.Errorf("lastActivity(nil) = %v", got)
	}
}

func TestCheckFit(t *testing.T) {
	d := gpu.Device{ID: 1, Kind: gpu.KindCUDA, TotalBytes: 1000, FreeBytes: 900}
	tests := []struct {
		name  string
		h     held
		need  uint64
		fits  bool
		avail uint64 // when it does not fit
	}{
		{"fits in free", held{}, 900, true, 0},
		{"over free", held{}, 901, false, 900},
		{"workers' holdings count", held{allocated: 300, reserved: 200}, 600, false, 500},
		{"free smaller than total less held", held{allocated: 50}, 901, false, 900},
		{"held beyond total", held{allocated: 2000}, 1, false, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := checkFit(d, tt.h, tt.need)
			if tt.fits {
				if err != nil {
					t.Errorf("checkFit = %v, want fit", err)
				}
				return
			}
			var me *InsufficientMemoryError
			if !errors.As(err, &me) {
				t.Fatalf("checkFit = %v, want InsufficientMemoryError", err)
			}
			if me.Available != tt.avail || me.Need != tt.need || me.Held != tt.h.total() {
				t.Errorf("error = %+v", me)
			}
		})
	}
}

func TestPlausibleVRAM(t *testing.T) {
	d := gpu.Device{ID: 0, TotalBytes: 1 << 30}
	for _, c := range []struct {
		vram uint64
		ok   bool
	}{{0, false}, {1, true}, {1 << 30, true}, {1<<30 + 1, false}} {
		if err := plausibleVRAM(c.vram, []deviceInfo{d}); (err == nil) != c.ok || (err != nil && !errors.Is(err, ErrImplausibleReady)) {
			t.Errorf("plausibleVRAM(%d) = %v", c.vram, err)
		}
	}
}

func TestChooseDevicePicksMostAvailable(t *testing.T) {
	devs := []gpu.Device{
		{ID: 0, TotalBytes: 100, FreeBytes: 100},
		{ID: 1, TotalBytes: 100, FreeBytes: 100},
	}
	holding := map[int]held{0: {allocated: 60}}
	d, err := chooseDevice(devs, nil, 0, func(id int) held { return holding[id] })
	if err != nil || d.ID != 1 {
		t.Errorf("chooseDevice = %d, %v; want 1", d.ID, err)
	}
	three := 3
	if _, err := chooseDevice(devs, &three, 0, func(int) held { return held{} }); !errors.Is(err, ErrDeviceNotFound) {
		t.Errorf("chooseDevice(3) = %v", err)
	}
}

func TestWorkerLogTail(t *testing.T) {
	l := &workerLog{size: 16}
	_, _ = l.Write([]byte("one\ntwo\nthree\nfour\n"))
	if got := string(l.Bytes()); got != "\ntwo\nthree\nfour\n" {
		t.Errorf("ring = %q", got)
	}
	if got := l.Tail(2); got != "three\nfour" {
		t.Errorf("Tail(2) = %q", got)
	}
}

// Regression: a pooled connection that the hive's client dialled but never
// used kept a worker's http.Server.Shutdown waiting 5s, stalling 1 cascade
// in ~30. Every probe's connection must be closed when the probe returns.
func TestWorkerClientLeavesNoConnectionToStallWorkerShutdown(t *testing.T) {
	var mu sync.Mutex
	open := map[net.Conn]bool{}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(`{"status":"ready"}`))
	}))
	srv.Config.ConnState = func(c net.Conn, s http.ConnState) {
		mu.Lock()
		defer mu.Unlock()
		open[c] = s != http.StateClosed && s != http.StateHijacked
	}
	srv.Start()
	defer srv.Close()
	c := newHTTPWorkerClient()
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			if _, err := c.Health(t.Context(), srv.URL); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	srv.Config.SetKeepAlivesEnabled(false)
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	if err := srv.Config.Shutdown(ctx); err != nil {
		t.Errorf("server shutdown after probes: %v (a probe left a connection open)", err)
	}
}

// A GPU node offers its CPU too (the next id): a model goes to a GPU where
// it fits, however much more memory the CPU has, and to the CPU only when
// it fits no GPU.
func TestChooseDevicePrefersAGPUWhereItFits(t *testing.T) {
	devs := []gpu.Device{
		{ID: 0, Kind: gpu.KindCUDA, TotalBytes: 24 << 30, FreeBytes: 20 << 30},
		{ID: 1, Kind: gpu.KindCUDA, TotalBytes: 24 << 30, FreeBytes: 22 << 30},
		{ID: 2, Kind: gpu.KindCPU, TotalBytes: 256 << 30, FreeBytes: 200 << 30},
	}
	none := func(int) held { return held{} }
	for _, tc := range []struct {
		need uint64
		want int
	}{{8 << 30, 1}, {21 << 30, 1}, {23 << 30, 2}, {300 << 30, 2}} {
		if d, err := chooseDevice(devs, nil, tc.need, none); err != nil || d.ID != tc.want {
			t.Errorf("need %s: device %d, %v; want %d", api.FormatBytes(tc.need), d.ID, err, tc.want)
		}
	}
}
