package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/engine"
	"github.com/apiary-llm/apiary/internal/openai"
	"github.com/google/go-cmp/cmp"
)

func TestHealthStates(t *testing.T) {
	eng := newFakeEngine("a", "b")
	eng.gate = make(chan struct{})
	eng.started = make(chan engine.Request, 1)
	loaded := make(chan struct{})
	cfg := testConfig(t)
	r := startWorkerWith(t, cfg, func(ctx context.Context, _ engine.Options, _ *slog.Logger) (engine.Engine, error) {
		select {
		case <-loaded:
			return eng, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	})

	h := r.health(t)
	want := Health{Status: StatusLoading, Model: "tiny", Slots: 1}
	if diff := cmp.Diff(want, h); diff != "" {
		t.Errorf("health while loading (-want +got):\n%s", diff)
	}
	var e openai.ErrorResponse
	status, hdr := r.postJSON(t, "/v1/completions", `{"prompt":"a"}`, &e)
	if status != http.StatusServiceUnavailable || e.Error.Code != "model_loading" || hdr.Get("Retry-After") != "1" {
		t.Errorf("completion while loading: %d %+v Retry-After %q", status, e.Error, hdr.Get("Retry-After"))
	}

	close(loaded)
	<-r.w.Ready()
	h = r.health(t)
	want = Health{Status: StatusReady, Model: "tiny", Slots: 1, VRAMBytes: 12345}
	if diff := cmp.Diff(want, h); diff != "" {
		t.Errorf("health when ready (-want +got):\n%s", diff)
	}

	before := time.Now().UTC().Truncate(time.Millisecond)
	res := r.post(t, t.Context(), "/v1/completions", `{"prompt":"a","stream":true}`)
	defer res.Body.Close()
	<-eng.started
	h = r.health(t)
	if h.Status != StatusBusy || h.InFlight != 1 || h.LastRequestAt == nil || h.LastRequestAt.Before(before) {
		t.Errorf("health while generating: %+v", h)
	}
	eng.gate <- struct{}{}
	eng.gate <- struct{}{}
	io.Copy(io.Discard, res.Body)
	waitFor(t, "the generation to end", func() bool { return r.w.Health().InFlight == 0 })
	h = r.health(t)
	if h.Status != StatusReady || h.LastRequestAt == nil {
		t.Errorf("health after the request: %+v", h)
	}

	// The JSON names the contract uses.
	resp, err := r.client.Get(r.url + "/health")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var raw map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&raw); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"status", "model", "in_flight", "queued", "slots", "last_request_at", "vram_bytes"} {
		if _, ok := raw[key]; !ok {
			t.Errorf("/health has no %q: %v", key, raw)
		}
	}
	if _, err := time.Parse(time.RFC3339, raw["last_request_at"].(string)); err != nil {
		t.Errorf("last_request_at is not RFC 3339: %v", err)
	}
	if err := r.stop(t); err != nil {
		t.Errorf("Run returned %v", err)
	}
}

func TestQueueFullAnswers503WithRetryAfter(t *testing.T) {
	eng := newFakeEngine("a")
	eng.gate = make(chan struct{})
	eng.started = make(chan engine.Request, 2)
	cfg := testConfig(t)
	cfg.QueueSize = 1
	cfg.RetryAfter = 2 * time.Second
	r := startWorker(t, cfg, eng)

	var wg sync.WaitGroup
	texts := make([]string, 2)
	for i := range 2 {
		wg.Go(func() {
			var c openai.Completion
			r.postJSON(t, "/v1/completions", `{"prompt":"a"}`, &c)
			if len(c.Choices) == 1 {
				texts[i] = c.Choices[0].Text
			}
		})
		if i == 0 {
			<-eng.started // the first holds the slot
		}
	}
	waitFor(t, "the second request to queue", func() bool { return r.w.Health().Queued == 1 })
	if h := r.health(t); h.InFlight != 1 || h.Queued != 1 || h.Status != StatusBusy {
		t.Errorf("health %+v, want busy with 1 in flight and 1 queued", h)
	}

	var e openai.ErrorResponse
	status, hdr := r.postJSON(t, "/v1/completions", `{"prompt":"a"}`, &e)
	if status != http.StatusServiceUnavailable || e.Error.Code != "queue_full" || hdr.Get("Retry-After") != "2" {
		t.Errorf("third request: %d %+v Retry-After %q", status, e.Error, hdr.Get("Retry-After"))
	}

	eng.gate <- struct{}{}
	<-eng.started // the queued one got the slot
	eng.gate <- struct{}{}
	wg.Wait()
	if diff := cmp.Diff([]string{"a", "a"}, texts); diff != "" {
		t.Errorf("texts (-want +got):\n%s", diff)
	}
}

// A generation whose client went away hands its slot to the next request
// at once, before the engine has finished with it.
func TestGoneClientHandsSlotOn(t *testing.T) {
	eng := newFakeEngine("a")
	eng.gate = make(chan struct{})
	eng.deaf = true
	eng.started = make(chan engine.Request, 2)
	cfg := testConfig(t)
	cfg.Slots = 1
	r := startWorker(t, cfg, eng)

	ctx, cancel := context.WithCancel(t.Context())
	first := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, r.url+"/v1/completions", strings.NewReader(`{"prompt":"a"}`))
		req.Header.Set("Content-Type", "application/json")
		resp, err := r.client.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		first <- err
	}()
	<-eng.started
	cancel()
	if err := <-first; err == nil {
		t.Fatal("the first request was answered; want it cut off")
	}

	second := make(chan string, 1)
	go func() {
		var c openai.Completion
		r.postJSON(t, "/v1/completions", `{"prompt":"b"}`, &c)
		if len(c.Choices) == 1 {
			second <- c.Choices[0].Text
		}
		close(second)
	}()
	select {
	case <-eng.started: // while the first is still in the engine
	case <-time.After(10 * time.Second):
		t.Fatal("the second request did not get the gone client's slot")
	}
	eng.gate <- struct{}{} // one of them ends its token
	eng.gate <- struct{}{}
	if text := <-second; text != "a" {
		t.Errorf("second answer %q", text)
	}
}

func TestSlotsRunInParallel(t *testing.T) {
	eng := newFakeEngine("a")
	eng.gate = make(chan struct{})
	eng.started = make(chan engine.Request, 3)
	cfg := testConfig(t)
	cfg.Slots = 3
	r := startWorker(t, cfg, eng)

	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() { r.postJSON(t, "/v1/completions", `{"prompt":"a"}`, nil) })
	}
	for range 3 {
		<-eng.started // all three generate at once
	}
	if h := r.health(t); h.InFlight != 3 || h.Queued != 0 || h.Status != StatusBusy {
		t.Errorf("health %+v, want 3 in flight", h)
	}
	for range 3 {
		eng.gate <- struct{}{}
	}
	wg.Wait()
}

func TestDrainLetsInFlightFinish(t *testing.T) {
	eng := newFakeEngine("a", "b")
	eng.gate = make(chan struct{})
	r := startWorker(t, testConfig(t), eng)

	res := r.post(t, t.Context(), "/v1/completions", `{"prompt":"a","stream":true}`)
	defer res.Body.Close()
	s := newSSEReader(t, res.Body)
	eng.gate <- struct{}{}
	var c openai.Completion
	s.nextJSON(&c)

	r.w.RequestShutdown()
	waitFor(t, "draining", func() bool { return r.w.Health().Status == StatusDraining })
	var e openai.ErrorResponse
	if status, _ := r.postJSON(t, "/v1/completions", `{"prompt":"a"}`, &e); status != 503 || e.Error.Code != "draining" {
		t.Errorf("new request while draining: %d %+v", status, e.Error)
	}
	if eng.isClosed() {
		t.Error("engine closed while a generation runs")
	}

	eng.gate <- struct{}{}
	var events []string
	for ev := s.next(); ev != ""; ev = s.next() {
		events = append(events, ev)
	}
	if len(events) != 3 || events[2] != "[DONE]" {
		t.Errorf("rest of the stream %q, want text, finish and [DONE]", events)
	}
	if err := r.wait(t); err != nil {
		t.Errorf("Run returned %v, want nil", err)
	}
	if !eng.isClosed() {
		t.Error("engine not closed after drain")
	}
}

func TestDrainGraceExpiryCancelsWithErrorEvent(t *testing.T) {
	eng := newFakeEngine("a", "b")
	eng.gate = make(chan struct{})
	cfg := testConfig(t)
	cfg.ShutdownGrace = 50 * time.Millisecond
	r := startWorker(t, cfg, eng)

	res := r.post(t, t.Context(), "/v1/chat/completions", `{"messages":[{"role":"user","content":"a"}],"stream":true}`)
	defer res.Body.Close()
	s := newSSEReader(t, res.Body)
	s.next() // role
	eng.gate <- struct{}{}
	s.next() // "a"

	r.cancel() // SIGTERM
	var last openai.ErrorResponse
	s.nextJSON(&last)
	if last.Error.Code != "shutting_down" || last.Error.Message == "" {
		t.Errorf("final event %+v, want an error with code shutting_down", last)
	}
	if ev := s.next(); ev != "" {
		t.Errorf("event after the error: %q", ev)
	}
	if err := r.wait(t); err != nil {
		t.Errorf("Run returned %v, want nil", err)
	}
	if !eng.isClosed() {
		t.Error("engine not closed")
	}
}

func TestDrainGraceExpiryNotStreamed(t *testing.T) {
	eng := newFakeEngine("a")
	eng.gate = make(chan struct{})
	eng.started = make(chan engine.Request, 1)
	cfg := testConfig(t)
	cfg.ShutdownGrace = 10 * time.Millisecond
	r := startWorker(t, cfg, eng)

	type answer struct {
		status int
		body   openai.ErrorResponse
	}
	got := make(chan answer, 1)
	go func() {
		var a answer
		a.status, _ = r.postJSON(t, "/v1/completions", `{"prompt":"a"}`, &a.body)
		got <- a
	}()
	<-eng.started
	r.w.RequestShutdown()
	a := <-got
	if a.status != http.StatusServiceUnavailable || a.body.Error.Code != "shutting_down" {
		t.Errorf("answer %+v, want 503 shutting_down", a)
	}
	if err := r.wait(t); err != nil {
		t.Errorf("Run returned %v", err)
	}
}

func TestDrainRejectsQueuedRequests(t *testing.T) {
	eng := newFakeEngine("a")
	eng.gate = make(chan struct{})
	eng.started = make(chan engine.Request, 1)
	r := startWorker(t, testConfig(t), eng)

	first := make(chan int, 1)
	go func() { s, _ := r.postJSON(t, "/v1/completions", `{"prompt":"a"}`, nil); first <- s }()
	<-eng.started
	queued := make(chan openai.ErrorResponse, 1)
	go func() {
		var e openai.ErrorResponse
		r.postJSON(t, "/v1/completions", `{"prompt":"a"}`, &e)
		queued <- e
	}()
	waitFor(t, "a queued request", func() bool { return r.w.Health().Queued == 1 })
	r.w.RequestShutdown()
	if e := <-queued; e.Error.Code != "draining" {
		t.Errorf("queued request got %+v, want draining", e.Error)
	}
	eng.gate <- struct{}{}
	if s := <-first; s != http.StatusOK {
		t.Errorf("in-flight request status %d", s)
	}
	if err := r.wait(t); err != nil {
		t.Errorf("Run returned %v", err)
	}
}

func TestAdminShutdown(t *testing.T) {
	cfg := testConfig(t)
	cfg.Token = "s3cret"
	eng := newFakeEngine()
	r := startWorker(t, cfg, eng)

	for _, auth := range []string{"", "Bearer wrong", "s3cret"} {
		req, _ := http.NewRequest(http.MethodPost, r.url+"/v1/admin/shutdown", nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		res, err := r.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusUnauthorized {
			t.Errorf("shutdown with Authorization %q: %d, want 401", auth, res.StatusCode)
		}
	}
	if h := r.health(t); h.Status != StatusReady {
		t.Fatalf("status %s after refused shutdowns", h.Status)
	}

	req, _ := http.NewRequest(http.MethodPost, r.url+"/v1/admin/shutdown", nil)
	req.Header.Set("Authorization", "Bearer s3cret")
	res, err := r.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusAccepted {
		t.Errorf("shutdown: %d, want 202", res.StatusCode)
	}
	if err := r.wait(t); err != nil {
		t.Errorf("Run returned %v, want nil", err)
	}
	if !eng.isClosed() {
		t.Error("engine not closed")
	}
}

func TestShutdownWhileLoading(t *testing.T) {
	r := startWorkerWith(t, testConfig(t), func(ctx context.Context, _ engine.Options, _ *slog.Logger) (engine.Engine, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	})
	res, err := r.client.Post(r.url+"/v1/admin/shutdown", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if err := r.wait(t); err != nil {
		t.Errorf("Run returned %v, want nil", err)
	}
}

func TestRunFailures(t *testing.T) {
	notGGUF := filepath.Join(t.TempDir(), "notes.gguf")
	if err := os.WriteFile(notGGUF, []byte("hello, I am not a model"), 0o644); err != nil {
		t.Fatal(err)
	}
	loaderErr := errors.New("out of memory")
	tests := []struct {
		name      string
		modelPath string
		loader    Loader
		wantErr   error
		wantText  string
	}{
		{"missing model file", filepath.Join(t.TempDir(), "nope.gguf"), nil, ErrModelFile, "nope.gguf"},
		{"not a GGUF file", notGGUF, nil, ErrModelFile, "not a usable GGUF model"},
		{"loader fails", "", func(context.Context, engine.Options, *slog.Logger) (engine.Engine, error) { return nil, loaderErr }, ErrLoad, "out of memory"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig(t)
			if tt.modelPath != "" {
				cfg.ModelPath = tt.modelPath
			}
			loader := tt.loader
			if loader == nil {
				loader = func(context.Context, engine.Options, *slog.Logger) (engine.Engine, error) {
					t.Error("loader called for a bad model file")
					return nil, errors.New("unexpected")
				}
			}
			w, err := New(cfg, loader)
			if err != nil {
				t.Fatal(err)
			}
			err = w.Run(t.Context())
			if !errors.Is(err, tt.wantErr) || !strings.Contains(err.Error(), tt.wantText) {
				t.Errorf("Run = %v, want %v mentioning %q", err, tt.wantErr, tt.wantText)
			}
		})
	}
}

// callbackServer is a fake hive: it answers the ready callback with the
// statuses in answers (the last one repeats) and records what it got.
type callbackServer struct {
	*httptest.Server
	mu      sync.Mutex
	answers []int
	got     []api.ReadyCallback // guarded by mu
	auth    []string            // guarded by mu
}

func newCallbackServer(t *testing.T, answers ...int) *callbackServer {
	cs := &callbackServer{answers: answers}
	cs.Server = httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		var cb api.ReadyCallback
		dec := json.NewDecoder(r.Body)
		dec.DisallowUnknownFields()
		if err := dec.Decode(&cb); err != nil {
			t.Errorf("callback body: %v", err)
		}
		cs.mu.Lock()
		cs.got = append(cs.got, cb)
		cs.auth = append(cs.auth, r.Header.Get("Authorization"))
		status := cs.answers[min(len(cs.got), len(cs.answers))-1]
		cs.mu.Unlock()
		rw.WriteHeader(status)
		if status >= 400 {
			json.NewEncoder(rw).Encode(api.Error{Error: api.ErrorDetail{Code: "unknown_worker", Message: "who are you"}})
		}
	}))
	t.Cleanup(cs.Close)
	return cs
}

func (cs *callbackServer) calls() ([]api.ReadyCallback, []string) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return append([]api.ReadyCallback(nil), cs.got...), append([]string(nil), cs.auth...)
}

func callbackConfig(t *testing.T, url string) Config {
	cfg := testConfig(t)
	cfg.CallbackURL = url
	cfg.Token = "tok"
	cfg.CallbackAttempts = 3
	cfg.CallbackBackoff = time.Millisecond
	return cfg
}

func TestReadyCallbackRetriesThenServes(t *testing.T) {
	cs := newCallbackServer(t, 503, 500, 200)
	eng := newFakeEngine("a")
	r := startWorker(t, callbackConfig(t, cs.URL), eng)
	waitFor(t, "the callback to be accepted", func() bool { got, _ := cs.calls(); return len(got) == 3 })

	got, auth := cs.calls()
	want := api.ReadyCallback{WorkerID: "wk-test", VRAMBytes: 12345, URI: r.url}
	for i := range got {
		if diff := cmp.Diff(want, got[i]); diff != "" {
			t.Errorf("callback %d (-want +got):\n%s", i, diff)
		}
		if auth[i] != "Bearer tok" {
			t.Errorf("callback %d Authorization %q", i, auth[i])
		}
	}
	var c openai.Completion
	if status, _ := r.postJSON(t, "/v1/completions", `{"prompt":"a"}`, &c); status != 200 {
		t.Errorf("completion after the callback: %d", status)
	}
	if err := r.stop(t); err != nil {
		t.Errorf("Run returned %v", err)
	}
}

func TestReadyCallbackRefused(t *testing.T) {
	cs := newCallbackServer(t, 403)
	eng := newFakeEngine()
	r := startWorkerWith(t, callbackConfig(t, cs.URL), func(context.Context, engine.Options, *slog.Logger) (engine.Engine, error) { return eng, nil })
	err := r.wait(t)
	if !errors.Is(err, ErrCallbackRefused) || !strings.Contains(err.Error(), "who are you") {
		t.Errorf("Run = %v, want ErrCallbackRefused with the hive's message", err)
	}
	if got, _ := cs.calls(); len(got) != 1 {
		t.Errorf("%d callbacks, want 1 (a refusal is final)", len(got))
	}
	if !eng.isClosed() {
		t.Error("engine not closed")
	}
}

func TestReadyCallbackNeverAccepted(t *testing.T) {
	cs := newCallbackServer(t, 502)
	r := startWorkerWith(t, callbackConfig(t, cs.URL), func(context.Context, engine.Options, *slog.Logger) (engine.Engine, error) {
		return newFakeEngine(), nil
	})
	if err := r.wait(t); !errors.Is(err, ErrCallbackFailed) {
		t.Errorf("Run = %v, want ErrCallbackFailed", err)
	}
	if got, _ := cs.calls(); len(got) != 3 {
		t.Errorf("%d callbacks, want 3", len(got))
	}

	// Nobody listening at all.
	r = startWorkerWith(t, callbackConfig(t, refusingURL(t)), func(context.Context, engine.Options, *slog.Logger) (engine.Engine, error) {
		return newFakeEngine(), nil
	})
	if err := r.wait(t); !errors.Is(err, ErrCallbackFailed) {
		t.Errorf("Run with no hive = %v, want ErrCallbackFailed", err)
	}
}

// refusingURL is an http URL on a loopback port that refuses connections:
// a socket bound there and never listening holds the port for the test,
// so that no listener (the worker's own, on port 0) can be given it, as
// a closed server's port could be.
func refusingURL(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("http://127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
}
