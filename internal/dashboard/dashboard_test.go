package dashboard

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// state is a Build function's state that a test changes.
type state struct {
	mu     sync.Mutex
	items  Snapshot
	builds int
}

func (s *state) build() Snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.builds++
	out := Snapshot{}
	for k, v := range s.items {
		out[k] = v
	}
	return out
}

func (s *state) set(k string, v any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if v == nil {
		delete(s.items, k)
	} else {
		s.items[k] = v
	}
}

func (s *state) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.builds
}

// next reads the next message of sub.
func next(t *testing.T, sub *subscriber) Message {
	t.Helper()
	frame, ok := <-sub.ch
	if !ok {
		t.Fatal("the hub dropped the page")
	}
	data, ok := strings.CutPrefix(strings.TrimSuffix(string(frame), "\n\n"), "data: ")
	if !ok {
		t.Fatalf("not an SSE data frame: %q", frame)
	}
	var m Message
	if err := json.Unmarshal([]byte(data), &m); err != nil {
		t.Fatal(err)
	}
	return m
}

func keys(m map[string]json.RawMessage) map[string]string {
	out := map[string]string{}
	for k, v := range m {
		out[k] = string(v)
	}
	return out
}

// A page gets every item first, then only what changed and what went;
// a page that joins later gets every item first too.
func TestHubSendsAFullMessageThenDeltas(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &state{items: Snapshot{"pool/a": map[string]string{"status": "healthy"}, "pool/b": 1, "worker/x": "RUNNING"}}
		h := NewHub(HubConfig{Build: st.build})
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go h.Run(ctx)

		sub := h.subscribe()
		m := next(t, sub)
		if want := map[string]string{"pool/a": `{"status":"healthy"}`, "pool/b": "1", "worker/x": `"RUNNING"`}; !m.Full || !cmp.Equal(keys(m.Set), want) {
			t.Fatalf("first message: full %v, set %v, want %v", m.Full, keys(m.Set), want)
		}

		st.set("worker/x", "FAILED")
		st.set("pool/b", nil)
		st.set("model/m", []int{1})
		h.Changed()
		m = next(t, sub)
		if want := map[string]string{"worker/x": `"FAILED"`, "model/m": "[1]"}; m.Full || !cmp.Equal(keys(m.Set), want) || !cmp.Equal(m.Del, []string{"pool/b"}) {
			t.Fatalf("delta: full %v, set %v, del %v; want set %v, del [pool/b]", m.Full, keys(m.Set), m.Del, want)
		}

		late := h.subscribe()
		m = next(t, late)
		if want := map[string]string{"pool/a": `{"status":"healthy"}`, "worker/x": `"FAILED"`, "model/m": "[1]"}; !m.Full || !cmp.Equal(keys(m.Set), want) {
			t.Fatalf("a later page's first message: full %v, set %v", m.Full, keys(m.Set))
		}
		synctest.Wait()
		select {
		case f := <-sub.ch:
			t.Fatalf("the first page got a message though nothing changed: %s", f)
		default:
		}
	})
}

// Changes are coalesced: however many come, the state is built at most
// once per MinInterval, and never while no page is connected.
func TestHubCoalescesAndIdlesWithoutPages(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &state{items: Snapshot{"n": 0}}
		h := NewHub(HubConfig{Build: st.build, MinInterval: 200 * time.Millisecond, Sweep: time.Hour})
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go h.Run(ctx)

		for range 50 {
			h.Changed()
			time.Sleep(10 * time.Millisecond)
		}
		synctest.Wait()
		if n := st.count(); n != 0 {
			t.Fatalf("%d builds without a page", n)
		}

		sub := h.subscribe()
		next(t, sub)
		start := time.Now()
		for i := range 100 { // 1 s of changes, one every 10 ms
			st.set("n", i+1)
			h.Changed()
			time.Sleep(10 * time.Millisecond)
		}
		time.Sleep(300 * time.Millisecond)
		synctest.Wait()
		elapsed := time.Since(start)
		if n, most := st.count(), 1+int(elapsed/(200*time.Millisecond))+1; n > most {
			t.Errorf("%d builds in %s, want at most %d (one per 200ms)", n, elapsed, most)
		}
		var last Message
		for len(sub.ch) > 0 {
			last = next(t, sub)
		}
		if got := string(last.Set["n"]); got != "100" {
			t.Errorf("the last push has n = %s, want 100", got)
		}
	})
}

// A page that does not read is dropped once its buffer is full (it
// reconnects and starts over); the others go on.
func TestHubDropsAPageThatDoesNotRead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &state{items: Snapshot{"n": 0}}
		h := NewHub(HubConfig{Build: st.build, MinInterval: time.Millisecond, Sweep: time.Hour})
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go h.Run(ctx)
		slow := h.subscribe()
		for i := range subBuffer + 2 {
			st.set("n", i+1)
			h.Changed()
			time.Sleep(5 * time.Millisecond)
		}
		synctest.Wait()
		if h.Pages() != 0 {
			t.Fatalf("%d pages, want the slow one dropped", h.Pages())
		}
		n := 0
		for range slow.ch {
			n++
		}
		if n != subBuffer {
			t.Errorf("the slow page had %d messages buffered, want %d", n, subBuffer)
		}
	})
}

// The window turns running totals into per-second rates and mean
// latencies per bucket, keeps at most its buckets, pads a model first
// seen later, and counts totals that went down from zero.
func TestWindowRates(t *testing.T) {
	w := NewWindow(5*time.Second, 3)
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	w.Sample(t0, map[string]Counts{"a": {Requests: 100, Tokens: 1000}})
	w.Sample(t0.Add(5*time.Second), map[string]Counts{"a": {Requests: 110, Tokens: 1050, TTFTCount: 2, TTFTSum: 0.5, ITLCount: 48, ITLSum: 0.96}})
	w.Sample(t0.Add(10*time.Second), map[string]Counts{"a": {Requests: 110, Tokens: 1050, TTFTCount: 2, TTFTSum: 0.5, ITLCount: 48, ITLSum: 0.96},
		"b": {Requests: 5, Tokens: 10, TTFTCount: 1, TTFTSum: 0.1}})
	w.Sample(t0.Add(15*time.Second), map[string]Counts{"a": {Requests: 3}, "b": {Requests: 5, Tokens: 10, TTFTCount: 1, TTFTSum: 0.1}})
	w.Sample(t0.Add(20*time.Second), map[string]Counts{"a": {Requests: 3}, "b": {Requests: 5, Tokens: 10, TTFTCount: 1, TTFTSum: 0.1}})
	v := w.View()
	f := func(x float64) *float64 { return &x }
	want := View{StepSeconds: 5, Buckets: 3, End: t0.Add(20 * time.Second), Models: map[string]Series{
		// buckets ending at 10s, 15s, 20s (the 5s one fell out)
		"a": {Requests: []float64{0, 0.6, 0}, Tokens: []float64{0, 0, 0}, TTFT: []*float64{nil, nil, nil}, ITL: []*float64{nil, nil, nil}},
		"b": {Requests: []float64{1, 0, 0}, Tokens: []float64{2, 0, 0}, TTFT: []*float64{f(100), nil, nil}, ITL: []*float64{nil, nil, nil}},
	}}
	if diff := cmp.Diff(want, v); diff != "" {
		t.Errorf("view (-want +got):\n%s", diff)
	}

	w = NewWindow(time.Second, 10)
	w.Sample(t0, nil)
	w.Sample(t0.Add(time.Second), map[string]Counts{"a": {Requests: 2, Tokens: 20, TTFTCount: 2, TTFTSum: 0.2, ITLCount: 18, ITLSum: 0.18}})
	s := w.View().Models["a"]
	if s.Requests[0] != 2 || s.Tokens[0] != 20 || *s.TTFT[0] != 100 || *s.ITL[0] < 9.99 || *s.ITL[0] > 10.01 {
		t.Errorf("a model new since the baseline: %+v (ttft %v itl %v)", s, *s.TTFT[0], *s.ITL[0])
	}
}

// The page's files are served by name only, with their content types;
// nothing outside the embedded directory is reachable.
func TestFiles(t *testing.T) {
	for name, ct := range map[string]string{"": "text/html; charset=utf-8", "index.html": "text/html; charset=utf-8",
		"app.js": "text/javascript; charset=utf-8", "activity.js": "text/javascript; charset=utf-8", "app.css": "text/css; charset=utf-8", "icon.svg": "image/svg+xml"} {
		data, got, ok := File(name)
		if !ok || got != ct || len(data) == 0 {
			t.Errorf("File(%q): ok %v, %q, %d bytes; want %q", name, ok, got, len(data), ct)
		}
	}
	for _, name := range []string{"../dashboard.go", "assets/app.js", ".hidden", "nope.js", "dashboard.go", "x/app.js"} {
		if _, _, ok := File(name); ok {
			t.Errorf("File(%q) served", name)
		}
	}
	index, _, _ := File("")
	if strings.Contains(string(index), "<script>") || strings.Contains(string(index), "style=") || strings.Contains(string(index), "<style") {
		t.Error("index.html has inline script or style, which the CSP refuses")
	}
}
