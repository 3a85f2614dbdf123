package front

import (
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/apiary-llm/apiary/internal/testbin"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		testbin.Cleanup()
		os.Exit(code)
	}))
}

const waitLimit = 20 * time.Second

func TestValidateNamesEveryProblem(t *testing.T) {
	err := Config{EngineURL: "http://10.0.0.1:80", HealthPath: "health", Slots: -1, StopWait: -time.Second,
		CallbackURL: "http://127.0.0.1:1/cb", Token: "worker-token\n", EngineKey: "   "}.withDefaults().Validate()
	if !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("err = %v", err)
	}
	for _, w := range []string{"Listener is required", "Engine is empty", `EngineURL "http://10.0.0.1:80" must be http://LOOPBACK-HOST:PORT`,
		`HealthPath "health" must be a path`, "WorkerID is required", "StopWait must be positive", "Slots must be at least 1",
		"Token has a newline at byte 13", "EngineKey is blank"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q lacks %q", err, w)
		}
	}
}

// startFront runs a front without a token or callback on a loopback port,
// with the fake engine in mode, and waits until it serves.
func startFront(t *testing.T, mode string, extra ...string) (f *Front, url string, ran chan error) {
	t.Helper()
	return startFrontWithToken(t, "", mode, extra...)
}

// startFrontWithToken is startFront with the worker's token token ("":
// none).
func startFrontWithToken(t *testing.T, token, mode string, extra ...string) (f *Front, url string, ran chan error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := testbin.FreePort(t)
	f, err = New(Config{Listener: ln, ModelRef: "tiny", Token: token, EngineURL: "http://127.0.0.1:" + strconv.Itoa(port), ShutdownGrace: 5 * time.Second,
		StopWait: time.Second, Engine: Command{Path: testbin.FakeEngine(t), Args: append([]string{"-port", strconv.Itoa(port), "-mode", mode}, extra...),
			Env: os.Environ()}})
	if err != nil {
		t.Fatal(err)
	}
	ran = make(chan error, 1)
	go func() { ran <- f.Run(t.Context()) }()
	url = "http://" + ln.Addr().String()
	t.Cleanup(func() {
		f.RequestShutdown()
		select {
		case <-ran:
		case <-time.After(waitLimit):
			t.Error("the front did not stop")
		}
	})
	waitHealth(t, url, func(h healthBody) bool { return h.Status == StatusReady })
	return f, url, ran
}

// waitHealth polls the front's /health until ok says so.
func waitHealth(t *testing.T, url string, ok func(healthBody) bool) healthBody {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for {
		var h healthBody
		resp, err := http.Get(url + "/health")
		if err == nil {
			err = json.NewDecoder(resp.Body).Decode(&h)
			resp.Body.Close()
		}
		if err == nil && ok(h) {
			return h
		}
		if time.Now().After(deadline) {
			t.Fatalf("health never as wanted: last %+v, %v", h, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A request in flight shows on /health and sets last_request_at; a
// shutdown then refuses new requests with 503 draining, lets the one in
// flight finish, stops the engine and ends Run with nil.
func TestFrontCountsInFlightAndDrains(t *testing.T) {
	f, url, ran := startFront(t, "slow=500ms")
	if h := waitHealth(t, url, func(healthBody) bool { return true }); h.InFlight != 0 || h.LastRequestAt != nil {
		t.Errorf("health before any request: %+v", h)
	}
	done := make(chan string, 1)
	go func() {
		resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(`{"messages":[]}`))
		if err != nil {
			done <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		done <- resp.Status + " " + string(b)
	}()
	h := waitHealth(t, url, func(h healthBody) bool { return h.InFlight == 1 })
	if h.Status != StatusBusy || h.LastRequestAt == nil {
		t.Errorf("health with a request in flight: %+v", h)
	}
	f.RequestShutdown()
	waitHealth(t, url, func(h healthBody) bool { return h.Status == StatusDraining })
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(b), `"draining"`) {
		t.Errorf("a request while draining: %d %s", resp.StatusCode, b)
	}
	if got := <-done; !strings.HasPrefix(got, "200 OK") || !strings.Contains(got, "fake engine answer") {
		t.Errorf("the request in flight: %s", got)
	}
	select {
	case err := <-ran:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
		ran <- err // for the cleanup
	case <-time.After(waitLimit):
		t.Fatal("Run did not return")
	}
}

// An engine that exits on its own ends Run at once with its exit.
func TestFrontEndsWithItsEngine(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "engine.pid")
	_, _, ran := startFront(t, "", "-pid-file", pidFile)
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	engine, err := strconv.Atoi(string(b))
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(engine, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-ran:
		var ee *EngineExitError
		if !errors.As(err, &ee) || ee.Exit.Signal != 9 {
			t.Errorf("Run: %v, want the engine's SIGKILL", err)
		}
		ran <- err // for the cleanup
	case <-time.After(waitLimit):
		t.Fatal("Run did not return")
	}
}

// The front admits requests as the built-in worker does: a page of
// another origin is refused.
func TestFrontRefusesForeignOrigins(t *testing.T) {
	_, url, _ := startFront(t, "")
	req, err := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(`{"messages":[]}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Origin", "https://evil.example")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("a request from another origin: %d %s, want 403", resp.StatusCode, b)
	}
}

// Only a health probe (GET or HEAD /health) goes without the worker's
// token. A POST /health was once admitted like the probe and relayed to
// the engine with the engine's key, counted as a request: anyone who
// reached the worker could keep it from ever going idle.
func TestFrontHealthNeedsTheTokenButForAProbe(t *testing.T) {
	const token = "worker-token-0123456789"
	_, url, _ := startFrontWithToken(t, token, "")
	for _, c := range []struct {
		method, bearer string
		want           int
	}{
		{http.MethodGet, "", http.StatusOK},
		{http.MethodHead, "", http.StatusOK},
		{http.MethodPost, "", http.StatusUnauthorized},
		{http.MethodPut, "", http.StatusUnauthorized},
		{http.MethodDelete, "", http.StatusUnauthorized},
		{http.MethodPost, "wrong-token-0123456789", http.StatusUnauthorized},
	} {
		req, err := http.NewRequest(c.method, url+"/health", strings.NewReader(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		if c.bearer != "" {
			req.Header.Set("Authorization", "Bearer "+c.bearer)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Errorf("%s /health (bearer %q): %d %s, want %d", c.method, c.bearer, resp.StatusCode, b, c.want)
		}
	}
	if h := waitHealth(t, url, func(healthBody) bool { return true }); h.LastRequestAt != nil {
		t.Errorf("refused requests reached the engine: last_request_at %v", h.LastRequestAt)
	}
}

// The front relays a request's body while the engine's answer streams
// back: net/http's server would otherwise consume and close the body
// when the answer's headers go out, and the relay still reading it
// (it reads past the body's last byte to see its end) had its engine
// connection closed under the stream. Here the client holds back the
// body's end until the first chunk arrived, and the engine answers
// before the end: without full duplex the headers never leave the front.
func TestFrontStreamsWhileTheBodyIsOpen(t *testing.T) {
	_, url, _ := startFront(t, "answer-early")
	pr, pw := io.Pipe()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url+"/v1/chat/completions", pr)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	defer pw.Close()
	got := make(chan *http.Response, 1)
	failed := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			failed <- err
			return
		}
		got <- resp
	}()
	if _, err := io.WriteString(pw, `{"model":"tiny","stream":true,"messages":[]}`); err != nil {
		t.Fatal(err)
	}
	var resp *http.Response
	select {
	case resp = <-got:
	case err := <-failed:
		t.Fatalf("no answer while the body was open: %v", err)
	case <-time.After(waitLimit):
		pw.CloseWithError(errors.New("no answer"))
		t.Fatalf("no answer within %s while the body was open", waitLimit)
	}
	defer resp.Body.Close()
	first := make([]byte, 6)
	if _, err := io.ReadFull(resp.Body, first); err != nil || string(first) != "data: " {
		t.Fatalf("first chunk %q: %v", first, err)
	}
	pw.Close()
	rest, err := io.ReadAll(resp.Body)
	if err != nil || !strings.Contains(string(rest), "answer") || !strings.HasSuffix(string(rest), "data: [DONE]\n\n") {
		t.Errorf("the stream after the body ended: %q, %v", rest, err)
	}
}
