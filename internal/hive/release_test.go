package hive

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/gpu"
	"github.com/apiary-llm/apiary/internal/lifecycle"
	"github.com/apiary-llm/apiary/internal/procs"
)

// scriptedGPU is a CUDA inventory whose driver a test scripts: one
// device on which every live worker process of this test (a child of the
// test process with its tag in its environment) holds perWorker bytes,
// the driver itself reserved bytes, and foreign processes what the test
// says. With leak set, a worker's pid stays listed after it has ended,
// as a driver that did not free its memory would list it.
type scriptedGPU struct {
	tag       string
	total     uint64
	reserved  uint64
	perWorker uint64

	mu      sync.Mutex
	leak    bool          // guarded by mu
	seen    map[int]bool  // guarded by mu: worker pids listed so far
	foreign []gpu.Process // guarded by mu
}

const scriptedTagEnv = "APIARY_TEST_GPU_TAG"

func newScriptedGPU() *scriptedGPU {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return &scriptedGPU{tag: hex.EncodeToString(b), total: 16 << 30, reserved: 300 << 20, perWorker: 1 << 30, seen: map[int]bool{}}
}

// children are the live processes of this test tagged with g.tag.
func (g *scriptedGPU) children() []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := procs.ReadStat(pid)
		if err != nil || st.PPID != os.Getpid() || !st.Alive() {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err == nil && bytes.Contains(env, []byte(scriptedTagEnv+"="+g.tag)) {
			out = append(out, pid)
		}
	}
	return out
}

func (g *scriptedGPU) Processes(_ context.Context, id int) ([]gpu.Process, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []gpu.Process
	live := map[int]bool{}
	for _, pid := range g.children() {
		live[pid] = true
		g.seen[pid] = true
		out = append(out, gpu.Process{PID: pid, UsedBytes: g.perWorker})
	}
	if g.leak {
		for pid := range g.seen {
			if !live[pid] {
				out = append(out, gpu.Process{PID: pid, UsedBytes: g.perWorker})
			}
		}
	}
	return append(out, g.foreign...), nil
}

func (g *scriptedGPU) Devices(ctx context.Context) ([]gpu.Device, error) {
	ps, _ := g.Processes(ctx, 0)
	used := g.reserved
	for _, p := range ps {
		used += p.UsedBytes
	}
	return []gpu.Device{{ID: 0, Kind: gpu.KindCUDA, Name: "scripted", TotalBytes: g.total, FreeBytes: g.total - used}}, nil
}

func (*scriptedGPU) Close() error { return nil }

// set changes the script under its lock.
func (g *scriptedGPU) set(fn func(g *scriptedGPU)) {
	g.mu.Lock()
	defer g.mu.Unlock()
	fn(g)
}

func withScriptedGPU(g *scriptedGPU) hiveOpt {
	return func(c *Config) {
		c.Devices = g
		c.WorkerEnv = []string{fakeWorkerEnv + "=ok", scriptedTagEnv + "=" + g.tag}
		c.ReleaseTimeout = 300 * time.Millisecond
		c.ReleasePoll = 20 * time.Millisecond
	}
}

// runAndStop starts a worker on the scripted GPU, checks that its
// vram_bytes is the driver's count (the fake worker itself reports 1 MiB),
// stops it and waits until it is gone; it returns its id and pid.
func runAndStop(t *testing.T, th *testHive, g *scriptedGPU) (string, int) {
	t.Helper()
	id := th.start()
	th.rec.wait(t, id, lifecycle.Ready)
	w := th.worker(id)
	if w.VRAMBytes != g.perWorker {
		t.Errorf("vram_bytes %d, want the driver's %d", w.VRAMBytes, g.perWorker)
	}
	if code := th.do("POST", "/v2/workers/"+id+"/stop", api.StopWorkerRequest{}, nil); code != http.StatusAccepted {
		t.Fatalf("stop: %d", code)
	}
	th.gone(id)
	return id, w.PID
}

// leakEvent waits for the memory_leaked event of worker id.
func (r *recorder) leakEvent(t *testing.T, id string) api.WorkerEvent {
	t.Helper()
	deadline := time.After(waitLimit)
	for {
		ch := r.changed()
		r.mu.Lock()
		for _, ev := range r.events {
			if ev.Kind == api.EventMemoryLeaked && ev.WorkerID == id {
				r.mu.Unlock()
				return ev
			}
		}
		r.mu.Unlock()
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("no memory_leaked event for %s; events: %s", id, r.String())
		}
	}
}

// pollGPU polls GET /v2/gpus until device 0's unusable reason satisfies ok.
func (th *testHive) pollGPU(t *testing.T, what string, ok func(unusable string) bool) string {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for {
		var list api.GPUList
		if code := th.do("GET", "/v2/gpus", nil, &list); code == http.StatusOK && len(list.GPUs) == 1 && ok(list.GPUs[0].Unusable) {
			return list.GPUs[0].Unusable
		}
		if time.Now().After(deadline) {
			t.Fatalf("device 0 never became %s: %+v", what, list)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// The driver gives a stopped worker's memory back: the hive logs it and
// the device stays usable, with no memory_leaked event.
func TestReleasedGPUMemoryKeepsTheDeviceUsable(t *testing.T) {
	g := newScriptedGPU()
	th := startHive(t, withScriptedGPU(g))
	id, pid := runAndStop(t, th, g)
	releasedCleanly(t, th, id, pid)
}

// releasedCleanly checks that the release check of worker id (pid) ended
// with the memory back: logged, the device usable, no memory_leaked event.
func releasedCleanly(t *testing.T, th *testHive, id string, pid int) {
	t.Helper()
	checked := make(chan struct{})
	go func() { th.checks.Wait(); close(checked) }() // the check began before the worker was gone
	select {
	case <-checked:
	case <-time.After(waitLimit):
		t.Fatalf("the release check of %s (pid %d) did not end", id, pid)
	}
	if !strings.Contains(th.logs.String(), "the driver gave the worker's GPU memory back") {
		t.Errorf("no release logged for %s (pid %d)", id, pid)
	}
	th.pollGPU(t, "usable", func(u string) bool { return u == "" })
	th.rec.mu.Lock()
	defer th.rec.mu.Unlock()
	for _, ev := range th.rec.events {
		if ev.Kind == api.EventMemoryLeaked {
			t.Errorf("memory_leaked event after a clean release: %+v", ev)
		}
	}
}

// The driver keeps a stopped worker's memory: the device is marked
// unusable naming the worker and its pid, the queen is sent a
// memory_leaked event, a start is refused; once the driver lets go the
// device is usable again.
func TestLeakedGPUMemoryTakesTheDeviceOutUntilItIsBack(t *testing.T) {
	g := newScriptedGPU()
	g.set(func(g *scriptedGPU) { g.leak = true })
	th := startHive(t, withScriptedGPU(g))
	id, pid := runAndStop(t, th, g)
	ev := th.rec.leakEvent(t, id)
	want := "memory leaked by " + id + " (pid " + strconv.Itoa(pid) + "): the driver still lists it on device 0 with 1.0 GiB"
	if ev.Reason != want || ev.Worker.PID != pid {
		t.Errorf("event %+v, want reason %q", ev, want)
	}
	if got := th.pollGPU(t, "unusable", func(u string) bool { return u != "" }); got != want {
		t.Errorf("unusable %q, want %q", got, want)
	}
	var e api.Error
	if code := th.do("POST", "/v2/workers/start", api.StartWorkerRequest{ModelRef: "tiny"}, &e); code != http.StatusConflict || !strings.Contains(e.Error.Message, want) {
		t.Errorf("start on the leaking device: %d %+v", code, e)
	}
	g.set(func(g *scriptedGPU) { g.leak = false })
	th.pollGPU(t, "usable again", func(u string) bool { return u == "" })
}

// A process on the GPU that is no worker of this hive (another user's
// job, or one the driver reports by a pid of another namespace, as in a
// container) is none of an ended worker's leak: the device stays usable
// and no memory_leaked event goes out. (Before, any such process marked
// the device unusable when a worker ended.)
func TestForeignGPUProcessIsNoLeak(t *testing.T) {
	g := newScriptedGPU()
	g.set(func(g *scriptedGPU) { g.foreign = []gpu.Process{{PID: 4242424, UsedBytes: 2 << 30}} })
	th := startHive(t, withScriptedGPU(g))
	id, pid := runAndStop(t, th, g)
	releasedCleanly(t, th, id, pid)
}

// The verdict after worker-1 (pid 7) ended: a process of its group the
// driver still lists is its leak; a live worker's child (an engine under
// its front) and a foreign process are not.
func TestReleaseVerdictGroups(t *testing.T) {
	d := gpu.Device{ID: 0, TotalBytes: 16 << 30, FreeBytes: 11 << 30}
	others := []gpu.Process{{PID: 99, UsedBytes: 3 << 30}, {PID: 4242, UsedBytes: 2 << 30}}
	if got := releaseVerdict("worker-1", 7, map[int]bool{7: true}, d, others, 0, 256<<20); got != "" {
		t.Errorf("other processes on a shared GPU: %q, want no leak", got)
	}
	d.FreeBytes = 10 << 30
	left := append(others, gpu.Process{PID: 8, UsedBytes: 1 << 30})
	want := "memory leaked by worker-1 (pid 7): the driver still lists its process 8 on device 0 with 1.0 GiB"
	if got := releaseVerdict("worker-1", 7, map[int]bool{7: true, 8: true}, d, left, 0, 256<<20); got != want {
		t.Errorf("a child of the worker left on the GPU: %q, want %q", got, want)
	}
}

// Memory no process holds grows past the tolerance after a worker ended
// (the driver freed the process but not its memory).
func TestReleaseVerdictUnownedMemory(t *testing.T) {
	d := gpu.Device{ID: 0, TotalBytes: 16 << 30, FreeBytes: 14 << 30}
	got := releaseVerdict("worker-1", 7, nil, d, nil, 512<<20, 256<<20)
	if want := "memory leaked by worker-1 (pid 7): 2.0 GiB of device 0 is held by no process (512.0 MiB when it started)"; got != want {
		t.Errorf("verdict %q, want %q", got, want)
	}
	d.FreeBytes = 16<<30 - 700<<20
	if got := releaseVerdict("worker-1", 7, nil, d, nil, 512<<20, 256<<20); got != "" {
		t.Errorf("within the tolerance: %q", got)
	}
}
