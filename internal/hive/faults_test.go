package hive

import (
	"bufio"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/lifecycle"
)

// Each fault ends with the worker gone (reaped, group dead), the registry
// right (failed or stopped, not live, memory released) and no process left.

func TestSpawnReadyStop(t *testing.T) {
	th := startHive(t)
	id := th.start()
	th.rec.wait(t, id, lifecycle.Ready)
	w := th.worker(id)
	if w.Status != "ready" || w.VRAMBytes != 1<<20 || w.URI == "" || w.PID == 0 || w.ReadyAt == nil {
		t.Fatalf("ready worker = %+v", w)
	}
	var gpus api.GPUList
	th.do("GET", "/v2/gpus", nil, &gpus)
	if len(gpus.GPUs) != 1 || gpus.GPUs[0].AllocatedBytes != 1<<20 || len(gpus.GPUs[0].Workers) != 1 {
		t.Errorf("gpus with one ready worker = %+v", gpus)
	}
	if code := th.do("POST", "/v2/workers/"+id+"/stop", api.StopWorkerRequest{}, nil); code != http.StatusAccepted {
		t.Fatalf("stop: %d", code)
	}
	th.rec.wait(t, id, lifecycle.Stopped)
	end := th.gone(id)
	if end.Status != "stopped" || !strings.Contains(end.Reason, "graceful") || end.ExitCode == nil || *end.ExitCode != 0 {
		t.Errorf("stopped worker = %+v", end)
	}
	want := []string{"starting", "ready", "draining", "stopped"}
	if got := th.rec.states(id); !slicesEqual(got, want) {
		t.Errorf("states = %v, want %v", got, want)
	}
	var from []string
	for _, h := range end.History {
		from = append(from, h.From)
		if h.DurationMS < 0 || h.Reason == "" || h.At.IsZero() {
			t.Errorf("history entry %+v", h)
		}
	}
	if !slicesEqual(from, []string{"starting", "ready", "draining"}) {
		t.Errorf("history from = %v", from)
	}
	th.do("GET", "/v2/gpus", nil, &gpus)
	if gpus.GPUs[0].AllocatedBytes != 0 || gpus.GPUs[0].ReservedBytes != 0 {
		t.Errorf("memory not released: %+v", gpus.GPUs[0])
	}
	portFree(t, w.URI)
}

// The hive binds the worker's port and hands the socket over (--listen-fd):
// from admission on, no other process can take the port, even while the
// worker is slow to start; once the worker is gone the port is free, so
// the hive kept no copy.
func TestSpawnPortHeldUntilWorkerTakesIt(t *testing.T) {
	th := startHive(t, withFake("start-delay=300ms"))
	id := th.start()
	w := th.worker(id)
	if w.Status != "starting" {
		t.Fatalf("worker %+v, want starting", w)
	}
	if ln, err := net.Listen("tcp", strings.TrimPrefix(w.URI, "http://")); err == nil {
		ln.Close()
		t.Fatalf("port of starting worker %s could be taken by another process", w.URI)
	}
	th.rec.wait(t, id, lifecycle.Ready)
	resp, err := http.Get(w.URI + "/health")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("worker on its inherited socket: %v %v", resp, err)
	}
	resp.Body.Close()
	if code := th.do("POST", "/v2/workers/"+id+"/stop", api.StopWorkerRequest{}, nil); code != http.StatusAccepted {
		t.Fatalf("stop: %d", code)
	}
	th.rec.wait(t, id, lifecycle.Stopped)
	th.gone(id)
	portFree(t, w.URI)
}

func TestFaultNeverCallsBack(t *testing.T) {
	th := startHive(t, withFake("no-callback"), func(c *Config) { c.CallbackTimeout = 300 * time.Millisecond })
	id := th.start()
	ev := th.rec.wait(t, id, lifecycle.Failed)
	if !strings.Contains(ev.Reason, "no ready callback within 300ms") {
		t.Errorf("reason = %q", ev.Reason)
	}
	end := th.gone(id)
	if end.ExitCode == nil || *end.ExitCode != -1 {
		t.Errorf("exit code = %v, want -1 (SIGKILL)", end.ExitCode)
	}
	var gpus api.GPUList
	th.do("GET", "/v2/gpus", nil, &gpus)
	if gpus.GPUs[0].ReservedBytes != 0 {
		t.Errorf("reservation of a failed start not released: %+v", gpus.GPUs[0])
	}
}

func TestFaultIgnoresSIGTERM(t *testing.T) {
	th := startHive(t, withFake("ignore-term"), func(c *Config) { c.ShutdownAck = 200 * time.Millisecond })
	id := th.start()
	th.rec.wait(t, id, lifecycle.Ready)
	if code := th.do("POST", "/v2/workers/"+id+"/stop", `{"grace_seconds":1}`, nil); code != http.StatusAccepted {
		t.Fatalf("stop: %d", code)
	}
	ev := th.rec.wait(t, id, lifecycle.Stopped)
	if !strings.Contains(ev.Reason, "forced") || !strings.Contains(ev.Reason, "killed by signal 9") {
		t.Errorf("reason = %q, want a forced stop by SIGKILL", ev.Reason)
	}
	th.gone(id)
	if !strings.Contains(th.logs.String(), "ignored SIGTERM") {
		t.Errorf("log does not say SIGTERM was ignored")
	}
}

func TestFaultGrandchildHoldsPort(t *testing.T) {
	th := startHive(t, withFake("grandchild"))
	id := th.start()
	ev := th.rec.wait(t, id, lifecycle.Failed)
	if !strings.Contains(ev.Reason, "exit code 5") {
		t.Errorf("reason = %q", ev.Reason)
	}
	end := th.gone(id)
	portFree(t, end.URI)
}

func TestFaultCrashesMidStream(t *testing.T) {
	th := startHive(t, withFake("crash-mid-stream"))
	id := th.start()
	ready := th.rec.wait(t, id, lifecycle.Ready)
	resp, err := http.Post(ready.Worker.URI+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"hi","stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(resp.Body)
	var chunks int
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "data: {") {
			chunks++
		}
	}
	resp.Body.Close()
	if chunks == 0 || chunks >= 5 {
		t.Errorf("got %d chunks before the crash", chunks)
	}
	ev := th.rec.wait(t, id, lifecycle.Failed)
	if !strings.Contains(ev.Reason, "exited unexpectedly: exit code 7") {
		t.Errorf("reason = %q", ev.Reason)
	}
	th.gone(id)
	if !strings.Contains(th.logs.String(), "crashing mid-stream") {
		t.Errorf("hive log lacks the worker's last output")
	}
}

func TestFaultHangsOnHealth(t *testing.T) {
	th := startHive(t, withFake("hang-health"))
	id := th.start()
	th.rec.wait(t, id, lifecycle.Ready)
	th.rec.wait(t, id, lifecycle.Degraded)
	ev := th.rec.wait(t, id, lifecycle.Failed)
	if !strings.Contains(ev.Reason, "3 health checks in a row failed") {
		t.Errorf("reason = %q", ev.Reason)
	}
	end := th.gone(id)
	if end.ExitCode == nil || *end.ExitCode != -1 {
		t.Errorf("exit code = %v, want killed", end.ExitCode)
	}
}

func TestFaultExitsWithCode(t *testing.T) {
	th := startHive(t, withFake("exit=3"))
	id := th.start()
	ev := th.rec.wait(t, id, lifecycle.Failed)
	if !strings.Contains(ev.Reason, "exit code 3") {
		t.Errorf("reason = %q", ev.Reason)
	}
	end := th.gone(id)
	if end.ExitCode == nil || *end.ExitCode != 3 {
		t.Errorf("exit code = %v", end.ExitCode)
	}
	resp, err := http.Get(th.url + "/v2/workers/" + id + "/logs")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b := new(strings.Builder)
	_, _ = bufio.NewReader(resp.Body).WriteTo(b)
	if !strings.Contains(b.String(), "exiting with 3 as told") {
		t.Errorf("logs = %q", b.String())
	}
}

func TestFaultCallbackWithBadToken(t *testing.T) {
	th := startHive(t, withFake("bad-token"))
	id := th.start()
	ev := th.rec.wait(t, id, lifecycle.Failed)
	// The hive refuses the callback (401); the worker exits non-zero.
	if !strings.Contains(ev.Reason, "exit code 4") {
		t.Errorf("reason = %q", ev.Reason)
	}
	if got := th.rec.states(id); !slicesEqual(got, []string{"starting", "failed"}) {
		t.Errorf("states = %v", got)
	}
	th.gone(id)
	if !strings.Contains(th.logs.String(), "wrong token refused") {
		t.Errorf("hive did not log the refused callback")
	}
}

func TestFaultCallbackWithImplausibleVRAM(t *testing.T) {
	for _, vram := range []string{"0", "999999999999999999"} {
		t.Run(vram, func(t *testing.T) {
			th := startHive(t, withFake("vram="+vram))
			id := th.start()
			ev := th.rec.wait(t, id, lifecycle.Failed)
			if !strings.Contains(ev.Reason, "implausible ready callback") {
				t.Errorf("reason = %q", ev.Reason)
			}
			th.gone(id)
		})
	}
}

func slicesEqual(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
