package registry

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"

	"github.com/apiary-llm/apiary/internal/api"
)

// benchRegistry is a registry of n pools, each with two devices and one
// ready worker (model m<i%10>).
func benchRegistry(b *testing.B, n int) *Registry {
	r, err := New(Config{Store: newFakeStore(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(r.Close)
	ctx := context.Background()
	for i := range n {
		id := fmt.Sprintf("pool-%04d", i)
		if _, err := r.Register(ctx, api.RegisterPool{PoolID: id, Endpoint: "http://" + id + ".hive.invalid"}, "bench"); err != nil {
			b.Fatal(err)
		}
		if _, err := r.Heartbeat(ctx, id, benchBeat(i)); err != nil {
			b.Fatal(err)
		}
	}
	return r
}

func benchBeat(i int) api.Heartbeat {
	return api.Heartbeat{
		GPUs:    []api.GPU{{ID: 0, TotalBytes: 24 << 30, FreeBytes: uint64(i%24) << 30}, {ID: 1, TotalBytes: 24 << 30, FreeBytes: 1 << 30}},
		Workers: []api.Worker{{WorkerID: fmt.Sprintf("w-%d", i), ModelRef: fmt.Sprintf("m%d", i%10), Status: "ready"}},
	}
}

// BenchmarkHeartbeat is one heartbeat of one of 2,000 pools (no status
// change: memory only).
func BenchmarkHeartbeat(b *testing.B) {
	r := benchRegistry(b, 2000)
	ctx := context.Background()
	beats := make([]api.Heartbeat, 2000)
	for i := range beats {
		beats[i] = benchBeat(i)
	}
	b.ResetTimer()
	i := 0
	for b.Loop() {
		if _, err := r.Heartbeat(ctx, fmt.Sprintf("pool-%04d", i%2000), beats[i%2000]); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// BenchmarkQuery2000 runs the registry queries over 2,000 pools.
func BenchmarkQuery2000(b *testing.B) {
	r := benchRegistry(b, 2000)
	for _, q := range []struct {
		name string
		f    Filter
	}{
		{"all", Filter{}},
		{"healthy", Filter{Statuses: []Status{Healthy}}},
		{"model", Filter{Model: "m3"}},
		{"free_vram", Filter{MinFreeBytes: 20 << 30}},
	} {
		b.Run(q.name, func(b *testing.B) {
			n := 0
			for b.Loop() {
				n = len(r.Query(q.f))
			}
			b.ReportMetric(float64(n), "pools")
		})
	}
}
