package hive

import (
	"context"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/apiary-llm/apiary/internal/lifecycle"
)

// metrics are the hive's Prometheus series, on a registry of its own (no
// process-wide globals, so tests can run hives side by side).
type metrics struct {
	reg              *prometheus.Registry
	workers          *prometheus.GaugeVec // by state
	spawns           *prometheus.CounterVec
	readyLatency     prometheus.Histogram
	crashes          *prometheus.CounterVec // by exit code
	stops            *prometheus.CounterVec // graceful, forced
	callbackTimeouts prometheus.Counter
	healthKills      prometheus.Counter
	idleStops        prometheus.Counter
	queenEventsDrop  prometheus.Counter
	heartbeats       *prometheus.CounterVec // full, unchanged
}

func newMetrics(h *Hive) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		workers: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "apiary_hive_workers", Help: "Workers by lifecycle state.",
		}, []string{"state"}),
		spawns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "apiary_hive_worker_spawns_total", Help: "Worker start requests by result (spawned, refused, error).",
		}, []string{"result"}),
		readyLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "apiary_hive_worker_ready_seconds",
			Help:    "Time from spawn to the worker's ready callback.",
			Buckets: []float64{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120},
		}),
		crashes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "apiary_hive_worker_crashes_total", Help: "Workers that exited without being asked, by exit code (or signal_N).",
		}, []string{"exit_code"}),
		stops: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "apiary_hive_worker_stops_total", Help: "Stopped workers by how they ended (graceful, forced).",
		}, []string{"kind"}),
		callbackTimeouts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "apiary_hive_worker_callback_timeouts_total", Help: "Workers killed for not calling back in time.",
		}),
		healthKills: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "apiary_hive_worker_health_failures_total", Help: "Workers failed and killed after consecutive health check misses.",
		}),
		idleStops: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "apiary_hive_worker_idle_stops_total", Help: "Workers stopped by the idle timeout.",
		}),
		queenEventsDrop: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "apiary_hive_queen_events_dropped_total", Help: "Worker events not delivered to the queen because the queue was full.",
		}),
		heartbeats: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "apiary_hive_heartbeats_total", Help: "Heartbeats the queen took, by kind: full (the inventory) or unchanged (the lease only).",
		}, []string{"kind"}),
	}
	for _, s := range lifecycle.States {
		if !s.Terminal() {
			m.workers.WithLabelValues(string(s))
		}
	}
	m.stops.WithLabelValues("graceful")
	m.stops.WithLabelValues("forced")
	m.heartbeats.WithLabelValues("full")
	m.heartbeats.WithLabelValues("unchanged")
	m.reg.MustRegister(m.workers, m.spawns, m.readyLatency, m.crashes, m.stops,
		m.callbackTimeouts, m.healthKills, m.idleStops, m.queenEventsDrop, m.heartbeats,
		&deviceCollector{h: h}, collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// deviceCollector reports device memory at scrape time.
type deviceCollector struct{ h *Hive }

var deviceMemDesc = prometheus.NewDesc("apiary_hive_device_memory_bytes",
	"Device memory: total and free as the driver reports them, allocated (ready workers) and reserved (starting workers).",
	[]string{"device", "kind", "type"}, nil)

func (c *deviceCollector) Describe(ch chan<- *prometheus.Desc) { ch <- deviceMemDesc }

func (c *deviceCollector) Collect(ch chan<- prometheus.Metric) {
	gpus, err := c.h.gpus(context.Background())
	if err != nil {
		return
	}
	for _, g := range gpus {
		id := strconv.Itoa(g.ID)
		for typ, v := range map[string]uint64{"total": g.TotalBytes, "free": g.FreeBytes, "allocated": g.AllocatedBytes, "reserved": g.ReservedBytes} {
			ch <- prometheus.MustNewConstMetric(deviceMemDesc, prometheus.GaugeValue, float64(v), id, g.Kind, typ)
		}
	}
}
