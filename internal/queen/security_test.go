package queen

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode"

	"github.com/apiary-llm/apiary/internal/api"
)

// The queen calls only URLs it checked: a registered endpoint or a
// worker's uri with a query, fragment, user info, path or another scheme
// is refused with 400, and so are worker tokens for workers a heartbeat
// does not list.
func TestForgedURLsAreRefused(t *testing.T) {
	x := startQueen(t, sqliteDir(t), "")
	for _, ep := range []string{"http://127.0.0.1:1/?", "http://127.0.0.1:1?x=", "http://u:p@127.0.0.1:1", "http://127.0.0.1:1#",
		"http://127.0.0.1:1/v2", "file:///etc/passwd", "http://evil\x1b[2J:1"} {
		status, body := x.do("POST", "/v2/pools/register", "", api.RegisterPool{PoolID: "p", Endpoint: ep})
		if status != http.StatusBadRequest || strings.ContainsRune(string(body), 0x1b) {
			t.Errorf("register at %q: %d %s", ep, status, body)
		}
	}
	x.register("a")
	now := time.Now().UTC()
	w := api.Worker{WorkerID: "w1", ModelRef: "tiny", URI: "http://127.0.0.1:1/?steal=", Status: "ready", StartedAt: now}
	// A bad entry is refused alone, named in the answer.
	if status, body := x.do("POST", "/v2/pools/a/heartbeat", "", api.Heartbeat{Workers: []api.Worker{w}}); status != 200 ||
		!strings.Contains(string(body), `"refused":[{"worker_id":"w1"`) || !strings.Contains(string(body), "query") {
		t.Errorf("heartbeat with a worker uri with a query: %d %s", status, body)
	}
	ev := api.WorkerEvent{PoolID: "a", WorkerID: "w1", From: "starting", To: "ready", Reason: "x", At: now, Worker: w}
	if status, body := x.do("POST", "/v2/internal/workers/events", "", ev); status != 400 {
		t.Errorf("event with a worker uri with a query: %d %s", status, body)
	}
	w.URI = "http://127.0.0.1:1"
	hb := api.Heartbeat{Workers: []api.Worker{w}, WorkerTokens: map[string]string{"w2": "token-0123456789"}}
	if status, body := x.do("POST", "/v2/pools/a/heartbeat", "", hb); status != 200 || !strings.Contains(string(body), `"refused":[{"worker_id":"w2"`) {
		t.Errorf("a token for an unlisted worker: %d %s", status, body)
	}
	hb.WorkerTokens = map[string]string{"w1": "bad token\n"}
	if status, body := x.do("POST", "/v2/pools/a/heartbeat", "", hb); status != 200 || !strings.Contains(string(body), `"refused":[{"worker_id":"w1"`) {
		t.Errorf("a token with a newline: %d %s", status, body)
	}
	hb.WorkerTokens = map[string]string{"w1": "token-0123456789"}
	if status, body := x.do("POST", "/v2/pools/a/heartbeat", "", hb); status != 200 {
		t.Errorf("a good heartbeat: %d %s", status, body)
	}
	// The token never shows in a listing.
	for _, path := range []string{"/v2/pools", "/v2/pools/a", "/api/admin/workers", "/api/admin/audit"} {
		if _, body := x.do("GET", path, "", nil); strings.Contains(string(body), "token-0123456789") {
			t.Errorf("GET %s shows a worker token: %s", path, body)
		}
	}
}

// readyWithToken reports pool's worker ready at uri with its own token.
func (x *tq) readyWithToken(pool, uri, token string) string {
	x.t.Helper()
	resp := x.start("tiny", pool)
	now := time.Now().UTC()
	ack := x.event(api.WorkerEvent{PoolID: pool, WorkerID: resp.Worker.WorkerID, LifecycleID: resp.LifecycleID, From: "starting", To: "ready",
		Reason: "test", At: now, WorkerToken: token,
		Worker: api.Worker{WorkerID: resp.Worker.WorkerID, LifecycleID: resp.LifecycleID, ModelRef: "tiny", URI: uri, Status: "ready", PID: 1, StartedAt: now}})
	if !ack.Applied {
		x.t.Fatalf("ready event not applied: %+v", ack)
	}
	return resp.LifecycleID
}

// The queen sends each worker its own token, and passes on only what is
// an OpenAI answer: a page, a redirect or a body of another shape from a
// worker fails that worker's attempt, and never becomes the client's
// answer.
func TestRelayUsesTheWorkersTokenAndChecksItsAnswer(t *testing.T) {
	var stolen atomic.Bool
	elsewhere := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { stolen.Store(true) }))
	defer elsewhere.Close()
	var mode atomic.Value
	mode.Store("ok")
	worker := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer tok-0123456789abcdef" {
			http.Error(w, `{"error":{"code":"unauthorized","message":"token"}}`, http.StatusUnauthorized)
			return
		}
		switch mode.Load() {
		case "ok":
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"id":"c","object":"text_completion","choices":[{"text":"hi","index":0,"finish_reason":"length"}]}`)
		case "html":
			w.Header().Set("Content-Type", "text/html")
			w.WriteHeader(http.StatusNotFound)
			io.WriteString(w, "<html><script>alert(1)</script></html>")
		case "html200":
			w.Header().Set("Content-Type", "text/html")
			io.WriteString(w, "<html>phish</html>")
		case "redirect":
			http.Redirect(w, r, elsewhere.URL+"/steal", http.StatusTemporaryRedirect)
		}
	}))
	defer worker.Close()
	x, _ := routeQueen(t, map[string][]api.Model{"http://hive-a": {tinyModel}}, func(c *Config) { c.Routing.QueueTimeout = 2 * time.Second })
	x.registerAt("a", "http://hive-a")
	x.readyWithToken("a", worker.URL, "tok-0123456789abcdef")

	body := `{"model":"tiny","prompt":"hi","max_tokens":2}`
	if status, b := x.do("POST", "/v1/completions", "", body); status != 200 || !strings.Contains(string(b), `"hi"`) {
		t.Fatalf("with the worker's token: %d %s\n%s", status, b, x.logs.String())
	}
	for _, m := range []string{"html", "html200", "redirect"} {
		mode.Store(m)
		// The only worker failed: no other can be tried (502, or 504
		// once the queue wait for another ends), and the client gets the
		// queen's error naming the worker's answer, never the answer.
		status, b := x.do("POST", "/v1/completions", "", body)
		if (status != http.StatusBadGateway && status != http.StatusGatewayTimeout) || strings.Contains(string(b), "<html") ||
			strings.Contains(string(b), "phish") || !strings.Contains(string(b), "OpenAI") {
			t.Errorf("worker answering %s: %d %s, want the queen's error", m, status, b)
		}
	}
	if stolen.Load() {
		t.Error("the queen followed the worker's redirect")
	}
}

// A hive's error body reaches the queen's errors (and so its audit log and
// clients) bounded and printable; a body that is not the error shape is
// not passed on at all.
func TestHiveErrorBodiesAreBounded(t *testing.T) {
	huge := `{"error":{"code":"x\u001b[2J","message":"` + strings.Repeat("A\u001b]0;pwned\u0007", 100_000) + `"}}`
	var body atomic.Value
	body.Store(huge)
	hive := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusInternalServerError)
		io.WriteString(w, body.Load().(string))
	}))
	defer hive.Close()
	c := NewHTTPHiveClient("", 5*time.Second)
	_, err := c.StartWorker(context.Background(), hive.URL, api.StartWorkerRequest{ModelRef: "tiny"})
	var he *HiveError
	if !errors.As(err, &he) {
		t.Fatalf("err %v", err)
	}
	if len(he.Message) > api.MaxRemoteMessage+len("…") || strings.IndexFunc(he.Message+he.Code, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0 {
		t.Errorf("message of %d bytes, %q", len(he.Message), he.Code)
	}
	body.Store("<html>" + strings.Repeat("x", 10_000) + "</html>")
	_, err = c.StartWorker(context.Background(), hive.URL, api.StartWorkerRequest{ModelRef: "tiny"})
	if !errors.As(err, &he) || strings.Contains(he.Message, "html") || he.Code != "unexpected_answer" {
		t.Errorf("a page as the error: %v", err)
	}
}
