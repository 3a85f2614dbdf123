package queen

import (
	"context"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/apiary-llm/apiary/internal/lifecycle"
	"github.com/apiary-llm/apiary/internal/registry"
	"github.com/apiary-llm/apiary/internal/store"
)

// metrics are the queen's Prometheus metrics (the
// lifecycle rows), on a registry of its own.
type metrics struct {
	reg                 *prometheus.Registry
	heartbeats          prometheus.Counter
	unchangedBeats      prometheus.Counter
	heartbeatSeconds    prometheus.Histogram
	registrations       prometheus.Counter
	events              prometheus.Counter
	rowTransitions      *prometheus.CounterVec
	rowRefused          prometheus.Counter
	refusedHiveCalls    *prometheus.CounterVec // path
	unknownStopped      prometheus.Counter
	requests            *prometheus.CounterVec
	requestsOK          func() prometheus.Counter // requests' code="200", looked up once
	storeErrors         prometheus.Counter
	poolsDesc, rowsDesc *prometheus.Desc

	pools func() map[registry.Status]int
	st    *store.Store
}

func newMetrics() *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		heartbeats: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "apiary_queen_heartbeats_received_total", Help: "Pool heartbeats received."}),
		unchangedBeats: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "apiary_queen_heartbeats_unchanged_total", Help: "Pool heartbeats that said nothing changed since the pool's last full one (counted in heartbeats_received too)."}),
		heartbeatSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "apiary_queen_heartbeat_duration_seconds", Help: "Time to handle one pool heartbeat, body read to answer.",
			Buckets: []float64{.00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, 1}}),
		registrations: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "apiary_queen_pools_registered_total", Help: "Pool registrations (first and repeated)."}),
		events: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "apiary_queen_worker_events_total", Help: "Worker transitions pushed by hives."}),
		rowTransitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "apiary_queen_row_transitions_total", Help: "Lifecycle row status changes, by new status."}, []string{"status"}),
		refusedHiveCalls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "apiary_queen_hive_calls_refused_total", Help: "Calls to the hives' endpoints (registration, heartbeats, events, claims) refused for a missing or wrong cluster token."},
			[]string{"endpoint"}),
		rowRefused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "apiary_queen_row_transitions_refused_total", Help: "Lifecycle row changes refused by the transition table."}),
		unknownStopped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "apiary_queen_unknown_workers_stopped_total", Help: "Live workers without a live lifecycle row that the queen asked their hive to stop."}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "apiary_queen_http_requests_total", Help: "HTTP requests by status code."}, []string{"code"}),
		storeErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "apiary_queen_store_errors_total", Help: "Background store writes that failed (retried)."}),
		poolsDesc: prometheus.NewDesc("apiary_queen_pools", "Pools by status.", []string{"status"}, nil),
		rowsDesc:  prometheus.NewDesc("apiary_queen_worker_rows", "Lifecycle rows by status.", []string{"status"}, nil),
	}
	m.requestsOK = sync.OnceValue(func() prometheus.Counter { return m.requests.WithLabelValues("200") })
	m.reg.MustRegister(m.heartbeats, m.unchangedBeats, m.heartbeatSeconds, m.registrations, m.events, m.rowTransitions, m.rowRefused, m.refusedHiveCalls,
		m.unknownStopped, m.requests, m.storeErrors, gauges{m},
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// request counts one answer with its status code.
func (m *metrics) request(code int) {
	if code == http.StatusOK { // most of them: no label lookup, no string
		m.requestsOK().Inc()
		return
	}
	m.requests.WithLabelValues(strconv.Itoa(code)).Inc()
}

// gauges reads pools by status from the registry and rows by status from
// the store at scrape time.
type gauges struct{ m *metrics }

func (g gauges) Describe(ch chan<- *prometheus.Desc) {
	ch <- g.m.poolsDesc
	ch <- g.m.rowsDesc
}

func (g gauges) Collect(ch chan<- prometheus.Metric) {
	if g.m.pools != nil {
		for s, n := range g.m.pools() {
			ch <- prometheus.MustNewConstMetric(g.m.poolsDesc, prometheus.GaugeValue, float64(n), string(s))
		}
	}
	if g.m.st == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var counts map[lifecycle.Status]int
	if err := g.m.st.View(ctx, func(tx *store.Tx) (err error) { counts, err = tx.CountRows(); return err }); err != nil {
		return
	}
	for _, s := range []lifecycle.Status{rowStarting, rowRunning, rowDraining, rowStopped, rowFailed} {
		ch <- prometheus.MustNewConstMetric(g.m.rowsDesc, prometheus.GaugeValue, float64(counts[s]), string(s))
	}
}
