package routing

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
)

// Totals sums the routing metrics by model: requests over endpoints and
// codes, the streams' first events and the events after them (tokens),
// and leaves out requests for unknown models.
func TestTotals(t *testing.T) {
	s := &Service{m: newRouteMetrics(prometheus.NewRegistry(), func() int { return 0 })}
	s.m.requests.WithLabelValues("tiny", "completions", "200").Add(3)
	s.m.requests.WithLabelValues("tiny", "chat_completions", "503").Add(1)
	s.m.requests.WithLabelValues(modelUnknown, "completions", "404").Add(7)
	s.m.requests.WithLabelValues("big", "embeddings", "200").Add(2)
	s.m.ttft.WithLabelValues("tiny").Observe(0.25)
	s.m.ttft.WithLabelValues("tiny").Observe(0.75)
	for range 10 {
		s.m.interToken.WithLabelValues("tiny").Observe(0.01)
	}
	s.m.queueWait.WithLabelValues("tiny").Observe(1)
	got := s.Totals()
	want := map[string]Totals{
		"tiny": {Requests: 4, TTFTCount: 2, TTFTSum: 1, ITLCount: 10, ITLSum: 0.1, Tokens: 12, QueueWaits: 1},
		"big":  {Requests: 2},
	}
	if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 })); diff != "" {
		t.Errorf("Totals (-want +got):\n%s", diff)
	}
}
