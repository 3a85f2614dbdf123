package routing

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/openai"
	"github.com/apiary-llm/apiary/internal/registry"
)

// workerPlane is rowsPlane with one worker of every model, at uri.
type workerPlane struct {
	*rowsPlane
	uri string
}

func (p *workerPlane) Candidates(model, _ string) []Candidate {
	return []Candidate{{Key: WorkerKey{"a", "w-" + model}, LifecycleID: "wk-" + model, URI: p.uri}}
}
func (p *workerPlane) Running(string, string, string) bool { return true }

// A chat's body may be larger than MaxBodyBytes when its model sees
// (a picture inline), up to openai.MaxImageBodyBytes: a body just over
// MaxBodyBytes is 413 for a model that takes no images, saying so, and
// reaches the worker for one that does, through each API that carries
// images; one over the image bound is 413 for any model.
func TestChatBodyLimitFollowsTheModel(t *testing.T) {
	var served atomic.Int64
	worker := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		served.Store(n)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"x","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"a bee"},"finish_reason":"stop"}],`+
			`"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
	}))
	defer worker.Close()
	const maxBody = 64 << 10
	rp := newRowsPlane(nil, false)
	models := []api.Model{{Ref: "seer", Vision: true}, {Ref: "blind"}}
	s, err := New(Config{Logger: slog.New(slog.DiscardHandler), MaxBodyBytes: maxBody,
		Models: &listHive{models: map[string][]api.Model{"http://a": models}}}, &workerPlane{rowsPlane: rp, uri: worker.URL})
	if err != nil {
		t.Fatal(err)
	}
	s.catalog.ensure(t.Context(), []registry.Pool{rp.pool}, "seer")
	mux := http.NewServeMux()
	s.Routes(mux)

	// bodies are the requests of each API that carries a picture, padded
	// (JSON's spaces) to n bytes.
	pad := func(body string, n int) string { return body[:len(body)-1] + strings.Repeat(" ", n-len(body)) + "}" }
	bodies := map[string]func(model string) string{
		"/v1/chat/completions": func(m string) string {
			return `{"model":"` + m + `","messages":[{"role":"user","content":"hi"}]}`
		},
		"/v1/messages": func(m string) string {
			return `{"model":"` + m + `","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`
		},
		"/v1/responses": func(m string) string { return `{"model":"` + m + `","input":"hi","store":false}` },
		"/api/chat": func(m string) string {
			return `{"model":"` + m + `","stream":false,"messages":[{"role":"user","content":"hi"}]}`
		},
		"/api/generate": func(m string) string { return `{"model":"` + m + `","stream":false,"prompt":"hi"}` },
	}
	for path, body := range bodies {
		for _, tc := range []struct {
			model string
			size  int
			want  int
			says  string // in the 413's message
		}{
			{"blind", maxBody + 1, http.StatusRequestEntityTooLarge, "larger than 64 KiB, the limit of a model that takes no images"},
			{"seer", maxBody + 1, http.StatusOK, ""},
			{"seer", openai.MaxImageBodyBytes + 1, http.StatusRequestEntityTooLarge, "larger than 32 MiB, the limit with images"},
			{"blind", openai.MaxImageBodyBytes + 1, http.StatusRequestEntityTooLarge, "larger than 32 MiB, the limit with images"},
		} {
			served.Store(0)
			rec := httptest.NewRecorder()
			mux.ServeHTTP(rec, httptest.NewRequest("POST", path, strings.NewReader(pad(body(tc.model), tc.size))))
			var out struct {
				Error any `json:"error"`
			}
			_ = json.Unmarshal(rec.Body.Bytes(), &out)
			msg, _ := json.Marshal(out.Error)
			if rec.Code != tc.want || !strings.Contains(string(msg), tc.says) {
				t.Errorf("%s, %s, %d bytes: %d %.300s; want %d saying %q", path, tc.model, tc.size, rec.Code, rec.Body, tc.want, tc.says)
			}
			if got := served.Load() > 0; got != (tc.want == http.StatusOK) {
				t.Errorf("%s, %s, %d bytes: the worker got %d bytes", path, tc.model, tc.size, served.Load())
			}
		}
	}

	// Embeddings keep their own larger limit for every model.
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest("POST", "/v1/embeddings", strings.NewReader(pad(`{"model":"blind","input":"hi"}`, maxBody+1))))
	if rec.Code != http.StatusOK {
		t.Errorf("embeddings over MaxBodyBytes: %d %.300s; want 200 (their limit is %d)", rec.Code, rec.Body, openai.MaxEmbeddingBodyBytes)
	}
}

// An operator's MaxBodyBytes above the image bound is every chat's limit.
func TestBodyLimitAboveTheImageBound(t *testing.T) {
	s := &Service{cfg: Config{MaxBodyBytes: openai.MaxImageBodyBytes + 1<<20}}
	for _, sees := range []bool{false, true} {
		if got, why := s.bodyLimit("/v1/chat/completions", sees); got != s.cfg.MaxBodyBytes || why != "the limit" {
			t.Errorf("sees %v: %d (%s), want %d", sees, got, why, s.cfg.MaxBodyBytes)
		}
	}
}
