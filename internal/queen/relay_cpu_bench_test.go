package queen

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
)

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
			x, _ := routeQueen(b, map[string][]api.Model{"http://hive-a": {tinyModel}},
				func(c *Config) { c.Routing.WorkerSlots = 64; c.Routing.QueueSize = 512 })
			x.registerAt("a", "http://hive-a")
			fw := newFakeWorker(b, tokens(64))
			x.readyWorker("a", fw.URL)
			hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 128}}
			defer hc.CloseIdleConnections()
			one := func() error {
				req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, x.url+"/v1/completions", strings.NewReader(streamBody))
				if err != nil {
					return err
				}
				resp, err := hc.Do(req)
				if err != nil {
					return err
				}
				defer resp.Body.Close()
				data, err := io.ReadAll(resp.Body)
				if err != nil || resp.StatusCode != http.StatusOK || !strings.Contains(string(data), "[DONE]") {
					return fmt.Errorf("answer %d %v: %.200s", resp.StatusCode, err, data)
				}
				return nil
			}
			b.ResetTimer()
			start := time.Now()
			for b.Loop() {
				var wg sync.WaitGroup
				for range streams {
					wg.Go(func() {
						if err := one(); err != nil {
							b.Error(err)
						}
					})
				}
				wg.Wait()
			}
			b.ReportMetric(float64(time.Since(start).Microseconds())/float64(b.N*streams), "µs/stream")
		})
	}
}

// BenchmarkRelayTTFTInProcess: time to first event through the queen and
// straight to the same fake worker (which answers at once), alternating,
// at 16 concurrent streams: the queen's own added latency, without a
// worker's batching in the picture.
func BenchmarkRelayTTFTInProcess(b *testing.B) {
	for _, streams := range []int{1, 16, 64} {
		b.Run(fmt.Sprintf("streams=%d", streams), func(b *testing.B) {
			x, _ := routeQueen(b, map[string][]api.Model{"http://hive-a": {tinyModel}},
				func(c *Config) { c.Routing.WorkerSlots = 64; c.Routing.QueueSize = 512 })
			x.registerAt("a", "http://hive-a")
			fw := newFakeWorker(b, tokens(8))
			x.readyWorker("a", fw.URL)
			hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 128}}
			defer hc.CloseIdleConnections()
			var direct, queen sample
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				for side := range 2 {
					base, s := fw.URL, &direct
					if (i+side)%2 == 1 {
						base, s = x.url, &queen
					}
					var mu sync.Mutex
					var wg sync.WaitGroup
					for range streams {
						wg.Go(func() {
							ttft, _, err := streamTimes(context.Background(), hc, base, streamBody)
							if err != nil {
								b.Error(err)
								return
							}
							mu.Lock()
							s.ttft = append(s.ttft, ttft)
							mu.Unlock()
						})
					}
					wg.Wait()
				}
			}
			b.ReportMetric(float64((pct(queen.ttft, 0.5) - pct(direct.ttft, 0.5)).Microseconds()), "added-ttft-p50-µs")
			b.ReportMetric(float64((pct(queen.ttft, 0.99) - pct(direct.ttft, 0.99)).Microseconds()), "added-ttft-p99-µs")
			b.ReportMetric(float64(pct(direct.ttft, 0.5).Microseconds()), "direct-ttft-p50-µs")
		})
	}
}
