package testbin

import (
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
)

// OtherQueen is an HTTP server that answers GET /health as a queen does
// and every other request with 401, as a queen with tokens that the
// person running the keeper does not have: a queen somebody else started
// at the default address. It records what it is asked.
type OtherQueen struct {
	URL string

	mu  sync.Mutex
	got []string // "METHOD /path", guarded by mu
}

// StartOtherQueen runs an OtherQueen until the test ends.
func StartOtherQueen(t testing.TB) *OtherQueen {
	t.Helper()
	q := &OtherQueen{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q.mu.Lock()
		q.got = append(q.got, r.Method+" "+r.URL.Path)
		q.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path == "/health" {
			io.WriteString(w, `{"status":"ok","version":"someone else's"}`)
			return
		}
		w.WriteHeader(http.StatusUnauthorized)
		io.WriteString(w, `{"error":{"code":"unauthorized","message":"missing or invalid bearer token"}}`)
	}))
	t.Cleanup(srv.Close)
	q.URL = srv.URL
	return q
}

// Requests are the requests it got, in order.
func (q *OtherQueen) Requests() []string {
	q.mu.Lock()
	defer q.mu.Unlock()
	return slices.Clone(q.got)
}
