package rpc

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestDo(t *testing.T) {
	var got struct {
		method, auth, ctype, body string
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got.method, got.auth, got.ctype, got.body = r.Method, r.Header.Get("Authorization"), r.Header.Get("Content-Type"), string(b)
		switch r.URL.Path {
		case "/ok":
			_, _ = io.WriteString(w, `{"n":7}`)
		case "/refused":
			w.WriteHeader(http.StatusConflict)
			_, _ = io.WriteString(w, `{"error":{"code":"pool_draining","message":"pool a is draining\u001b[2J"}}`)
		case "/page":
			w.WriteHeader(http.StatusBadGateway)
			_, _ = io.WriteString(w, "<html>"+strings.Repeat("x", 10000))
		case "/big":
			_, _ = io.WriteString(w, `{"n":`+strings.Repeat("1", 100)+`}`)
		case "/garbage":
			_, _ = io.WriteString(w, `not json`)
		}
	}))
	defer srv.Close()
	hc := srv.Client()

	var out struct{ N int }
	if err := Do(t.Context(), hc, Call{URL: srv.URL + "/ok", Token: "tok", In: map[string]int{"a": 1}, Out: &out}); err != nil || out.N != 7 {
		t.Fatalf("ok: %v %+v", err, out)
	}
	if got.method != http.MethodPost || got.auth != "Bearer tok" || got.ctype != "application/json" || got.body != `{"a":1}` {
		t.Errorf("the request went as %+v", got)
	}
	if err := Do(t.Context(), hc, Call{URL: srv.URL + "/ok"}); err != nil || got.method != http.MethodGet || got.auth != "" || got.ctype != "" {
		t.Errorf("a GET without token or body: %v, went as %+v", err, got)
	}

	err := Do(t.Context(), hc, Call{Method: http.MethodPost, URL: srv.URL + "/refused"})
	var se *StatusError
	if !errors.As(err, &se) || se.Status != http.StatusConflict || se.Code != "pool_draining" || strings.ContainsRune(se.Message, 0x1b) {
		t.Errorf("refused: %v (%+v): the status, code and a printable message", err, se)
	}
	if got.ctype != "application/json" {
		t.Errorf("a POST without a body is still declared JSON (got %q)", got.ctype)
	}
	err = Do(t.Context(), hc, Call{URL: srv.URL + "/page"})
	if !errors.As(err, &se) || se.Code != "unexpected_answer" || len(se.Error()) > 1024 {
		t.Errorf("a page instead of an error: %v", err)
	}
	if err := Do(t.Context(), hc, Call{URL: srv.URL + "/big", Out: &out, MaxAnswer: 16}); !errors.Is(err, ErrUnreachable) {
		t.Errorf("an answer over MaxAnswer is cut, and then not the JSON asked for: %v", err)
	}
	if err := Do(t.Context(), hc, Call{URL: srv.URL + "/garbage", Out: &out}); !errors.Is(err, ErrUnreachable) {
		t.Errorf("garbage: %v", err)
	}
	srv.Close()
	if err := Do(t.Context(), hc, Call{URL: srv.URL + "/ok"}); !errors.Is(err, ErrUnreachable) {
		t.Errorf("a closed server: %v", err)
	}
}

// NetReason names a failed connection's cause without its address.
func TestNetReason(t *testing.T) {
	_, err := http.Get("http://127.0.0.1:1/")
	if why, ok := NetReason(err); !ok || why != "connection refused" {
		t.Errorf("refused: %q %v (from %v)", why, ok, err)
	}
	if why, ok := NetReason(fmt.Errorf("read: %w", io.ErrUnexpectedEOF)); !ok || why != "the connection closed" {
		t.Errorf("EOF: %q %v", why, ok)
	}
	if _, ok := NetReason(errors.New("something else")); ok {
		t.Error("an error that is no network failure has a reason")
	}
}
