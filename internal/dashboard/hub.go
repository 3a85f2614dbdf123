package dashboard

import (
	"bytes"
	"context"
	"encoding/json"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"
)

// Snapshot is the dashboard's state: items by key ("pool/ID",
// "worker/ID", "model/NAME", "stats", …), each a value that marshals to
// JSON, or a json.RawMessage already marshalled (compact), which is used
// as it is: a builder may keep the JSON of items that seldom change. The
// page keeps the same map and renders it.
type Snapshot map[string]any

// HubConfig is what a Hub needs.
type HubConfig struct {
	// Build returns the current state. It is called by the hub's own
	// goroutine only, at most once per MinInterval, and only while a
	// page is connected; it must read memory, never a store.
	Build func() Snapshot
	// MinInterval is the least time between two builds (and pushes);
	// default 200ms: at most five pushes a second however often things
	// change.
	MinInterval time.Duration
	// Sweep is how often the state is built while pages are connected
	// even without a Changed call (for what changes without telling:
	// queues, devices' memory); default 1s.
	Sweep time.Duration
	// KeepAlive is how often an idle stream gets a comment line, so
	// that proxies and the page see it alive; default 15s.
	KeepAlive time.Duration
}

func (c HubConfig) withDefaults() HubConfig {
	if c.MinInterval <= 0 {
		c.MinInterval = 200 * time.Millisecond
	}
	if c.Sweep <= 0 {
		c.Sweep = time.Second
	}
	if c.KeepAlive <= 0 {
		c.KeepAlive = 15 * time.Second
	}
	return c
}

// Message is one push of the stream: the items that changed (Set) and
// those that went (Del). Full is the first message of a stream: Set holds
// every item, and the page drops what it had.
type Message struct {
	Seq  uint64                     `json:"seq"`
	Full bool                       `json:"full,omitempty"`
	Set  map[string]json.RawMessage `json:"set,omitempty"`
	Del  []string                   `json:"del,omitempty"`
}

// subBuffer bounds the pushes waiting for one slow page; a page that
// falls this far behind is disconnected (it reconnects and gets a full
// message).
const subBuffer = 16

type subscriber struct {
	ch     chan []byte // SSE frames; closed when the hub drops the page
	needed bool        // guarded by Hub.mu; waits for its full message
}

// Hub builds the dashboard's state once per change (coalesced to
// MinInterval) for every connected page, and pushes each page what
// changed since its last message. Nothing is built while no page is
// connected. Create it with NewHub, run it with Run.
type Hub struct {
	cfg    HubConfig
	wake   chan struct{} // buffered 1: Changed
	joined chan struct{} // buffered 1: a new page, which is not kept waiting for MinInterval

	mu   sync.Mutex
	subs map[*subscriber]struct{} // guarded by mu

	// Owned by Run's goroutine.
	last map[string]json.RawMessage
	seq  uint64
}

// NewHub returns a hub over cfg.Build.
func NewHub(cfg HubConfig) *Hub {
	return &Hub{cfg: cfg.withDefaults(), wake: make(chan struct{}, 1), joined: make(chan struct{}, 1), subs: map[*subscriber]struct{}{}}
}

// Changed tells the hub that the state changed: connected pages get the
// change within MinInterval. It never blocks.
func (h *Hub) Changed() {
	select {
	case h.wake <- struct{}{}:
	default:
	}
}

// Pages is the number of connected pages.
func (h *Hub) Pages() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.subs)
}

// Run builds and pushes until ctx ends; then every stream ends.
func (h *Hub) Run(ctx context.Context) {
	sweep := time.NewTicker(h.cfg.Sweep)
	defer sweep.Stop()
	defer h.closeAll()
	for {
		select {
		case <-ctx.Done():
			return
		case <-h.wake:
		case <-h.joined:
		case <-sweep.C:
		}
		if h.Pages() == 0 {
			h.last = nil // the next page's full message is built afresh
			continue
		}
		h.Push(h.cfg.Build())
		// Coalesce: what changes meanwhile goes in the next push. A new
		// page cuts the wait short: its first message comes at once.
		t := time.NewTimer(h.cfg.MinInterval)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		case <-h.joined:
			t.Stop()
			h.Changed()
		}
	}
}

// Push diffs s against the last state pushed and sends every page its
// message. Run calls it with Build's state; calls must not overlap
// (benchmarks call it while no Run does).
func (h *Hub) Push(s Snapshot) {
	next := make(map[string]json.RawMessage, len(s))
	set := map[string]json.RawMessage{}
	for k, v := range s {
		data, ok := v.(json.RawMessage)
		if !ok {
			var err error
			if data, err = json.Marshal(v); err != nil {
				data, _ = json.Marshal(map[string]string{"error": "cannot encode " + k + ": " + err.Error()})
			}
		}
		next[k] = data
		if old, ok := h.last[k]; !ok || !bytes.Equal(old, data) {
			set[k] = data
		}
	}
	var del []string
	for k := range h.last {
		if _, ok := next[k]; !ok {
			del = append(del, k)
		}
	}
	slices.Sort(del)
	h.last = next
	h.seq++
	var delta []byte
	if len(set) > 0 || len(del) > 0 {
		delta = frame(Message{Seq: h.seq, Set: set, Del: del})
	}
	var full []byte
	h.mu.Lock()
	defer h.mu.Unlock()
	for sub := range h.subs {
		msg := delta
		if sub.needed {
			if full == nil {
				full = frame(Message{Seq: h.seq, Full: true, Set: maps.Clone(next)})
			}
			msg, sub.needed = full, false
		}
		if msg == nil {
			continue
		}
		select {
		case sub.ch <- msg:
		default: // too slow: it reconnects and starts over
			delete(h.subs, sub)
			close(sub.ch)
		}
	}
}

// frame is m as one SSE event. It is written by hand: json.Marshal
// would compact every item's JSON once more.
func frame(m Message) []byte {
	n := 64
	for k, v := range m.Set {
		n += len(k) + len(v) + 8
	}
	for _, k := range m.Del {
		n += len(k) + 8
	}
	b := make([]byte, 0, n)
	b = append(b, `data: {"seq":`...)
	b = strconv.AppendUint(b, m.Seq, 10)
	if m.Full {
		b = append(b, `,"full":true`...)
	}
	if len(m.Set) > 0 {
		b = append(b, `,"set":{`...)
		for i, k := range slices.Sorted(maps.Keys(m.Set)) {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendKey(b, k)
			b = append(b, ':')
			b = append(b, m.Set[k]...)
		}
		b = append(b, '}')
	}
	if len(m.Del) > 0 {
		b = append(b, `,"del":[`...)
		for i, k := range m.Del {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendKey(b, k)
		}
		b = append(b, ']')
	}
	return append(b, "}\n\n"...)
}

// appendKey appends k as a JSON string.
func appendKey(b []byte, k string) []byte {
	q, _ := json.Marshal(k)
	return append(b, q...)
}

func (h *Hub) subscribe() *subscriber {
	sub := &subscriber{ch: make(chan []byte, subBuffer), needed: true}
	h.mu.Lock()
	h.subs[sub] = struct{}{}
	h.mu.Unlock()
	select {
	case h.joined <- struct{}{}:
	default:
	}
	return sub
}

func (h *Hub) unsubscribe(sub *subscriber) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.subs[sub]; ok {
		delete(h.subs, sub)
		close(sub.ch)
	}
}

func (h *Hub) closeAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for sub := range h.subs {
		delete(h.subs, sub)
		close(sub.ch)
	}
}

// ServeEvents streams the state to one page as server-sent events: a
// full message first, then the changes, until the page goes, the hub
// drops it (too slow) or ctx (the server's shutdown) ends. The caller
// has authenticated the request.
func (h *Hub) ServeEvents(ctx context.Context, w http.ResponseWriter, r *http.Request) {
	rc := http.NewResponseController(w)
	hd := w.Header()
	hd.Set("Content-Type", "text/event-stream")
	hd.Set("Cache-Control", "no-store")
	hd.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	_ = rc.Flush()
	sub := h.subscribe()
	defer h.unsubscribe(sub)
	keep := time.NewTicker(h.cfg.KeepAlive)
	defer keep.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-ctx.Done():
			return
		case <-keep.C:
			if _, err := w.Write([]byte(": keep-alive\n\n")); err != nil {
				return
			}
		case msg, ok := <-sub.ch:
			if !ok {
				return
			}
			if _, err := w.Write(msg); err != nil {
				return
			}
		}
		if rc.Flush() != nil {
			return
		}
	}
}

// Current builds the state now, for one snapshot request.
func (h *Hub) Current() Snapshot { return h.cfg.Build() }
