package queen

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"testing"
	"time"

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
