package hive

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/gguf"
	"github.com/apiary-llm/apiary/internal/gpu"
	"github.com/apiary-llm/apiary/internal/lifecycle"
	"github.com/apiary-llm/apiary/internal/testmodel"
)

func TestHealthMissDegradesAndAnswerRecovers(t *testing.T) {
	th := startHive(t, withFake("health-fail=2"))
	id := th.start()
	th.rec.wait(t, id, lifecycle.Degraded)
	th.rec.wait(t, id, lifecycle.Ready)
	// ready (callback) → degraded (miss) → ready (answer): the second
	// ready is the recovery.
	deadline := time.After(waitLimit)
	for {
		states := th.rec.states(id)
		if len(states) >= 4 {
			if !slicesEqual(states[:4], []string{"starting", "ready", "degraded", "ready"}) {
				t.Fatalf("states = %v", states)
			}
			break
		}
		select {
		case <-deadline:
			t.Fatalf("no recovery; states %v", states)
		case <-th.rec.changed():
		}
	}
	if w := th.worker(id); w.Status != "ready" {
		t.Errorf("status = %s", w.Status)
	}
}

func TestBusyWhileServingThenReady(t *testing.T) {
	th := startHive(t, withFake("slow=1s"))
	id := th.start()
	ready := th.rec.wait(t, id, lifecycle.Ready)
	done := make(chan error, 1)
	go func() { done <- complete(ready.Worker.URI) }()
	th.rec.wait(t, id, lifecycle.Busy)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	deadline := time.After(waitLimit)
	for {
		st := th.rec.states(id)
		if st[len(st)-1] == "ready" && len(st) >= 4 {
			break
		}
		select {
		case <-deadline:
			t.Fatalf("states %v", st)
		case <-th.rec.changed():
		}
	}
}

func TestIdleTimeoutStopsWorkerHiveLives(t *testing.T) {
	th := startHive(t, func(c *Config) { c.IdleTimeout = 300 * time.Millisecond })
	id := th.start()
	ready := th.rec.wait(t, id, lifecycle.Ready)
	ev := th.rec.wait(t, id, lifecycle.Draining)
	if !strings.Contains(ev.Reason, "idle for 300ms") {
		t.Errorf("reason = %q", ev.Reason)
	}
	if idle := ev.At.Sub(ready.At); idle < 300*time.Millisecond {
		t.Errorf("stopped after %s idle, before the timeout", idle)
	}
	th.rec.wait(t, id, lifecycle.Stopped)
	th.gone(id)
	var h api.Health
	if code := th.do("GET", "/health", nil, &h); code != 200 || h.Status != "ok" {
		t.Errorf("hive health after idle stop = %d %+v", code, h)
	}
}

func TestIdleTimerRestartsWithRequests(t *testing.T) {
	th := startHive(t, func(c *Config) { c.IdleTimeout = 400 * time.Millisecond })
	id := th.start()
	ready := th.rec.wait(t, id, lifecycle.Ready)
	// Keep it busy past one idle timeout: every request restarts the clock.
	var last time.Time
	for range 4 {
		if err := complete(ready.Worker.URI); err != nil {
			t.Fatal(err)
		}
		last = time.Now()
		if st := th.rec.states(id); strings.Contains(strings.Join(st, ","), "draining") {
			t.Fatalf("stopped while in use: %v", st)
		}
		time.Sleep(150 * time.Millisecond) // the gap between a client's requests
	}
	ev := th.rec.wait(t, id, lifecycle.Draining)
	if ev.At.Sub(last) < 400*time.Millisecond-150*time.Millisecond {
		t.Errorf("stopped %s after the last request", ev.At.Sub(last))
	}
	th.gone(id)
}

func TestDrainLetsInFlightRequestFinish(t *testing.T) {
	th := startHive(t, withFake("slow=1s"))
	id := th.start()
	ready := th.rec.wait(t, id, lifecycle.Ready)
	done := make(chan error, 1)
	go func() { done <- complete(ready.Worker.URI) }()
	th.drainBusy(id, done)
}

func TestStopWhileStartingFailsAndKills(t *testing.T) {
	th := startHive(t, withFake("no-callback"))
	id := th.start()
	if code := th.do("POST", "/v2/workers/"+id+"/stop", nil, nil); code != http.StatusAccepted {
		t.Fatalf("stop: %d", code)
	}
	ev := th.rec.wait(t, id, lifecycle.Failed)
	if !strings.Contains(ev.Reason, "before it was ready") {
		t.Errorf("reason = %q", ev.Reason)
	}
	th.gone(id)
}

func TestPreflightRefusals(t *testing.T) {
	th := startHive(t, withDevices(gpu.Device{ID: 0, Kind: gpu.KindCPU, Name: "tiny", TotalBytes: 64 << 20, FreeBytes: 64 << 20}))
	if err := os.WriteFile(filepath.Join(th.cfg.ModelsDir, "junk.gguf"), []byte("not a model"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, body string
		status     int
		code       string
		msg        string
	}{
		{"path separator", `{"model_ref":"../models/tiny"}`, 400, "invalid_model_ref", "must be a model name"},
		{"dot dot", `{"model_ref":"..tiny"}`, 400, "invalid_model_ref", "must be a model name"},
		{"empty", `{"model_ref":""}`, 400, "invalid_model_ref", "empty"},
		{"bad lifecycle id", `{"model_ref":"tiny","lifecycle_id":"not a lifecycle id!"}`, 400, "invalid_request", "lifecycle_id"},
		{"missing", `{"model_ref":"nope"}`, 404, "model_not_found", "not in"},
		{"not gguf", `{"model_ref":"junk"}`, 422, "invalid_model", "GGUF"},
		{"no such device", `{"model_ref":"tiny","gpu_device":3}`, 400, "device_not_found", "gpu_device 3"},
		{"unknown field", `{"model_ref":"tiny","colour":"red"}`, 400, "invalid_request", "colour"},
		{"not json", `{"model_ref":`, 400, "invalid_request", "invalid JSON"},
		{"too large", `{"model_ref":"` + strings.Repeat("a", 2<<20) + `"}`, 413, "body_too_large", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var e api.Error
			if got := th.do("POST", "/v2/workers/start", c.body, &e); got != c.status || e.Error.Code != c.code || !strings.Contains(e.Error.Message, c.msg) {
				t.Errorf("got %d %+v, want %d %s containing %q", got, e.Error, c.status, c.code, c.msg)
			}
		})
	}
	var list api.WorkerList
	th.do("GET", "/v2/workers", nil, &list)
	if len(list.Workers) != 0 {
		t.Errorf("refused starts left workers: %+v", list.Workers)
	}
}

func TestPreflightInsufficientMemoryNamesShortfall(t *testing.T) {
	th := startHive(t, withDevices(gpu.Device{ID: 0, Kind: gpu.KindCUDA, Name: "small", TotalBytes: 8 << 20, FreeBytes: 8 << 20}))
	var e api.Error
	code := th.do("POST", "/v2/workers/start", api.StartWorkerRequest{ModelRef: "tiny"}, &e)
	if code != http.StatusInsufficientStorage || e.Error.Code != "insufficient_memory" {
		t.Fatalf("got %d %+v", code, e)
	}
	for _, want := range []string{"model needs", "cuda device 0 has 8.0 MiB available", "short by"} {
		if !strings.Contains(e.Error.Message, want) {
			t.Errorf("message %q lacks %q", e.Error.Message, want)
		}
	}
}

// Two workers on a device that holds only one: the second start is
// refused while the first holds its reservation or its memory.
func TestMemoryHeldByWorkersCountsAgainstNextStart(t *testing.T) {
	est := tinyEstimate(t)
	total := est + est/2
	th := startHive(t, withFake("no-callback"), withDevices(gpu.Device{ID: 0, Kind: gpu.KindCPU, TotalBytes: total, FreeBytes: total}))
	id := th.start()
	var e api.Error
	if code := th.do("POST", "/v2/workers/start", api.StartWorkerRequest{ModelRef: "tiny"}, &e); code != 507 {
		t.Fatalf("second start = %d %+v, want 507", code, e)
	}
	if !strings.Contains(e.Error.Message, "held by its workers") {
		t.Errorf("message %q", e.Error.Message)
	}
	th.do("POST", "/v2/workers/"+id+"/stop", nil, nil)
	th.gone(id)
	id2 := th.start()
	th.do("POST", "/v2/workers/"+id2+"/stop", nil, nil)
	th.gone(id2)
}

func TestUnknownWorker(t *testing.T) {
	th := startHive(t)
	var e api.Error
	for _, c := range []struct{ method, path, body string }{
		{"GET", "/v2/workers/worker-nope", ""},
		{"POST", "/v2/workers/worker-nope/stop", "{}"},
		{"GET", "/v2/workers/worker-nope/logs", ""},
		{"POST", "/v2/internal/workers/ready", `{"worker_id":"worker-nope","vram_bytes":1,"uri":"http://127.0.0.1:1"}`},
	} {
		if code := th.do(c.method, c.path, c.body, &e); code != 404 || e.Error.Code != "worker_not_found" {
			t.Errorf("%s %s = %d %+v", c.method, c.path, code, e)
		}
	}
}

func TestReadyCallbackOnlyOnceAndOnlyWithToken(t *testing.T) {
	th := startHive(t)
	id := th.start()
	ready := th.rec.wait(t, id, lifecycle.Ready)
	body := fmt.Sprintf(`{"worker_id":%q,"vram_bytes":1,"uri":%q}`, id, ready.Worker.URI)
	var e api.Error
	if code := th.do("POST", "/v2/internal/workers/ready", body, &e); code != 401 {
		t.Errorf("callback without token = %d %+v", code, e)
	}
	w, _ := th.reg.get(id, false)
	req, _ := http.NewRequest("POST", th.url+"/v2/internal/workers/ready", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+w.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusConflict {
		t.Errorf("second callback = %d, want 409", resp.StatusCode)
	}
	th.do("POST", "/v2/workers/"+id+"/stop", nil, nil)
	th.gone(id)
}

func TestModelsAndMetrics(t *testing.T) {
	th := startHive(t)
	var models api.ModelList
	th.do("GET", "/v2/models", nil, &models)
	if len(models.Models) != 1 || models.Models[0].Ref != "tiny" || models.Models[0].Architecture != "llama" {
		t.Errorf("models = %+v", models)
	}
	id := th.start()
	th.rec.wait(t, id, lifecycle.Ready)
	th.do("POST", "/v2/workers/"+id+"/stop", nil, nil)
	th.gone(id)
	resp, err := http.Get(th.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`apiary_hive_workers{state="ready"} 0`,
		`apiary_hive_worker_spawns_total{result="spawned"} 1`,
		`apiary_hive_worker_ready_seconds_count 1`,
		`apiary_hive_worker_stops_total{kind="graceful"} 1`,
		`apiary_hive_device_memory_bytes{device="0",kind="cpu",type="total"}`,
	} {
		if !strings.Contains(string(b), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

func TestClusterTokenGuardsAPI(t *testing.T) {
	th := startHive(t, func(c *Config) { c.ClusterToken = "s3cret" })
	var e api.Error
	if code := th.do("GET", "/v2/workers", nil, &e); code != 401 || e.Error.Code != "unauthorized" {
		t.Errorf("no token = %d %+v", code, e)
	}
	// The scheme is case-insensitive (RFC 7235): "bearer" was once 401.
	for _, scheme := range []string{"Bearer", "bearer", "BEARER"} {
		req, _ := http.NewRequest("GET", th.url+"/v2/workers", nil)
		req.Header.Set("Authorization", scheme+" s3cret")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("with token (scheme %q) = %d", scheme, resp.StatusCode)
		}
	}
	if code := th.do("GET", "/health", nil, nil); code != 200 {
		t.Errorf("health needs no token, got %d", code)
	}
}

func TestConfigRefusesNonLoopbackWithoutToken(t *testing.T) {
	_, err := New(Config{Addr: "0.0.0.0:9200", DataDir: t.TempDir(), Devices: fixedDevices{}})
	if err == nil || !strings.Contains(err.Error(), "APIARY_CLUSTER_TOKEN") {
		t.Errorf("New = %v", err)
	}
}

func TestSecondHiveOnSameDataDirRefused(t *testing.T) {
	th := startHive(t)
	h2, err := New(Config{Addr: "127.0.0.1:0", DataDir: th.cfg.DataDir, Devices: fixedDevices{}})
	if err != nil {
		t.Fatal(err)
	}
	err = h2.Run(t.Context())
	if err == nil || !strings.Contains(err.Error(), "another hive") {
		t.Errorf("second Run = %v", err)
	}
}

// complete runs one streamed completion against a worker to the end.
func complete(uri string) error {
	resp, err := http.Post(uri+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"hi","stream":true}`))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return fmt.Errorf("completion: %s", resp.Status)
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if sc.Text() == "data: [DONE]" {
			return nil
		}
	}
	return fmt.Errorf("stream ended without [DONE]: %v", sc.Err())
}

// tinyEstimate is the memory estimate of the test model.
func tinyEstimate(t *testing.T) uint64 {
	t.Helper()
	info, err := ggufInspector{}.Inspect(writeModel(t, t.TempDir(), "tiny"), 0)
	if err != nil {
		t.Fatal(err)
	}
	return info.MemoryBytes
}

// TestSplitModelEstimateCountsEveryPart: the memory estimate of a split
// model counts the tensors of all its parts, not only those of the first
// part, whose header alone is the rest of the estimate.
func TestSplitModelEstimateCountsEveryPart(t *testing.T) {
	dir := t.TempDir()
	var later uint64 // the weights of parts 2 and 3
	for i := 1; i <= 3; i++ {
		p := filepath.Join(dir, fmt.Sprintf("big-%05d-of-00003.gguf", i))
		if err := testmodel.WriteFile(p, testmodel.Options{Seed: int64(i)}); err != nil {
			t.Fatal(err)
		}
		if i > 1 {
			f, err := gguf.Open(p)
			if err != nil {
				t.Fatal(err)
			}
			later += f.Info().WeightsBytes
		}
	}
	first, err := ggufInspector{}.Inspect(writeModel(t, t.TempDir(), "one"), 0) // part 1 alone (seed 1)
	if err != nil {
		t.Fatal(err)
	}
	split, err := ggufInspector{}.Inspect(filepath.Join(dir, "big-00001-of-00003.gguf"), 0)
	if err != nil {
		t.Fatal(err)
	}
	if later == 0 || split.MemoryBytes != first.MemoryBytes+later {
		t.Errorf("split estimate %d, want %d (the first part's %d + the other parts' weights %d)", split.MemoryBytes, first.MemoryBytes+later, first.MemoryBytes, later)
	}
	// A part missing: the model cannot load, and says which.
	os.Remove(filepath.Join(dir, "big-00003-of-00003.gguf"))
	if _, err := (ggufInspector{}).Inspect(filepath.Join(dir, "big-00001-of-00003.gguf"), 0); !errors.Is(err, ErrInvalidModel) || !strings.Contains(err.Error(), "part 3 of 3") {
		t.Errorf("Inspect without part 3 = %v, want ErrInvalidModel naming part 3", err)
	}
}

// TestStartOptionsOverrideTheHives: a start's options (the queen's model
// config) reach the worker's command line in place of the hive's own,
// and its idle timeout replaces the hive's; a negative option is 400.
func TestStartOptionsOverrideTheHives(t *testing.T) {
	th := startHive(t, func(c *Config) {
		c.IdleTimeout = time.Hour
		c.CtxSize, c.WorkerSlots, c.WorkerThreads = 256, 1, 1
	})
	var res api.StartWorkerResponse
	req := api.StartWorkerRequest{ModelRef: "tiny", WorkerOptions: api.WorkerOptions{CtxSize: 512, Slots: 3, Threads: 2, IdleTimeoutMS: 300}}
	if code := th.do("POST", "/v2/workers/start", req, &res); code != http.StatusAccepted {
		t.Fatalf("start: %d", code)
	}
	ready := th.rec.wait(t, res.WorkerID, lifecycle.Ready)
	ev := th.rec.wait(t, res.WorkerID, lifecycle.Draining)
	if !strings.Contains(ev.Reason, "idle for 300ms") || ev.At.Sub(ready.At) < 300*time.Millisecond {
		t.Errorf("draining %s after ready: %q", ev.At.Sub(ready.At), ev.Reason)
	}
	// The worker's output reaches its log through a pipe, which may be
	// read after its ready callback: wait for the line.
	if log, ok := th.logWithin(res.WorkerID, "--threads 2 --slots 3 --ctx-size 512"); !ok {
		t.Errorf("worker log:\n%s", log)
	}
	// Without options, the hive's own.
	id := th.start()
	th.rec.wait(t, id, lifecycle.Ready)
	if log, ok := th.logWithin(id, "--threads 1 --slots 1 --ctx-size 256"); !ok {
		t.Errorf("worker log without options:\n%s", log)
	}
	var e api.Error
	if code := th.do("POST", "/v2/workers/start", api.StartWorkerRequest{ModelRef: "tiny", WorkerOptions: api.WorkerOptions{Slots: -1}}, &e); code != http.StatusBadRequest ||
		!strings.Contains(e.Error.Message, "slots must not be negative") {
		t.Errorf("negative slots: %d %+v", code, e)
	}
}
