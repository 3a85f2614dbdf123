package hive

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/apiary-llm/apiary/internal/testbin"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/gpu"
	"github.com/apiary-llm/apiary/internal/lifecycle"
	"github.com/apiary-llm/apiary/internal/procs"
	"github.com/apiary-llm/apiary/internal/testmodel"
)

func TestMain(m *testing.M) {
	if spec, ok := os.LookupEnv(fakeWorkerEnv); ok {
		os.Exit(fakeWorkerMain(spec, os.Args[1:]))
	}
	if os.Getenv(hiveProcessEnv) != "" {
		os.Exit(hiveProcessMain())
	}
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		testbin.Cleanup()
		os.Exit(code)
	}))
}

// waitLimit bounds every wait of these tests: a wait that reaches it is a
// failure, not a timing guess.
const waitLimit = 20 * time.Second

// recorder keeps every worker event a hive emits and lets a test wait for
// one.
type recorder struct {
	mu     sync.Mutex
	events []api.WorkerEvent // guarded by mu
	change chan struct{}     // guarded by mu; closed and replaced on each event
}

func newRecorder() *recorder { return &recorder{change: make(chan struct{})} }

func (r *recorder) add(ev api.WorkerEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, ev)
	close(r.change)
	r.change = make(chan struct{})
}

// wait returns the first event of worker id into state to, failing the
// test if none comes within waitLimit.
func (r *recorder) wait(t testing.TB, id string, to lifecycle.State) api.WorkerEvent {
	t.Helper()
	deadline := time.NewTimer(waitLimit)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		for _, ev := range r.events {
			if ev.WorkerID == id && ev.To == string(to) {
				r.mu.Unlock()
				return ev
			}
		}
		ch := r.change
		r.mu.Unlock()
		select {
		case <-ch:
		case <-deadline.C:
			t.Fatalf("worker %s never became %s; events: %s", id, to, r.String())
		}
	}
}

// changed is closed at the next event.
func (r *recorder) changed() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.change
}

// states lists the states worker id went through.
func (r *recorder) states(id string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var s []string
	for _, ev := range r.events {
		if ev.WorkerID == id {
			s = append(s, ev.To)
		}
	}
	return s
}

// of lists worker id's events.
func (r *recorder) of(id string) []api.WorkerEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []api.WorkerEvent
	for _, ev := range r.events {
		if ev.WorkerID == id {
			out = append(out, ev)
		}
	}
	return out
}

func (r *recorder) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b bytes.Buffer
	for _, ev := range r.events {
		fmt.Fprintf(&b, "\n  %s %s→%s (%s)", ev.WorkerID, ev.From, ev.To, ev.Reason)
	}
	return b.String()
}

// testHive is a hive under test with fake workers (the test binary).
type testHive struct {
	*Hive
	t      testing.TB
	rec    *recorder
	url    string
	runErr chan error
	logs   *testbin.SyncBuffer
}

type hiveOpt func(*Config)

func withFake(behaviour string) hiveOpt {
	return func(c *Config) { c.WorkerEnv = append(c.WorkerEnv, fakeWorkerEnv+"="+behaviour) }
}

// startHive runs a hive on a free port with short timings; opts adjust it.
func startHive(t testing.TB, opts ...hiveOpt) *testHive {
	t.Helper()
	dir := t.TempDir()
	cfg := Config{
		Addr:              "127.0.0.1:0",
		DataDir:           dir,
		ModelsDir:         filepath.Join(dir, "models"),
		WorkerPath:        os.Args[0],
		PortMin:           testPortBase,
		PortMax:           testPortBase + 999,
		CallbackTimeout:   10 * time.Second,
		HealthInterval:    50 * time.Millisecond,
		StopGrace:         5 * time.Second,
		ShutdownAck:       time.Second,
		IdleTimeout:       -1,
		HeartbeatInterval: 100 * time.Millisecond,
		QueenURL:          "",
		PoolID:            "pool-test",
	}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.WorkerEnv == nil && cfg.WorkerPath == os.Args[0] {
		cfg.WorkerEnv = []string{fakeWorkerEnv + "=ok"}
	}
	writeModel(t, cfg.ModelsDir, "tiny")
	var logs testbin.SyncBuffer
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	h, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	th := &testHive{Hive: h, t: t, rec: newRecorder(), runErr: make(chan error, 1), logs: &logs}
	h.onEvent = th.rec.add
	go func() { th.runErr <- h.Run(t.Context()) }()
	select {
	case <-h.Ready():
	case err := <-th.runErr:
		t.Fatalf("hive did not start: %v", err)
	}
	th.url = "http://" + h.Addr().String()
	t.Cleanup(func() {
		h.Shutdown()
		select {
		case err := <-th.runErr:
			if err != nil {
				t.Errorf("hive Run: %v", err)
			}
		case <-time.After(waitLimit):
			t.Errorf("hive did not shut down")
		}
		if t.Failed() {
			t.Logf("hive log:\n%s", logs.String())
		}
	})
	return th
}

func writeModel(t testing.TB, dir, ref string) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, ref+".gguf")
	if err := testmodel.WriteFile(p, testmodel.Options{}); err != nil {
		t.Fatal(err)
	}
	return p
}

// do sends a JSON request and decodes a JSON answer into out (if non-nil).
func (th *testHive) do(method, path string, body any, out any) int {
	th.t.Helper()
	return th.doAuthed(method, path, body, out, "")
}

// doAuthed is do with the cluster token as bearer (none when "").
func (th *testHive) doAuthed(method, path string, body any, out any, token string) int {
	th.t.Helper()
	var rd io.Reader
	if body != nil {
		if s, ok := body.(string); ok {
			rd = bytes.NewBufferString(s)
		} else {
			b, _ := json.Marshal(body)
			rd = bytes.NewReader(b)
		}
	}
	req, err := http.NewRequest(method, th.url+path, rd)
	if err != nil {
		th.t.Fatal(err)
	}
	if method != http.MethodGet {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		th.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			th.t.Fatalf("%s %s: %d %s: %v", method, path, resp.StatusCode, b, err)
		}
	}
	return resp.StatusCode
}

// start asks for a worker of model tiny and returns its id.
func (th *testHive) start() string {
	th.t.Helper()
	var res api.StartWorkerResponse
	if code := th.do("POST", "/v2/workers/start", api.StartWorkerRequest{ModelRef: "tiny"}, &res); code != http.StatusAccepted {
		th.t.Fatalf("start: %d", code)
	}
	if res.Status != "starting" || res.WorkerID == "" {
		th.t.Fatalf("start answer %+v", res)
	}
	return res.WorkerID
}

func (th *testHive) worker(id string) api.Worker {
	th.t.Helper()
	var w api.Worker
	if code := th.do("GET", "/v2/workers/"+id, nil, &w); code != http.StatusOK {
		th.t.Fatalf("GET worker %s: %d", id, code)
	}
	return w
}

// drainBusy stops busy worker id with a drain while a request is in
// flight (done says how it ended): the request must end whole and the
// worker stop gracefully, gone. It returns the draining event.
func (th *testHive) drainBusy(id string, done <-chan error) api.WorkerEvent {
	t := th.t
	t.Helper()
	th.rec.wait(t, id, lifecycle.Busy)
	if code := th.do("POST", "/v2/workers/"+id+"/stop", api.StopWorkerRequest{Drain: true}, nil); code != http.StatusAccepted {
		t.Fatalf("stop: %d", code)
	}
	draining := th.rec.wait(t, id, lifecycle.Draining)
	if err := <-done; err != nil {
		t.Errorf("in-flight request during drain: %v", err)
	}
	ev := th.rec.wait(t, id, lifecycle.Stopped)
	if !strings.Contains(ev.Reason, "graceful") {
		t.Errorf("reason = %q", ev.Reason)
	}
	th.gone(id)
	return draining
}

// gone waits until worker id's owner has finished (process reaped, group
// dead, memory released, entry moved out of the registry) and checks that.
func (th *testHive) gone(id string) api.Worker {
	th.t.Helper()
	w, ok := th.reg.get(id, true)
	if !ok {
		th.t.Fatalf("worker %s unknown", id)
	}
	select {
	case <-w.done:
	case <-time.After(waitLimit):
		th.t.Fatalf("worker %s never ended; events: %s", id, th.rec.String())
	}
	snap := th.worker(id)
	assertNoProcess(th.t, snap.PID)
	var list api.WorkerList
	th.do("GET", "/v2/workers", nil, &list)
	for _, l := range list.Workers {
		if l.WorkerID == id {
			th.t.Errorf("ended worker %s still listed as live: %+v", id, l)
		}
	}
	var gpus api.GPUList
	th.do("GET", "/v2/gpus", nil, &gpus)
	for _, g := range gpus.GPUs {
		if slices.Contains(g.Workers, id) {
			th.t.Errorf("device %d still counts ended worker %s", g.ID, id)
		}
	}
	return snap
}

// assertNoProcess checks that neither pid nor any member of its process
// group is alive.
func assertNoProcess(t testing.TB, pid int) {
	t.Helper()
	if pid <= 0 {
		t.Fatalf("no pid recorded")
	}
	if s, err := procs.ReadStat(pid); err == nil && s.Alive() {
		t.Errorf("process %d still alive: %+v", pid, s)
	}
	if m, err := procs.GroupMembers(pid); err != nil || len(m) > 0 {
		t.Errorf("process group %d still has %v (%v)", pid, m, err)
	}
}

func portFree(t testing.TB, uri string) {
	t.Helper()
	host := uri[len("http://"):]
	ln, err := net.Listen("tcp", host)
	if err != nil {
		t.Errorf("port of %s still held: %v", uri, err)
		return
	}
	ln.Close()
}

// fixedDevices is an inventory with the given devices.
type fixedDevices []gpu.Device

func (f fixedDevices) Devices(context.Context) ([]gpu.Device, error) { return f, nil }
func (fixedDevices) Close() error                                    { return nil }

func withDevices(d ...gpu.Device) hiveOpt { return func(c *Config) { c.Devices = fixedDevices(d) } }
