package openai

import (
	"bufio"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestSSEWriterFraming(t *testing.T) {
	rec := httptest.NewRecorder()
	s := NewSSEWriter(rec)
	if s.Started() {
		t.Fatal("Started before anything was written")
	}
	if err := s.Event(map[string]string{"text": "a\nb"}); err != nil {
		t.Fatal(err)
	}
	if err := s.Event(struct {
		N int `json:"n"`
	}{2}); err != nil {
		t.Fatal(err)
	}
	if err := s.Done(); err != nil {
		t.Fatal(err)
	}
	if !s.Started() {
		t.Error("not Started after writing")
	}
	want := "data: {\"text\":\"a\\nb\"}\n\ndata: {\"n\":2}\n\ndata: [DONE]\n\n"
	if diff := cmp.Diff(want, rec.Body.String()); diff != "" {
		t.Errorf("body mismatch (-want +got):\n%s", diff)
	}
	if got := rec.Header().Get("Content-Type"); got != "text/event-stream" {
		t.Errorf("Content-Type = %q", got)
	}
	if got := rec.Header().Get("Cache-Control"); got != "no-cache" {
		t.Errorf("Cache-Control = %q", got)
	}
	if rec.Code != http.StatusOK || !rec.Flushed {
		t.Errorf("code %d flushed %v, want 200 and flushed", rec.Code, rec.Flushed)
	}
}

func TestSSEWriterErrorEvent(t *testing.T) {
	rec := httptest.NewRecorder()
	s := NewSSEWriter(rec)
	if err := s.Event(map[string]int{"a": 1}); err != nil {
		t.Fatal(err)
	}
	if err := s.Error(&Error{Status: http.StatusServiceUnavailable, Code: "shutting_down", Message: "bye"}); err != nil {
		t.Fatal(err)
	}
	want := "data: {\"a\":1}\n\n" +
		`data: {"error":{"code":"shutting_down","message":"bye","type":"server_error","param":null}}` + "\n\n"
	if diff := cmp.Diff(want, rec.Body.String()); diff != "" {
		t.Errorf("body mismatch (-want +got):\n%s", diff)
	}
}

// TestSSEWriterFlushesEachEvent reads a real HTTP stream and checks every
// event arrives before the handler writes the next one.
func TestSSEWriterFlushesEachEvent(t *testing.T) {
	next := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s := NewSSEWriter(w)
		for i := range 3 {
			if err := s.Event(map[string]int{"i": i}); err != nil {
				return
			}
			select {
			case <-next:
			case <-r.Context().Done():
				return
			}
		}
		_ = s.Done()
	}))
	defer srv.Close()

	res, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	br := bufio.NewReader(res.Body)
	for i := range 3 {
		line, err := readEvent(br)
		if err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
		if want := `data: {"i":` + string(rune('0'+i)) + `}`; line != want {
			t.Errorf("event %d = %q, want %q", i, line, want)
		}
		next <- struct{}{}
	}
	if line, err := readEvent(br); err != nil || line != "data: [DONE]" {
		t.Errorf("last event = %q, %v", line, err)
	}
}

// readEvent reads one "data: …" line and the blank line after it, failing
// instead of hanging if the server does not send it.
func readEvent(br *bufio.Reader) (string, error) {
	type result struct {
		line string
		err  error
	}
	ch := make(chan result, 1)
	go func() {
		line, err := br.ReadString('\n')
		if err == nil {
			var blank string
			blank, err = br.ReadString('\n')
			if err == nil && blank != "\n" {
				err = errors.New("event not followed by a blank line")
			}
		}
		ch <- result{strings.TrimSuffix(line, "\n"), err}
	}()
	select {
	case r := <-ch:
		return r.line, r.err
	case <-time.After(10 * time.Second):
		return "", errors.New("event was not flushed within 10s")
	}
}

func TestSSEWriterReportsWriteErrors(t *testing.T) {
	s := NewSSEWriter(failingWriter{httptest.NewRecorder()})
	if err := s.Event(1); err == nil {
		t.Error("Event on a broken connection returned nil")
	}
}

type failingWriter struct{ *httptest.ResponseRecorder }

func (f failingWriter) Write([]byte) (int, error) { return 0, io.ErrClosedPipe }

// TestSSEWriterEventTimeout checks a client that stops reading makes Event
// fail once the timeout passes, instead of blocking the handler forever.
func TestSSEWriterEventTimeout(t *testing.T) {
	result := make(chan error, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s := NewSSEWriter(w)
		s.SetEventTimeout(50 * time.Millisecond)
		big := strings.Repeat("x", 64<<10)
		for {
			if err := s.Event(big); err != nil {
				result <- err
				return
			}
		}
	}))
	defer srv.Close()
	res, err := http.Get(srv.URL) // and never read the body
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	select {
	case err := <-result:
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("Event failed with %v, want a deadline error", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Event still blocked 30s after the client stopped reading")
	}
}
