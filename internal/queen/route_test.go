package queen

// In-process tests of routing: a queen with a fake hive, and fake workers
// (httptest servers speaking the worker's SSE) that the tests steer.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/openai"
	"github.com/apiary-llm/apiary/internal/routing"
)

// modelHive is the fake hive with model lists, by endpoint.
type modelHive struct {
	*fakeHive
	started chan api.StartWorkerRequest // every start, when there is room
	mu      sync.Mutex
	models  map[string][]api.Model // guarded by mu; missing: the hive does not answer
}

func (h *modelHive) StartWorker(ctx context.Context, endpoint string, req api.StartWorkerRequest) (api.StartWorkerResponse, error) {
	select {
	case h.started <- req:
	default:
	}
	return h.fakeHive.StartWorker(ctx, endpoint, req)
}

func (h *modelHive) Models(_ context.Context, endpoint string) ([]api.Model, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	list, ok := h.models[endpoint]
	if !ok {
		return nil, fmt.Errorf("%w: no answer from %s", ErrHiveUnreachable, endpoint)
	}
	return list, nil
}

// tinyModel is the model every fake pool has.
var tinyModel = api.Model{Ref: "tiny", SizeBytes: 1 << 20, ModifiedAt: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)}

// routeQueen runs an in-process queen whose fake hives have the models
// models gives by endpoint.
func routeQueen(t testing.TB, models map[string][]api.Model, mods ...func(*Config)) (*tq, *modelHive) {
	t.Helper()
	var mh *modelHive
	mods = append([]func(*Config){func(c *Config) {
		mh = &modelHive{fakeHive: c.Hives.(*fakeHive), models: models, started: make(chan api.StartWorkerRequest, 16)}
		c.Hives = mh
	}}, mods...)
	x := startQueen(t, sqliteDir(t), "", mods...)
	return x, mh
}

// registerAt registers pool id with endpoint.
func (x *tq) registerAt(id, endpoint string) {
	x.t.Helper()
	x.ok("POST", "/v2/pools/register", api.RegisterPool{PoolID: id, Endpoint: endpoint, NodeID: id, Version: "t",
		GPUs: []api.GPU{{ID: 0, Kind: "cpu", TotalBytes: 8 << 30, FreeBytes: 4 << 30}}}, http.StatusOK, nil)
}

// readyWorker starts a row for tiny on pool and reports its worker ready
// at uri; it returns the lifecycle id.
func (x *tq) readyWorker(pool, uri string) string {
	x.t.Helper()
	resp := x.start("tiny", pool)
	x.workerReady(pool, resp.LifecycleID, resp.Worker.WorkerID, uri)
	return resp.LifecycleID
}

func (x *tq) workerReady(pool, lid, wid, uri string) {
	x.t.Helper()
	now := time.Now().UTC()
	ack := x.event(api.WorkerEvent{PoolID: pool, WorkerID: wid, LifecycleID: lid, From: "starting", To: "ready", Reason: "test", At: now,
		Worker: api.Worker{WorkerID: wid, LifecycleID: lid, ModelRef: "tiny", URI: uri, Status: "ready", PID: 1, StartedAt: now}})
	if !ack.Applied {
		x.t.Fatalf("ready event not applied: %+v", ack)
	}
}

// servedByPlacement sends a streamed request that has no worker yet,
// waits for the controller to place one (on pool want), reports that
// worker ready at uri, and returns the answer and the hive's start.
func (x *tq) servedByPlacement(mh *modelHive, want, uri string, header ...string) (*http.Response, api.StartWorkerRequest) {
	x.t.Helper()
	respc := make(chan *http.Response, 1)
	go func() { respc <- x.post(context.Background(), "/v1/completions", streamBody, header...) }()
	var req api.StartWorkerRequest
	select {
	case req = <-mh.started:
	case <-time.After(waitLimit):
		x.t.Fatalf("no worker placed on %s", want)
	}
	x.logs.wait(x.t, 0, "worker placed on demand", map[string]string{"lifecycle_id": req.LifecycleID})
	row := x.row(req.LifecycleID)
	if row.PoolID != want {
		x.t.Fatalf("placed on %s, want %s", row.PoolID, want)
	}
	x.workerReady(want, req.LifecycleID, row.WorkerID, uri)
	return <-respc, req
}

// fakeWorker serves the worker's inference API as the test steers it.
type fakeWorker struct {
	*httptest.Server
	mu       sync.Mutex
	requests int // guarded by mu
	// stream is called for each streamed request after its header was
	// sent; send writes one event and flushes it.
	stream func(r *http.Request, send func(data string) error, hijack func())
}

func newFakeWorker(t testing.TB, stream func(r *http.Request, send func(string) error, hijack func())) *fakeWorker {
	fw := &fakeWorker{stream: stream}
	fw.Server = httptest.NewServer(http.HandlerFunc(fw.serve))
	t.Cleanup(fw.Close)
	return fw
}

// tokens streams n tokens and [DONE].
func tokens(n int) func(*http.Request, func(string) error, func()) {
	return func(_ *http.Request, send func(string) error, _ func()) {
		for i := range n {
			if send(fmt.Sprintf(`{"object":"text_completion","choices":[{"index":0,"text":"t%d","finish_reason":null}]}`, i)) != nil {
				return
			}
		}
		_ = send("[DONE]")
	}
}

func (fw *fakeWorker) count() int {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	return fw.requests
}

func (fw *fakeWorker) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/health" {
		openai.WriteJSON(w, http.StatusOK, api.WorkerHealth{Status: "ready", Model: "tiny"})
		return
	}
	fw.mu.Lock()
	fw.requests++
	fw.mu.Unlock()
	var req struct {
		Stream bool `json:"stream"`
	}
	_ = json.NewDecoder(r.Body).Decode(&req)
	if !req.Stream {
		openai.WriteJSON(w, http.StatusOK, map[string]any{"object": "text_completion", "choices": []any{map[string]any{"text": "whole"}}})
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	_ = rc.Flush()
	send := func(data string) error {
		if _, err := fmt.Fprintf(w, "data: %s\n\n", data); err != nil {
			return err
		}
		return rc.Flush()
	}
	hijack := func() {
		conn, _, err := rc.Hijack()
		if err == nil {
			conn.Close()
		}
	}
	fw.stream(r, send, hijack)
}

// post sends an OpenAI request to the queen.
func (x *tq) post(ctx context.Context, path, body string, header ...string) *http.Response {
	x.t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, x.url+path, strings.NewReader(body))
	if err != nil {
		x.t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := x.hc.Do(req)
	if err != nil {
		x.t.Fatal(err)
	}
	return resp
}

const streamBody = `{"model":"tiny","prompt":"hi","stream":true}`

// nextEvent reads one SSE event's data.
func nextEvent(br *bufio.Reader) (string, error) {
	var data string
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return data, err
		}
		line = strings.TrimRight(line, "\r\n")
		if line == "" {
			if data != "" {
				return data, nil
			}
			continue
		}
		data += strings.TrimPrefix(line, "data: ")
	}
}

func errorCode(t *testing.T, data []byte) string {
	t.Helper()
	var e openai.ErrorResponse
	if err := json.Unmarshal(data, &e); err != nil {
		t.Fatalf("not an error body: %s", data)
	}
	return e.Error.Code
}

// Each event reaches the client while the worker has not yet sent the
// next; the stream carries the anti-buffering headers and names its
// worker.
func TestRouteRelaysEachEventAsItComes(t *testing.T) {
	gate := make(chan struct{})
	fw := newFakeWorker(t, func(r *http.Request, send func(string) error, _ func()) {
		for i := range 3 {
			select {
			case <-gate:
			case <-r.Context().Done():
				return
			}
			_ = send(fmt.Sprintf(`{"choices":[{"text":"t%d"}]}`, i))
		}
		_ = send("[DONE]")
	})
	x, _ := routeQueen(t, map[string][]api.Model{"http://hive-a": {tinyModel}})
	x.registerAt("a", "http://hive-a")
	lid := x.readyWorker("a", fw.URL)

	respc := make(chan *http.Response, 1)
	go func() { respc <- x.post(t.Context(), "/v1/completions", streamBody) }()
	gate <- struct{}{}
	resp := <-respc
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("X-Accel-Buffering") != "no" || resp.Header.Get("Content-Type") != "text/event-stream" ||
		resp.Header.Get(api.WorkerHeader) != lid {
		t.Fatalf("answer %d, headers %v", resp.StatusCode, resp.Header)
	}
	br := bufio.NewReader(resp.Body)
	for i := range 3 {
		ev, err := nextEvent(br)
		if err != nil || ev != fmt.Sprintf(`{"choices":[{"text":"t%d"}]}`, i) {
			t.Fatalf("event %d: %q %v", i, ev, err)
		}
		if i < 2 {
			gate <- struct{}{} // the next event only now exists
		}
	}
	if ev, err := nextEvent(br); ev != "[DONE]" || err != nil {
		t.Errorf("last event %q %v", ev, err)
	}
	if _, err := nextEvent(br); err != io.EOF {
		t.Errorf("after [DONE]: %v", err)
	}
	if n := histCount(t, x, "apiary_queen_time_to_first_token_seconds"); n != 1 {
		t.Errorf("TTFT observations %d, want 1", n)
	}
	if n := histCount(t, x, "apiary_queen_inter_token_seconds"); n != 2 {
		t.Errorf("inter-token observations %d, want 2", n)
	}
}

// histCount reads the sample count of a histogram from /metrics.
func histCount(t *testing.T, x *tq, name string) int {
	t.Helper()
	_, body := x.do("GET", "/metrics", "", nil)
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, name+"_count") {
			var n int
			fmt.Sscanf(line[strings.LastIndexByte(line, ' ')+1:], "%d", &n)
			return n
		}
	}
	return 0
}

// metricLine returns the value of the first /metrics line starting with
// prefix, or "".
func metricLine(x *tq, prefix string) string {
	_, body := x.do("GET", "/metrics", "", nil)
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, prefix) {
			return line[strings.LastIndexByte(line, ' ')+1:]
		}
	}
	return ""
}

// A worker that refuses (503) or breaks the connection before the first
// byte is replaced by another; the one that broke gets nothing new.
func TestRouteRetriesBeforeTheFirstByte(t *testing.T) {
	var mode struct {
		sync.Mutex
		s string
	}
	bad := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mode.Lock()
		m := mode.s
		mode.Unlock()
		switch m {
		case "busy":
			openai.WriteError(w, &openai.Error{Status: http.StatusServiceUnavailable, Code: "queue_full", Message: "full"})
		default:
			conn, _, _ := http.NewResponseController(w).Hijack()
			conn.Close()
		}
	}))
	t.Cleanup(bad.Close)
	good := newFakeWorker(t, tokens(2))
	x, _ := routeQueen(t, map[string][]api.Model{"http://hive-a": {tinyModel}})
	x.registerAt("a", "http://hive-a")
	badID := x.readyWorker("a", bad.URL) // worker-1: wins ties
	goodID := x.readyWorker("a", good.URL)

	for _, m := range []string{"busy", "hangup"} {
		mode.Lock()
		mode.s = m
		mode.Unlock()
		resp := x.post(t.Context(), "/v1/completions", streamBody)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get(api.WorkerHeader) != goodID || !bytes.Contains(body, []byte("[DONE]")) {
			t.Fatalf("%s: %d from %s: %s", m, resp.StatusCode, resp.Header.Get(api.WorkerHeader), body)
		}
	}
	if got := metricLine(x, `apiary_queen_upstream_retries_total{model="tiny",reason="connection"}`); got != "1" {
		t.Errorf("connection retries %q", got)
	}
	if got := metricLine(x, `apiary_queen_upstream_retries_total{model="tiny",reason="worker_error"}`); got != "1" {
		t.Errorf("worker error retries %q", got)
	}
	// The worker that hung up is left out: no third visit.
	resp := x.post(t.Context(), "/v1/completions", `{"model":"tiny","prompt":"hi"}`)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get(api.WorkerHeader) != goodID {
		t.Errorf("after the hang-up: %d from %s, want 200 from %s (not %s)", resp.StatusCode, resp.Header.Get(api.WorkerHeader), goodID, badID)
	}
}

// A worker that dies mid-stream: the client's stream ends with an error
// event at once, the worker's row is FAILED (the queen's own check, as
// no hive reports it here), and the next request goes elsewhere.
func TestRouteWorkerDiesMidStream(t *testing.T) {
	died := make(chan struct{})
	dying := newFakeWorker(t, func(_ *http.Request, send func(string) error, hijack func()) {
		_ = send(`{"choices":[{"text":"a"}]}`)
		_ = send(`{"choices":[{"text":"b"}]}`)
		hijack()
		close(died)
	})
	other := newFakeWorker(t, tokens(1))
	x, _ := routeQueen(t, map[string][]api.Model{"http://hive-a": {tinyModel}})
	x.registerAt("a", "http://hive-a")
	dyingID := x.readyWorker("a", dying.URL)
	otherID := x.readyWorker("a", other.URL)

	resp := x.post(t.Context(), "/v1/completions", streamBody)
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	for range 2 {
		if _, err := nextEvent(br); err != nil {
			t.Fatal(err)
		}
	}
	<-died
	start := time.Now()
	dying.Close() // the process is gone: /health is refused too
	ev, err := nextEvent(br)
	took := time.Since(start)
	if err != nil || errorCode(t, []byte(ev)) != "worker_failed" || took > time.Second {
		t.Fatalf("after the worker died: %q %v after %s", ev, err, took)
	}
	if _, err := nextEvent(br); err != io.EOF {
		t.Errorf("after the error event: %v", err)
	}
	rec, _ := x.logs.wait(t, 0, "lifecycle row changed", map[string]string{"lifecycle_id": dyingID, "to": "FAILED"})
	if !strings.HasPrefix(rec.Attrs["reason"], "lost: the worker broke a request") {
		t.Errorf("row failed with %q", rec.Attrs["reason"])
	}
	resp2 := x.post(t.Context(), "/v1/completions", streamBody)
	io.Copy(io.Discard, resp2.Body)
	resp2.Body.Close()
	if resp2.StatusCode != 200 || resp2.Header.Get(api.WorkerHeader) != otherID {
		t.Errorf("next request: %d from %s, want %s", resp2.StatusCode, resp2.Header.Get(api.WorkerHeader), otherID)
	}
	if got := metricLine(x, `apiary_queen_streams_broken_total{model="tiny"}`); got != "1" {
		t.Errorf("broken streams %q", got)
	}
}

// A client that goes away cancels the worker's request.
func TestRouteClientDisconnectCancelsUpstream(t *testing.T) {
	cancelled := make(chan struct{})
	fw := newFakeWorker(t, func(r *http.Request, send func(string) error, _ func()) {
		_ = send(`{"choices":[{"text":"a"}]}`)
		<-r.Context().Done()
		close(cancelled)
	})
	x, _ := routeQueen(t, map[string][]api.Model{"http://hive-a": {tinyModel}})
	x.registerAt("a", "http://hive-a")
	x.readyWorker("a", fw.URL)
	ctx, cancel := context.WithCancel(t.Context())
	resp := x.post(ctx, "/v1/completions", streamBody)
	if ev, err := nextEvent(bufio.NewReader(resp.Body)); err != nil {
		t.Fatalf("first event: %q %v", ev, err)
	}
	cancel()
	resp.Body.Close()
	select {
	case <-cancelled:
	case <-time.After(waitLimit):
		t.Fatal("the worker's request was not cancelled")
	}
}

// The queue is bounded (429 with Retry-After) and a request waits at most
// the queue timeout (504).
func TestRouteQueueFullAndTimeout(t *testing.T) {
	release := make(chan struct{})
	fw := newFakeWorker(t, func(r *http.Request, send func(string) error, _ func()) {
		_ = send(`{"choices":[{"text":"a"}]}`)
		select {
		case <-release:
		case <-r.Context().Done():
		}
		_ = send("[DONE]")
	})
	x, _ := routeQueen(t, map[string][]api.Model{"http://hive-a": {tinyModel}}, func(c *Config) {
		c.Routing = routing.Config{QueueSize: 1, QueueTimeout: 300 * time.Millisecond, MaxWorkers: 1}
	})
	x.registerAt("a", "http://hive-a")
	x.readyWorker("a", fw.URL)
	busy := x.post(t.Context(), "/v1/completions", streamBody) // holds the one slot
	defer busy.Body.Close()
	waited := make(chan *http.Response, 1)
	start := time.Now()
	go func() { waited <- x.post(t.Context(), "/v1/completions", `{"model":"tiny","prompt":"hi"}`) }()
	x.logs.wait(t, 0, "request queued", map[string]string{"model_ref": "tiny", "queued": "1"})
	full := x.post(t.Context(), "/v1/completions", `{"model":"tiny","prompt":"hi"}`)
	body, _ := io.ReadAll(full.Body)
	full.Body.Close()
	if full.StatusCode != http.StatusTooManyRequests || full.Header.Get("Retry-After") != "1" || errorCode(t, body) != "queue_full" {
		t.Errorf("queue full: %d %v %s", full.StatusCode, full.Header, body)
	}
	resp := <-waited
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	took := time.Since(start)
	if resp.StatusCode != http.StatusGatewayTimeout || errorCode(t, body) != "queue_timeout" || took < 300*time.Millisecond {
		t.Errorf("queued request: %d %s after %s", resp.StatusCode, body, took)
	}
	close(release)
	io.Copy(io.Discard, busy.Body)
	if got := metricLine(x, `apiary_queen_inference_requests_total{code="429",endpoint="completions",model="tiny"}`); got != "1" {
		t.Errorf("429 count %q", got)
	}
}

func TestRouteModels(t *testing.T) {
	x, _ := routeQueen(t, map[string][]api.Model{"http://hive-a": {tinyModel, {Ref: "big", SizeBytes: 9 << 30}}},
		func(c *Config) {
			c.Tokens = Tokens{API: "sesame-0123456789", Admin: "admin-0123456789", Cluster: "cluster-0123456789"}
		})
	x.registerAt("a", "http://hive-a")
	get := func(path, token string) (int, []byte) { return x.do("GET", path, token, nil) }

	if status, body := get("/v1/models", ""); status != http.StatusUnauthorized || errorCode(t, body) != "unauthorized" {
		t.Errorf("without the API token: %d %s", status, body)
	}
	status, body := get("/v1/models", "sesame-0123456789")
	var list openai.ModelList
	if err := json.Unmarshal(body, &list); status != 200 || err != nil {
		t.Fatalf("models: %d %s", status, body)
	}
	if len(list.Data) != 2 || list.Data[0].ID != "big" || list.Data[1].ID != "tiny" || list.Data[1].Created != tinyModel.ModifiedAt.Unix() ||
		list.Object != "list" || list.Data[0].OwnedBy != "apiary" {
		t.Errorf("models %+v", list)
	}
	if status, body := get("/v1/models/tiny", "sesame-0123456789"); status != 200 || !bytes.Contains(body, []byte(`"id":"tiny"`)) {
		t.Errorf("model tiny: %d %s", status, body)
	}

	// A model no pool has: 404.
	status, body = x.do("POST", "/v1/chat/completions", "sesame-0123456789", `{"model":"nope","messages":[{"role":"user","content":"hi"}]}`)
	var e openai.ErrorResponse
	_ = json.Unmarshal(body, &e)
	if status != http.StatusNotFound || e.Error.Code != "model_not_found" || e.Error.Type != "not_found_error" || e.Error.Param == nil || *e.Error.Param != "model" {
		t.Errorf("unknown model: %d %s", status, body)
	}

	// The request is checked before routing.
	status, body = x.do("POST", "/v1/completions", "sesame-0123456789", `{"model":"tiny","prompt":"hi","best_of":2}`)
	if status != http.StatusBadRequest || errorCode(t, body) != "unsupported_parameter" {
		t.Errorf("best_of=2: %d %s", status, body)
	}
	status, body = x.do("POST", "/v1/completions", "sesame-0123456789", `{"prompt":"hi"}`)
	if status != http.StatusBadRequest || errorCode(t, body) != "missing_required_parameter" {
		t.Errorf("no model: %d %s", status, body)
	}
}

// A request with no worker of its model waits; the controller (not the
// request) places one on the healthy pool that has the model, with every
// other pool's reason in the audit entry of the start, and the request is
// served once the worker is ready.
func TestRouteColdStartPlacesOnDemand(t *testing.T) {
	x, mh := routeQueen(t, map[string][]api.Model{
		"http://hive-a": {tinyModel},
		"http://hive-b": {{Ref: "other", SizeBytes: 1}},
		// hive-c does not answer its model list
	})
	x.registerAt("a", "http://hive-a")
	x.registerAt("b", "http://hive-b")
	x.registerAt("c", "http://hive-c")
	// Registration reads each hive's model list in the background; wait for
	// the two that answer so the placement's reasons are settled.
	x.logs.wait(t, 0, "hive model list read", map[string]string{"pool_id": "a"})
	x.logs.wait(t, 0, "hive model list read", map[string]string{"pool_id": "b"})
	started := mh.started
	fw := newFakeWorker(t, tokens(3))

	respc := make(chan *http.Response, 1)
	go func() { respc <- x.post(t.Context(), "/v1/completions", streamBody, api.SessionHeader, "s1") }()
	var req api.StartWorkerRequest
	select {
	case req = <-started:
	case <-time.After(waitLimit):
		t.Fatal("no worker placed")
	}
	if req.ModelRef != "tiny" || req.GPUDevice == nil || *req.GPUDevice != 0 {
		t.Errorf("start %+v", req)
	}
	x.logs.wait(t, 0, "worker placed on demand", map[string]string{"lifecycle_id": req.LifecycleID})
	row := x.row(req.LifecycleID)
	if row.PoolID != "a" || row.Owner != OwnerQueen || row.Status != "STARTING" {
		t.Errorf("row %+v", row)
	}
	x.workerReady("a", req.LifecycleID, row.WorkerID, fw.URL)
	resp := <-respc
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get(api.WorkerHeader) != req.LifecycleID || !bytes.Contains(body, []byte("[DONE]")) {
		t.Fatalf("cold request: %d %s", resp.StatusCode, body)
	}

	var audit api.AuditList
	x.ok("GET", "/api/admin/audit?target="+req.LifecycleID+"&action=worker.start", nil, http.StatusOK, &audit)
	if len(audit.Entries) != 1 {
		t.Fatalf("start audit %+v", audit)
	}
	e := audit.Entries[0]
	placement, _ := e.Metadata["placement"].(map[string]any)
	rejected, _ := placement["rejected"].(map[string]any)
	if e.Actor != "queen" || !strings.HasPrefix(e.Reason, "demand: 1 requests for tiny waiting") || placement["pool_id"] != "a" ||
		rejected["b"] != "does not have model tiny" || !strings.HasPrefix(fmt.Sprint(rejected["c"]), "its model list is not known") {
		t.Errorf("start audit entry %+v", e)
	}
	// Warm: the next request of the session reuses the worker; nothing
	// more is placed.
	resp = x.post(t.Context(), "/v1/completions", streamBody, api.SessionHeader, "s1")
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.Header.Get(api.WorkerHeader) != req.LifecycleID || fw.count() != 2 {
		t.Errorf("warm request went to %s", resp.Header.Get(api.WorkerHeader))
	}
	select {
	case r := <-started:
		t.Errorf("a second worker was placed: %+v", r)
	default:
	}
	if hit, miss := metricLine(x, `apiary_queen_affinity_total{result="hit"}`), metricLine(x, `apiary_queen_affinity_total{result="miss"}`); hit != "1" || miss != "1" {
		t.Errorf("affinity hits %q misses %q", hit, miss)
	}
	if got := metricLine(x, `apiary_queen_placements_total{model="tiny",result="started"}`); got != "1" {
		t.Errorf("placements %q", got)
	}
}

// No pool can run the model: waiting requests get 503 no_capacity with
// the reasons, and the failed decision is audited.
func TestRouteNoPoolCanPlace(t *testing.T) {
	x, _ := routeQueen(t, map[string][]api.Model{"http://hive-a": {{Ref: "tiny", SizeBytes: 64 << 30}}})
	x.registerAt("a", "http://hive-a")
	status, body := x.do("POST", "/v1/completions", "", `{"model":"tiny","prompt":"hi"}`)
	if status != http.StatusServiceUnavailable || errorCode(t, body) != "no_capacity" || !bytes.Contains(body, []byte("no device has room for tiny")) {
		t.Errorf("answer %d %s", status, body)
	}
	x.logs.wait(t, 0, "placement found no pool", map[string]string{"model_ref": "tiny"}) // logged once audited
	var audit api.AuditList
	x.ok("GET", "/api/admin/audit?target=model:tiny", nil, http.StatusOK, &audit)
	if len(audit.Entries) != 1 || audit.Entries[0].Action != "worker.place_failed" {
		t.Errorf("audit %+v", audit.Entries)
	}
}

// Degraded workers get no new requests; a drained pool's running workers
// serve on (drained means no new workers), and no worker is placed
// elsewhere for them.
func TestRouteDegradedGetNothingNewDrainedServesOn(t *testing.T) {
	x, mh := routeQueen(t, map[string][]api.Model{"http://hive-a": {tinyModel}, "http://hive-b": {tinyModel}})
	x.registerAt("a", "http://hive-a")
	x.registerAt("b", "http://hive-b")
	sick := newFakeWorker(t, tokens(1))
	well := newFakeWorker(t, tokens(1))
	sickID := x.readyWorker("a", sick.URL)
	wellID := x.readyWorker("a", well.URL) // ties go to worker-1, the sick one
	sickRow := x.row(sickID)
	now := time.Now().UTC()
	x.event(api.WorkerEvent{PoolID: "a", WorkerID: sickRow.WorkerID, LifecycleID: sickID, From: "ready", To: "degraded", Reason: "missed a health check", At: now,
		Worker: api.Worker{WorkerID: sickRow.WorkerID, LifecycleID: sickID, ModelRef: "tiny", URI: sick.URL, Status: "degraded", PID: 1, StartedAt: now}})
	for range 3 {
		resp := x.post(t.Context(), "/v1/completions", streamBody)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.Header.Get(api.WorkerHeader) != wellID {
			t.Fatalf("served by %s, want %s (not the degraded %s)", resp.Header.Get(api.WorkerHeader), wellID, sickID)
		}
	}
	if sick.count() != 0 {
		t.Errorf("the degraded worker got %d requests", sick.count())
	}

	for range 2 {
		<-mh.started // the operator's starts above
	}
	x.ok("POST", "/v2/pools/a/drain", api.PoolAction{Reason: "maintenance"}, http.StatusOK, nil)
	resp := x.post(t.Context(), "/v1/completions", streamBody)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.Header.Get(api.WorkerHeader) != wellID || well.count() != 4 {
		t.Errorf("after the drain served by %s, want %s", resp.Header.Get(api.WorkerHeader), wellID)
	}
	select {
	case req := <-mh.started:
		t.Errorf("a worker was placed for the drained pool's model: %+v", req)
	default:
	}
}
