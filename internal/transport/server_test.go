package transport

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"testing"
	"time"
)

// A Server serves its handler until Stop; then Done is closed, Err is
// http.ErrServerClosed and nothing answers on the address.
func TestServerServesUntilStop(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	s := Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello") }), log)
	resp, err := http.Get("http://" + ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "hello" {
		t.Errorf("got %q, want hello", b)
	}
	select {
	case <-s.Done():
		t.Fatal("Done is closed while serving")
	default:
	}
	s.Stop(log, time.Second)
	select {
	case <-s.Done():
	default:
		t.Fatal("Done is open after Stop")
	}
	if !errors.Is(s.Err(), http.ErrServerClosed) {
		t.Errorf("Err after Stop: %v", s.Err())
	}
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	if _, err := c.Get("http://" + ln.Addr().String()); err == nil {
		t.Error("the server still answers after Stop")
	}
}
