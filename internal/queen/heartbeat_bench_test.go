package queen

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/registry"
)

// BenchmarkHeartbeatHandler: one steady heartbeat through the queen's
// HTTP handler (routing, checks, decode, registry, rows, answer) in this
// process, without a connection: the per-beat CPU and allocations of the
// queen in BenchmarkHeartbeatLoad, less the network. Pools beat in turn;
// each has two devices and one worker whose row is RUNNING, as in the
// load benchmark. The flusher runs at its default interval meanwhile.
//
//	go test -run '^$' -bench HeartbeatHandler -benchmem -cpuprofile cpu.out ./internal/queen/
func BenchmarkHeartbeatHandler(b *testing.B) {
	for _, c := range []struct {
		pools     int
		unchanged bool
	}{{2000, false}, {10000, false}, {10000, true}} {
		pools := c.pools
		name := fmt.Sprintf("pools=%d", pools)
		if c.unchanged {
			name += "/beat=unchanged"
		}
		b.Run(name, func(b *testing.B) {
			x := startQueen(b, sqliteDir(b), "", func(c *Config) {
				c.HeartbeatTimeout = 5 * time.Minute // no pool times out while the others register
				c.FlushInterval = registry.DefaultFlushInterval
			})
			h := x.q.routes()
			gpus := []api.GPU{{ID: 0, Kind: "cuda", Name: "sim", TotalBytes: 24 << 30, FreeBytes: 12 << 30, Workers: []string{}},
				{ID: 1, Kind: "cuda", Name: "sim", TotalBytes: 24 << 30, FreeBytes: 20 << 30, Workers: []string{}}}
			reqs := make([]*http.Request, pools)
			bodies := make([][]byte, pools)
			for i := range pools {
				id := poolName(i)
				x.register(id)
				resp := x.start(fmt.Sprintf("m%d", i%10), id)
				w := api.Worker{WorkerID: resp.Worker.WorkerID, LifecycleID: resp.LifecycleID, ModelRef: resp.Worker.ModelRef,
					GPUDevice: 0, VRAMBytes: 4 << 30, URI: "http://127.0.0.1:1", Status: "ready", PID: 1000 + i, StartedAt: time.Now()}
				bodies[i], _ = json.Marshal(api.Heartbeat{GPUs: gpus, Workers: []api.Worker{w}})
				reqs[i] = &http.Request{Method: http.MethodPost, URL: mustURL(b, x.url+"/v2/pools/"+id+"/heartbeat"), Host: "127.0.0.1",
					Header: http.Header{"Content-Type": {"application/json"}}, RemoteAddr: "127.0.0.1:1", Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1}
			}
			rw := &benchWriter{h: http.Header{}}
			serve := func(i int) {
				r := *reqs[i] // the mux records the route on the request
				r.Body = io.NopCloser(bytes.NewReader(bodies[i]))
				r.ContentLength = int64(len(bodies[i]))
				rw.reset()
				h.ServeHTTP(rw, &r)
				if rw.code != http.StatusOK {
					b.Fatalf("heartbeat of %s: %d %s", poolName(i), rw.code, rw.body.String())
				}
			}
			for i := range pools { // the first beat adopts the row
				serve(i)
			}
			if c.unchanged {
				unchanged, _ := json.Marshal(api.Heartbeat{Unchanged: true})
				for i := range bodies {
					bodies[i] = unchanged
				}
			}
			i := 0
			for b.Loop() {
				serve(i % pools)
				i++
			}
		})
	}
}

// benchWriter is a ResponseWriter that keeps the status and the body.
type benchWriter struct {
	h    http.Header
	code int
	body bytes.Buffer
}

func (w *benchWriter) Header() http.Header { return w.h }
func (w *benchWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
}
func (w *benchWriter) Write(p []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.body.Write(p)
}
func (w *benchWriter) reset() { clear(w.h); w.code = 0; w.body.Reset() }

func mustURL(b *testing.B, s string) *url.URL {
	u, err := url.Parse(s)
	if err != nil {
		b.Fatal(err)
	}
	return u
}

// BenchmarkHeartbeatStream: one beat on a pool's heartbeat stream, over
// loopback to a queen in this process, its answer read before the next;
// the pool has two devices and one worker whose row is RUNNING, as in
// BenchmarkHeartbeatLoad. The allocations are the queen's per beat (the
// client side allocates nothing): what the garbage collector of a queen
// with 10,000 streaming hives has to collect, 10,000 times a second.
//
//	go test -run '^$' -bench HeartbeatStream -benchmem ./internal/queen/
func BenchmarkHeartbeatStream(b *testing.B) {
	for _, kind := range []string{"unchanged", "full", "changing"} {
		b.Run("beat="+kind, func(b *testing.B) { benchBeatStream(b, kind) })
	}
}

// benchBeatStream beats as BenchmarkHeartbeatLoad's kinds do: unchanged
// beats, the same full beat, or full beats whose device's free memory
// moves by a MiB each time.
func benchBeatStream(b *testing.B, kind string) {
	x := startQueen(b, sqliteDir(b), "", func(c *Config) { c.HeartbeatTimeout = 5 * time.Minute })
	x.register("a")
	resp := x.start("m0", "a")
	w := api.Worker{WorkerID: resp.Worker.WorkerID, LifecycleID: resp.LifecycleID, ModelRef: resp.Worker.ModelRef,
		GPUDevice: 0, VRAMBytes: 4 << 30, URI: "http://127.0.0.1:1", Status: "ready", PID: 1000, StartedAt: time.Now()}
	gpus := []api.GPU{{ID: 0, Kind: "cuda", Name: "sim", TotalBytes: 24 << 30, FreeBytes: 12 << 30, Workers: []string{}},
		{ID: 1, Kind: "cuda", Name: "sim", TotalBytes: 24 << 30, FreeBytes: 20 << 30, Workers: []string{}}}
	full, _ := json.Marshal(api.Heartbeat{GPUs: gpus, Workers: []api.Worker{w}})
	x.ok("POST", "/v2/pools/a/heartbeat", json.RawMessage(full), http.StatusOK, nil)
	u := mustURL(b, x.url)
	h := &simHive{pool: "a", in: make([]byte, 0, 512)}
	conn, err := net.Dial("tcp", u.Host)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	f, err := conn.(*net.TCPConn).File() // a blocking descriptor of its own
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	h.fd = int(f.Fd())
	if err := openStream(h, u.Host); err != nil {
		b.Fatal(err)
	}
	chunks := [][]byte{beatChunk(full)}
	switch kind {
	case "unchanged":
		chunks = [][]byte{beatChunk([]byte(`{"unchanged":true}`))}
	case "changing":
		gpus[0].FreeBytes -= 1 << 20
		moved, _ := json.Marshal(api.Heartbeat{GPUs: gpus, Workers: []api.Worker{w}})
		chunks = append(chunks, beatChunk(moved))
	}
	n := 0
	round := func() {
		chunk := chunks[n%len(chunks)]
		n++
		if _, err := unix.Write(h.fd, chunk); err != nil {
			b.Fatal(err)
		}
		h.in = h.in[:0]
		for {
			n, err := unix.Read(h.fd, h.in[len(h.in):cap(h.in)])
			if err != nil || n == 0 {
				b.Fatalf("read the answer: %v after %q", err, h.in)
			}
			h.in = h.in[:len(h.in)+n]
			body, complete, err := parseChunk(h.in)
			if err != nil {
				b.Fatal(err)
			}
			if complete {
				if bytes.Contains(body, []byte("full_wanted")) {
					b.Fatalf("answer %s", body)
				}
				return
			}
		}
	}
	round() // the first answer is encoded; later ones reuse it
	for b.Loop() {
		round()
	}
}
