package worker

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/engine"
	"github.com/apiary-llm/apiary/internal/gguf"
	"github.com/apiary-llm/apiary/internal/testbin"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		testbin.Cleanup() // the binary the integration tests built, if any
		os.Exit(code)
	}))
}

// fakeEngine is a deterministic engine.Engine: one token per prompt byte
// (after a BOS of id 1), and every generation emits the same script of
// pieces. With a gate, each token waits for the test to send on it.
type fakeEngine struct {
	info   engine.ModelInfo
	script [][]byte
	gate   chan struct{} // nil: no waiting
	// deaf: a generation waiting at the gate does not watch its context,
	// as llama.cpp's loop finishes the step under way before it looks.
	deaf bool

	started chan engine.Request // receives each request as Generate starts, when non-nil
	ended   chan error          // receives Generate's error as it returns, when non-nil

	mu     sync.Mutex
	closed bool // guarded by mu
}

func newFakeEngine(pieces ...string) *fakeEngine {
	f := &fakeEngine{info: engine.ModelInfo{Architecture: "llama", CtxSize: 256, TrainCtx: 256, Vocab: 256, MemoryBytes: 12345}}
	for _, p := range pieces {
		f.script = append(f.script, []byte(p))
	}
	return f
}

func (f *fakeEngine) Info() engine.ModelInfo { return f.info }

func (f *fakeEngine) Tokenize(text string, addSpecial bool) ([]int, error) {
	if text == "panic" {
		panic("fake engine: asked to panic")
	}
	var ids []int
	if addSpecial {
		ids = append(ids, 1)
	}
	for _, b := range []byte(text) {
		ids = append(ids, int(b))
	}
	return ids, nil
}

func (f *fakeEngine) ChatPrompt(msgs []engine.Message) (string, error) {
	var b strings.Builder
	for _, m := range msgs {
		fmt.Fprintf(&b, "%s: %s\n", m.Role, m.Content)
	}
	b.WriteString("assistant:")
	return b.String(), nil
}

func (f *fakeEngine) Check(engine.Request) error { return nil }

func (f *fakeEngine) Embed(context.Context, []int) ([]float32, error) { return []float32{1}, nil }
func (f *fakeEngine) RerankInput(q, d string) ([]int, error) {
	return f.Tokenize(q+d, true)
}
func (f *fakeEngine) Rank(context.Context, []int) (float32, error) { return 0, engine.ErrNotReranker }

func (f *fakeEngine) Generate(ctx context.Context, req engine.Request, emit engine.Emit) (res engine.Result, err error) {
	if f.started != nil {
		f.started <- req
	}
	if f.ended != nil {
		defer func() { f.ended <- err }()
	}
	res.PromptTokens = len(req.Prompt)
	for _, piece := range f.script {
		if res.CompletionTokens == req.MaxTokens {
			res.FinishReason = engine.FinishLength
			return res, nil
		}
		if f.gate != nil {
			done := ctx.Done()
			if f.deaf {
				done = nil
			}
			select {
			case <-f.gate:
			case <-done:
				return res, ctx.Err()
			}
		}
		if err := ctx.Err(); err != nil {
			return res, err
		}
		res.CompletionTokens++
		if err := emit(engine.Token{ID: res.CompletionTokens, Piece: piece}); err != nil {
			if errors.Is(err, engine.ErrStop) {
				res.FinishReason = engine.FinishStop
				return res, nil
			}
			return res, err
		}
	}
	res.FinishReason = engine.FinishStop // end of generation token
	return res, nil
}

func (f *fakeEngine) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	return nil
}

func (f *fakeEngine) isClosed() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.closed
}

// writeGGUF writes a minimal valid GGUF file (metadata only) for the model
// file check, and returns its path.
func writeGGUF(t *testing.T, name string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name+".gguf")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	md := gguf.Metadata{{Key: "general.architecture", Value: gguf.String("llama")}}
	if err := gguf.Write(f, md, nil); err != nil {
		t.Fatal(err)
	}
	return path
}

// testConfig is a worker config for tests: a free loopback port, a tiny
// GGUF named "tiny", logs to the test log.
func testConfig(t *testing.T) Config {
	return Config{
		WorkerID:      "wk-test",
		ModelPath:     writeGGUF(t, "tiny"),
		Addr:          "127.0.0.1:0",
		ShutdownGrace: 10 * time.Second,
		Logger:        slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// running is a worker started by startWorker.
type running struct {
	w      *Worker
	url    string
	client *http.Client
	cancel context.CancelFunc
	done   chan error // Run's result
}

// startWorker runs a worker serving eng and waits until it is ready. The
// worker is stopped when the test ends.
func startWorker(t *testing.T, cfg Config, eng engine.Engine) *running {
	t.Helper()
	r := startWorkerWith(t, cfg, func(context.Context, engine.Options, *slog.Logger) (engine.Engine, error) { return eng, nil })
	select {
	case <-r.w.Ready():
	case err := <-r.done:
		t.Fatalf("worker stopped before ready: %v", err)
	}
	return r
}

// startWorkerWith runs a worker with loader and waits until it listens.
func startWorkerWith(t *testing.T, cfg Config, loader Loader) *running {
	t.Helper()
	w, err := New(cfg, loader)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{w: w, cancel: cancel, done: make(chan error, 1),
		client: &http.Client{Transport: &http.Transport{}, Timeout: 30 * time.Second}}
	go func() { r.done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-r.done:
		case <-time.After(30 * time.Second):
			t.Error("worker did not stop within 30s")
		}
		r.client.CloseIdleConnections()
	})
	select {
	case <-w.Listening():
	case err := <-r.done:
		r.done <- err
		return r
	}
	r.url = w.URL()
	return r
}

// stop cancels Run's context and returns Run's result.
func (r *running) stop(t *testing.T) error {
	t.Helper()
	r.cancel()
	return r.wait(t)
}

// wait returns Run's result, once.
func (r *running) wait(t *testing.T) error {
	t.Helper()
	select {
	case err := <-r.done:
		r.done <- err // for the cleanup
		return err
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return within 30s")
		return nil
	}
}

// post sends a JSON body and returns the response.
func (r *running) post(t *testing.T, ctx context.Context, path, body string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if tok := r.w.cfg.Token; tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	res, err := r.client.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	return res
}

// postJSON posts body and decodes the answer into out; it returns the status.
func (r *running) postJSON(t *testing.T, path, body string, out any) (int, http.Header) {
	t.Helper()
	res := r.post(t, context.Background(), path, body)
	defer res.Body.Close()
	data, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			t.Fatalf("POST %s: decode %q: %v", path, data, err)
		}
	}
	return res.StatusCode, res.Header
}

// health reads GET /health.
func (r *running) health(t *testing.T) Health {
	t.Helper()
	res, err := r.client.Get(r.url + "/health")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var h Health
	if err := json.NewDecoder(res.Body).Decode(&h); err != nil {
		t.Fatal(err)
	}
	return h
}

// waitFor spins until cond holds. It yields instead of sleeping: the
// conditions are reached by other goroutines within moments.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		runtime.Gosched()
	}
}

// sseReader reads the events of a stream one at a time.
type sseReader struct {
	t  *testing.T
	br *bufio.Reader
}

func newSSEReader(t *testing.T, body io.Reader) *sseReader {
	return &sseReader{t: t, br: bufio.NewReader(body)}
}

// next returns the data of the next event ("" at the end of the stream).
func (s *sseReader) next() string {
	s.t.Helper()
	line, err := s.br.ReadString('\n')
	if err == io.EOF && line == "" {
		return ""
	}
	if err != nil {
		s.t.Fatalf("reading stream: %v", err)
	}
	data, ok := strings.CutPrefix(strings.TrimSuffix(line, "\n"), "data: ")
	if !ok {
		s.t.Fatalf("stream line %q is not a data line", line)
	}
	if blank, err := s.br.ReadString('\n'); err != nil || blank != "\n" {
		s.t.Fatalf("event %q not followed by a blank line (%q, %v)", data, blank, err)
	}
	return data
}

// nextJSON decodes the next event into v.
func (s *sseReader) nextJSON(v any) {
	s.t.Helper()
	data := s.next()
	if err := json.Unmarshal([]byte(data), v); err != nil {
		s.t.Fatalf("event %q: %v", data, err)
	}
}
