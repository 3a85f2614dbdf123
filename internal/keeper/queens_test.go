package keeper

import (
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/apiary-llm/apiary/internal/api"
)

// fakeQueens records, in order, which queen each request reached.
type fakeQueens struct {
	mu   sync.Mutex
	hits []string // "name METHOD path"
}

func (f *fakeQueens) hit(name string, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hits = append(f.hits, name+" "+r.Method+" "+r.URL.Path)
}

func (f *fakeQueens) took() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.hits...)
}

// active is a queen that answers: no rows, and a started worker.
func (f *fakeQueens) active(t *testing.T, name string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.hit(name, r)
		if r.URL.Path == "/health" {
			api.WriteJSON(w, http.StatusOK, api.Health{Status: "ok"})
			return
		}
		if r.Method == http.MethodPost {
			api.WriteJSON(w, http.StatusCreated, api.AdminWorkerResponse{LifecycleID: "wk-" + name})
			return
		}
		api.WriteJSON(w, http.StatusOK, api.LifecycleRowList{Workers: []api.LifecycleRow{}})
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// standby answers as a standby queen does (queen.standbyHandler), naming
// the active queen at *active.
func (f *fakeQueens) standby(t *testing.T, name string, active *string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.hit(name, r)
		if *active != "" {
			w.Header().Set(api.ActiveQueenHeader, *active)
		}
		w.Header().Set("Retry-After", "1")
		api.WriteJSON(w, http.StatusServiceUnavailable, map[string]any{"error": map[string]string{
			"code": "standby", "message": "this queen is a standby: another queen holds the database"}})
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// dropping takes a request and closes the connection without an answer,
// as a queen that dies while it serves it.
func (f *fakeQueens) dropping(t *testing.T, name string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.hit(name, r)
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			conn.Close()
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// refusing is a URL where nothing listens: the connection is refused.
func refusing(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := "http://" + ln.Addr().String()
	ln.Close()
	return u
}

func TestQueensRefusedIsSkippedForEveryRequest(t *testing.T) {
	f := &fakeQueens{}
	down, a := refusing(t), f.active(t, "a")
	// A queen whose certificate this keeper does not trust: the handshake
	// fails before the request is sent.
	untrusted := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { f.hit("untrusted", r) }))
	t.Cleanup(untrusted.Close)
	c := NewClient(down+","+a, "", "")
	if _, err := c.Workers(t.Context(), WorkerFilter{}); err != nil {
		t.Fatalf("list: %v", err)
	}
	// A POST too: a refused connection or a failed handshake sent
	// nothing.
	c = NewClient(down+","+untrusted.URL+","+a, "", "")
	if got, err := c.StartWorker(t.Context(), "tiny", "", nil, "test"); err != nil || got.LifecycleID != "wk-a" {
		t.Fatalf("start: %+v, %v", got, err)
	}
	if diff := cmp.Diff([]string{"a GET /api/admin/workers", "a POST /api/admin/workers"}, f.took()); diff != "" {
		t.Errorf("requests (-want +got):\n%s", diff)
	}
}

// A standby names the active queen: it is asked next, before the queens
// listed between, and a later call of the same client goes to it first.
func TestQueensStandbyPointsAtTheActive(t *testing.T) {
	f := &fakeQueens{}
	active := ""
	s := f.standby(t, "s", &active)
	b := f.active(t, "b")
	active = f.active(t, "a")
	c := NewClient(s+","+b+","+active, "", "")
	for range 2 {
		if _, err := c.StartWorker(t.Context(), "tiny", "", nil, "test"); err != nil {
			t.Fatal(err)
		}
	}
	want := []string{"s POST /api/admin/workers", "a POST /api/admin/workers", "a POST /api/admin/workers"}
	if diff := cmp.Diff(want, f.took()); diff != "" {
		t.Errorf("requests (-want +got):\n%s", diff)
	}
}

// The active queen a standby names is tried even when the list does not
// have it.
func TestQueensStandbyNamesAnUnlistedActive(t *testing.T) {
	f := &fakeQueens{}
	active := f.active(t, "a")
	s := f.standby(t, "s", &active)
	if _, err := NewClient(s, "", "").Workers(t.Context(), WorkerFilter{}); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"s GET /api/admin/workers", "a GET /api/admin/workers"}, f.took()); diff != "" {
		t.Errorf("requests (-want +got):\n%s", diff)
	}
}

func TestQueensAllDownNamesEveryQueenAndWhy(t *testing.T) {
	f := &fakeQueens{}
	none := ""
	down, s := refusing(t), f.standby(t, "s", &none)
	gone := refusing(t)
	named := gone
	s2 := f.standby(t, "s2", &named) // names a queen that is gone
	_, err := NewClient(down+","+s+","+s2, "", "").Workers(t.Context(), WorkerFilter{})
	if !errors.Is(err, ErrUnreachable) {
		t.Fatalf("got %v, want ErrUnreachable", err)
	}
	for _, want := range []string{
		down + ": connection refused",
		s + ": a standby, naming no active queen yet",
		s2 + ": a standby; the active queen is " + gone,
		gone + ": connection refused",
		"no active queen answers at --queen " + down + "," + s + "," + s2,
		"a standby takes over within seconds",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	_, err = NewClient(down+","+gone, "", "").Workers(t.Context(), WorkerFilter{})
	if !errors.Is(err, ErrUnreachable) || !strings.Contains(err.Error(), gone+": connection refused") || !strings.Contains(err.Error(), "start one with `apiary queen`") {
		t.Errorf("no queen answers: got %v", err)
	}
}

// A request that reached a queen which then gave no answer may have been
// carried out: one that changes something is not sent to another queen;
// a read is.
func TestQueensRequestThatMayHaveRunIsNotSentTwice(t *testing.T) {
	f := &fakeQueens{}
	d, a := f.dropping(t, "d"), f.active(t, "a")
	_, err := NewClient(d+","+a, "", "").StartWorker(t.Context(), "tiny", "", nil, "test")
	if !errors.Is(err, ErrUnreachable) || !strings.Contains(err.Error(), "it was not sent to another queen") || !strings.Contains(err.Error(), d) {
		t.Fatalf("start: got %v, want an error that it went to %s and no further", err, d)
	}
	if _, err := NewClient(d+","+a, "", "").Workers(t.Context(), WorkerFilter{}); err != nil {
		t.Fatalf("list: %v", err)
	}
	want := []string{"d POST /api/admin/workers", "d GET /api/admin/workers", "a GET /api/admin/workers"}
	if diff := cmp.Diff(want, f.took()); diff != "" {
		t.Errorf("requests (-want +got):\n%s", diff)
	}
}

func TestQueensMalformedListIsUsageError(t *testing.T) {
	for list, want := range map[string]string{
		"http://127.0.0.1:1,,http://127.0.0.1:2": "element 2 is empty",
		"http://127.0.0.1:1,ftp://x":             `element 2 "ftp://x": scheme must be http or https`,
	} {
		_, err := NewClient(list, "", "").Workers(t.Context(), WorkerFilter{})
		if !errors.Is(err, ErrUsage) || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: got %v, want a usage error with %q", list, err, want)
		}
	}
}

// `apiary infer` with a list asks the active queen (persistent mode);
// with queens that all stand by it starts no queen of its own beside
// them; with none answering it is ephemeral mode.
func TestInferDetectFollowsTheActiveQueen(t *testing.T) {
	f := &fakeQueens{}
	active := f.active(t, "a")
	s := f.standby(t, "s", &active)
	detect := func(list string) (string, string, error) {
		k, err := NewInfer(InferConfig{QueenURL: list, Model: "tiny", Prompt: "hi"})
		if err != nil {
			t.Fatal(err)
		}
		return k.detect(t.Context())
	}
	if mode, url, err := detect(refusing(t) + "," + s); err != nil || mode != ModePersistent || url != active {
		t.Errorf("refused, standby: %s at %q, %v; want persistent at %s", mode, url, err, active)
	}
	none := ""
	s2 := f.standby(t, "s2", &none)
	if mode, _, err := detect(s2); !errors.Is(err, ErrUnreachable) || !strings.Contains(err.Error(), "--ephemeral") {
		t.Errorf("a standby only: %s, %v; want an error naming --ephemeral", mode, err)
	}
	if mode, _, err := detect(refusing(t) + "," + refusing(t)); err != nil || mode != ModeEphemeral {
		t.Errorf("none answers: %s, %v; want ephemeral", mode, err)
	}
	if _, err := NewInfer(InferConfig{QueenURL: active + ",", Model: "tiny", Prompt: "hi"}); !errors.Is(err, ErrUsage) || !strings.Contains(err.Error(), "element 2 is empty") {
		t.Errorf("malformed list: %v", err)
	}
}
