package routing

import (
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/apiary-llm/apiary/internal/api"
)

// The read-only views of routing that a dashboard shows: what waits,
// what the hives have, and the running totals of the inference metrics.
// None does I/O; each takes a lock only to copy.

// Queue is the requests waiting for a worker of one model (on one pool,
// when they are pinned to it), interactive and batch together.
type Queue struct {
	Model  string
	Pool   string // "": any pool
	Queued int
	Oldest time.Time // the longest-waiting request's arrival
}

// Queues returns every non-empty queue, by model then pool.
func (s *Service) Queues() []Queue {
	stats := s.router.queueStats()
	out := make([]Queue, 0, len(stats))
	for _, st := range stats {
		out = append(out, Queue{Model: st.target.model, Pool: st.target.pool, Queued: st.queued, Oldest: st.oldest})
	}
	slices.SortFunc(out, func(a, b Queue) int {
		if c := strings.Compare(a.Model, b.Model); c != 0 {
			return c
		}
		return strings.Compare(a.Pool, b.Pool)
	})
	return out
}

// Catalog returns the model files of every pool whose hive's list has
// been read, by pool id then model ref, as last read (it reads nothing).
// The maps are the caller's.
func (s *Service) Catalog() map[string]map[string]api.Model {
	snap := s.catalog.snapshot()
	out := make(map[string]map[string]api.Model, len(snap))
	for id, models := range snap {
		out[id] = maps.Clone(models)
	}
	return out
}

// Totals are one model's inference counts since the queen started, from
// its metrics: requests answered, and of the streamed ones the time to
// the first relayed event and between events (an event is one token as
// the workers stream them).
type Totals struct {
	Requests   uint64
	TTFTCount  uint64
	TTFTSum    float64 // seconds
	ITLCount   uint64
	ITLSum     float64 // seconds
	Tokens     uint64  // events relayed in streams: TTFTCount + ITLCount
	QueueWaits uint64
}

// Totals returns the running totals by model (requests for unknown
// models are left out).
func (s *Service) Totals() map[string]Totals {
	out := map[string]Totals{}
	each(s.m.requests, func(model string, m *dto.Metric) {
		t := out[model]
		t.Requests += uint64(m.GetCounter().GetValue())
		out[model] = t
	})
	each(s.m.ttft, func(model string, m *dto.Metric) {
		t := out[model]
		t.TTFTCount += m.GetHistogram().GetSampleCount()
		t.TTFTSum += m.GetHistogram().GetSampleSum()
		out[model] = t
	})
	each(s.m.interToken, func(model string, m *dto.Metric) {
		t := out[model]
		t.ITLCount += m.GetHistogram().GetSampleCount()
		t.ITLSum += m.GetHistogram().GetSampleSum()
		out[model] = t
	})
	each(s.m.queueWait, func(model string, m *dto.Metric) {
		t := out[model]
		t.QueueWaits += m.GetHistogram().GetSampleCount()
		out[model] = t
	})
	delete(out, modelUnknown)
	for model, t := range out {
		t.Tokens = t.TTFTCount + t.ITLCount
		out[model] = t
	}
	return out
}

// each calls fn with every series of c and its model label.
func each(c prometheus.Collector, fn func(model string, m *dto.Metric)) {
	ch := make(chan prometheus.Metric, 64)
	go func() {
		c.Collect(ch)
		close(ch)
	}()
	for pm := range ch {
		var m dto.Metric
		if pm.Write(&m) != nil {
			continue
		}
		for _, l := range m.GetLabel() {
			if l.GetName() == "model" {
				fn(l.GetValue(), &m)
				break
			}
		}
	}
}
