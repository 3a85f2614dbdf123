package queen

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
)

// relayBench is a queen in this process with one ready fake worker that
// streams events as fast as it can, and a client for both.
type relayBench struct {
	x  *tq
	mh *modelHive
	fw *fakeWorker
	hc *http.Client
}

func newRelayBench(b *testing.B, events int) *relayBench {
	x, mh := routeQueen(b, map[string][]api.Model{"http://hive-a": {tinyModel}},
		func(c *Config) {
			c.Routing.WorkerSlots, c.Routing.QueueSize = 64, 512
			c.HeartbeatTimeout = 5 * time.Minute // no pool times out while thousands of others register (RouteManyPools)
		})
	x.registerAt("a", "http://hive-a")
	fw := newFakeWorker(b, tokens(events))
	x.readyWorker("a", fw.URL)
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 128}}
	b.Cleanup(hc.CloseIdleConnections)
	return &relayBench{x: x, mh: mh, fw: fw, hc: hc}
}

// BenchmarkRelayInProcess: the queen in this process relaying streams of
// 64 events from a fake worker that sends them as fast as it can, at 1, 16
// and 64 concurrent streams. It measures the queen's own cost per request
// and per event (run it with -cpuprofile to see where it goes); the
// worker and the client share the process, so ns/op is theirs too.
//
//	go test -run '^$' -bench RelayInProcess -cpuprofile cpu.out ./internal/queen/
func BenchmarkRelayInProcess(b *testing.B) {
	for _, streams := range []int{1, 16, 64} {
		b.Run(fmt.Sprintf("streams=%d", streams), func(b *testing.B) {
			rb := newRelayBench(b, 64)
			var s sample
			start := time.Now()
			for b.Loop() {
				round(context.Background(), b, rb.hc, rb.x.url, streamBody, streams, &s)
			}
			b.ReportMetric(float64(time.Since(start).Microseconds())/float64(b.N*streams), "µs/stream")
		})
	}
}

// BenchmarkRelayTTFTInProcess: time to first event through the queen and
// straight to the same fake worker (which answers at once), alternating,
// at 1, 16 and 64 concurrent streams: the queen's own added latency,
// without a worker's batching in the picture.
func BenchmarkRelayTTFTInProcess(b *testing.B) {
	for _, streams := range []int{1, 16, 64} {
		b.Run(fmt.Sprintf("streams=%d", streams), func(b *testing.B) {
			rb := newRelayBench(b, 8)
			var direct, queen sample
			for i := 0; b.Loop(); i++ {
				if i%2 == 0 {
					round(context.Background(), b, rb.hc, rb.fw.URL, streamBody, streams, &direct)
					round(context.Background(), b, rb.hc, rb.x.url, streamBody, streams, &queen)
				} else {
					round(context.Background(), b, rb.hc, rb.x.url, streamBody, streams, &queen)
					round(context.Background(), b, rb.hc, rb.fw.URL, streamBody, streams, &direct)
				}
			}
			b.ReportMetric(float64((pct(queen.ttft, 0.5) - pct(direct.ttft, 0.5)).Microseconds()), "added-ttft-p50-µs")
			b.ReportMetric(float64((pct(queen.ttft, 0.99) - pct(direct.ttft, 0.99)).Microseconds()), "added-ttft-p99-µs")
			b.ReportMetric(float64(pct(direct.ttft, 0.5).Microseconds()), "direct-ttft-p50-µs")
		})
	}
}

// BenchmarkRouteManyPools: what a request costs the queen before it
// reaches a worker (model check, candidates, lease) with 1, 2,000 or
// 10,000 healthy pools registered, one of them serving the model, or
// 1,000 of 10,000 each with a ready worker of it.
//
//	go test -run '^$' -bench RouteManyPools -benchmem ./internal/queen/
func BenchmarkRouteManyPools(b *testing.B) {
	for _, tc := range []struct {
		pools, serving int
		changing       bool
	}{{1, 1, false}, {2000, 1, false}, {10000, 1, false}, {10000, 1000, false}, {10000, 1000, true}} {
		name := fmt.Sprintf("pools=%d/serving=%d", tc.pools, tc.serving)
		if tc.changing {
			// Something the candidates are made of changes before every
			// request: the model's list is made again each time.
			name += "/changing"
		}
		b.Run(name, func(b *testing.B) {
			rb := newRelayBench(b, 1)
			for i := 1; i < tc.pools; i++ {
				id, url := fmt.Sprintf("p%05d", i), fmt.Sprintf("http://hive-%05d", i)
				if i < tc.serving {
					rb.mh.mu.Lock()
					rb.mh.models[url] = []api.Model{tinyModel}
					rb.mh.mu.Unlock()
				}
				rb.x.registerAt(id, url)
				if i < tc.serving {
					rb.x.readyWorker(id, rb.fw.URL)
				}
			}
			q := rb.x.q
			ctx := context.Background()
			for b.Loop() {
				if tc.changing {
					q.tokens.gen.Add(1)
				}
				if err := q.routing.Route(ctx, "tiny", ""); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
