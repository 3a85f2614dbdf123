package modelstore_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/gguf"
	"github.com/apiary-llm/apiary/internal/modelstore"
	"github.com/google/go-cmp/cmp"
)

// modelServer serves the test model and a few bad downloads.
func modelServer(t *testing.T, tiny []byte) *httptest.Server {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /models/tiny.gguf", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(len(tiny)))
		w.Write(tiny)
	})
	mux.HandleFunc("GET /chunked/tiny.gguf", func(w http.ResponseWriter, r *http.Request) {
		w.Write(tiny[:100])
		w.(http.Flusher).Flush() // no Content-Length: the total is unknown
		w.Write(tiny[100:])
	})
	mux.HandleFunc("GET /login.gguf", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Write([]byte("<!DOCTYPE html><p>please log in</p>"))
	})
	mux.HandleFunc("GET /cut.gguf", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(len(tiny)))
		w.Write(tiny[:len(tiny)/2]) // the connection ends early
	})
	mux.HandleFunc("GET /half.gguf", func(w http.ResponseWriter, r *http.Request) {
		w.Write(tiny[:len(tiny)/2]) // complete as far as HTTP knows
	})
	mux.HandleFunc("GET /v1.gguf", func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("GGUF\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"))
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

func TestPull(t *testing.T) {
	tiny := tinyModel(t)
	srv := modelServer(t, tiny)
	dir := t.TempDir()

	var calls []int64
	m, err := modelstore.Pull(t.Context(), dir, srv.URL+"/models/tiny.gguf?download=true", modelstore.PullOptions{
		Progress: func(p modelstore.Progress) {
			if p.Written > 0 && p.Total != int64(len(tiny)) {
				t.Errorf("progress total %d, want %d", p.Total, len(tiny))
			}
			calls = append(calls, p.Written)
		},
	})
	if err != nil {
		t.Fatalf("Pull: %v", err)
	}
	if m.Ref != "tiny" || m.Path != filepath.Join(dir, "tiny.gguf") || m.Size != int64(len(tiny)) || m.Info == nil || m.Info.Architecture != "llama" {
		t.Errorf("Pull returned %+v", m)
	}
	if len(calls) == 0 || calls[len(calls)-1] != int64(len(tiny)) {
		t.Errorf("progress calls %v, want the last at %d", calls, len(tiny))
	}
	got, err := os.ReadFile(m.Path)
	if err != nil || !bytes.Equal(got, tiny) {
		t.Errorf("the pulled file differs from the served one (%v)", err)
	}

	// Pulling it again is refused, unless overwriting.
	_, err = modelstore.Pull(t.Context(), dir, srv.URL+"/models/tiny.gguf", modelstore.PullOptions{})
	if !errors.Is(err, modelstore.ErrExists) {
		t.Errorf("second Pull = %v, want ErrExists", err)
	}
	if _, err := modelstore.Pull(t.Context(), dir, srv.URL+"/models/tiny.gguf", modelstore.PullOptions{Overwrite: true}); err != nil {
		t.Errorf("Pull with Overwrite: %v", err)
	}

	// Another name; the total is unknown without a Content-Length.
	var total int64
	m, err = modelstore.Pull(t.Context(), dir, srv.URL+"/chunked/tiny.gguf", modelstore.PullOptions{
		Ref: "tiny-copy", Progress: func(p modelstore.Progress) { total = p.Total },
	})
	if err != nil || m.Ref != "tiny-copy" || total != -1 {
		t.Errorf("Pull as tiny-copy = %+v, %v (total %d); want tiny-copy and total -1", m, err, total)
	}
	if diff := cmp.Diff([]string{"tiny-copy.gguf", "tiny.gguf"}, dirEntries(t, dir)); diff != "" {
		t.Errorf("directory entries (-want +got):\n%s", diff)
	}
}

func TestPullErrors(t *testing.T) {
	srv := modelServer(t, tinyModel(t))
	canceled, cancel := context.WithCancel(t.Context())
	cancel()
	tests := []struct {
		name string
		ctx  context.Context
		url  string
		opts modelstore.PullOptions
		err  error
		msg  string
	}{
		{"404", t.Context(), srv.URL + "/missing.gguf", modelstore.PullOptions{}, modelstore.ErrDownload,
			"GET " + srv.URL + "/missing.gguf: 404 Not Found"},
		{"html", t.Context(), srv.URL + "/login.gguf", modelstore.PullOptions{}, gguf.ErrNotGGUF,
			srv.URL + `/login.gguf: not a GGUF file (magic "<!DO"); the server sent text/html; charset=utf-8`},
		{"connection cut", t.Context(), srv.URL + "/cut.gguf", modelstore.PullOptions{RetryDelay: time.Millisecond}, modelstore.ErrDownload,
			"GET " + srv.URL + "/cut.gguf: after "},
		{"truncated model", t.Context(), srv.URL + "/half.gguf", modelstore.PullOptions{}, gguf.ErrTruncated,
			srv.URL + "/half.gguf: truncated in the data of tensor"},
		{"old version", t.Context(), srv.URL + "/v1.gguf", modelstore.PullOptions{}, gguf.ErrVersion,
			srv.URL + "/v1.gguf: GGUF version 1 is not supported"},
		{"scheme", t.Context(), "ftp://example.com/x.gguf", modelstore.PullOptions{}, modelstore.ErrBadURL,
			"only http and https URLs and hf://ORG/REPO:QUANT refs can be pulled"},
		{"no name in URL", t.Context(), srv.URL + "/", modelstore.PullOptions{}, modelstore.ErrBadRef,
			"cannot name the model after the URL's file name"},
		{"bad name", t.Context(), srv.URL + "/models/tiny.gguf", modelstore.PullOptions{Ref: "../up"}, modelstore.ErrBadRef,
			`invalid model name "../up"`},
		{"canceled", canceled, srv.URL + "/models/tiny.gguf", modelstore.PullOptions{}, context.Canceled, "context canceled"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			_, err := modelstore.Pull(tt.ctx, dir, tt.url, tt.opts)
			if !errors.Is(err, tt.err) || !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("Pull = %v, want %v saying %q", err, tt.err, tt.msg)
			}
			var want []string
			if tt.name == "connection cut" {
				want = []string{"cut.gguf.partial"} // kept for the next pull to resume
			}
			if diff := cmp.Diff(want, dirEntries(t, dir)); diff != "" {
				t.Errorf("the models dir after a failed pull (-want +got):\n%s", diff)
			}
		})
	}
}

func TestRefFromURL(t *testing.T) {
	tests := map[string]string{
		"https://huggingface.co/org/repo/resolve/main/Qwen2.5-0.5B-Instruct-Q4_K_M.gguf?download=true": "Qwen2.5-0.5B-Instruct-Q4_K_M",
		"http://127.0.0.1:8000/tiny":      "tiny",
		"http://127.0.0.1:8000/a/b.gguf/": "b",
	}
	for in, want := range tests {
		if got, err := modelstore.RefFromURL(in); got != want || err != nil {
			t.Errorf("RefFromURL(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}
