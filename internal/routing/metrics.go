package routing

import (
	"github.com/prometheus/client_golang/prometheus"
)

// routeMetrics are the metrics of inference routing, on the queen's
// registry. Model labels only ever carry models a pool has (requests for
// others count under modelUnknown).
type routeMetrics struct {
	requests     *prometheus.CounterVec   // model, endpoint, code
	ttft         *prometheus.HistogramVec // model
	interToken   *prometheus.HistogramVec // model
	queueDepth   *prometheus.GaugeVec     // model
	queueWait    *prometheus.HistogramVec // model
	rejected     *prometheus.CounterVec   // model, reason
	placements   *prometheus.CounterVec   // model, result
	evictions    *prometheus.CounterVec   // model (evicted), for (the model placed)
	affinity     *prometheus.CounterVec   // result
	prefixRoutes *prometheus.CounterVec   // result
	promptTokens *prometheus.CounterVec   // model
	cachedTokens *prometheus.CounterVec   // model
	retries      *prometheus.CounterVec   // model, reason
	broken       *prometheus.CounterVec   // model
	preempted    *prometheus.CounterVec   // model
	strikes      *prometheus.CounterVec   // lifecycle_id; a series goes when its row is no longer RUNNING
	degraded     prometheus.Gauge
	strikeStops  prometheus.Counter
	rounds       prometheus.Counter
	crashLoop    *prometheus.GaugeVec // model; models with min_workers only
	sessionsDesc *prometheus.Desc
	sessions     func() int
}

// modelUnknown labels requests for a model no pool has.
const modelUnknown = "_unknown"

// latencyBuckets cover 50µs (relay overhead) to 30s (a cold start).
var latencyBuckets = []float64{.00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}

func newRouteMetrics(reg prometheus.Registerer, sessions func() int) *routeMetrics {
	m := &routeMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "apiary_queen_inference_requests_total", Help: "OpenAI requests answered, by model, endpoint and HTTP status."},
			[]string{"model", "endpoint", "code"}),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "apiary_queen_time_to_first_token_seconds", Help: "Streamed requests: arrival at the queen to the first event relayed, queueing and cold starts included.",
			Buckets: latencyBuckets}, []string{"model"}),
		interToken: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "apiary_queen_inter_token_seconds", Help: "Streamed requests: time between two relayed events.",
			Buckets: latencyBuckets}, []string{"model"}),
		queueDepth: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "apiary_queen_queue_depth", Help: "Requests waiting for a worker, by model."}, []string{"model"}),
		queueWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "apiary_queen_queue_wait_seconds", Help: "Time requests waited in the queue for a worker (those that waited).",
			Buckets: latencyBuckets}, []string{"model"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "apiary_queen_queue_rejected_total", Help: "Requests the queue refused or gave up on: queue_full (429), timeout (504), no_capacity (503)."},
			[]string{"model", "reason"}),
		evictions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "apiary_queen_evictions_total", Help: "Idle workers the controller stopped to make room for a worker of another model (model: the one stopped; for: the one placed)."},
			[]string{"model", "for"}),
		placements: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "apiary_queen_placements_total", Help: "Workers the controller placed on demand: started (the hive accepted), failed (no pool, or every hive refused)."},
			[]string{"model", "result"}),
		prefixRoutes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "apiary_queen_prefix_routes_total", Help: "Requests --routing prefix sent to a worker holding a prefix of their text (hit) or to one holding none (miss)."},
			[]string{"result"}),
		promptTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "apiary_queen_prompt_tokens_total", Help: "Prompt tokens of the answers whose worker reported its cache, by model."}, []string{"model"}),
		cachedTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "apiary_queen_cached_prompt_tokens_total", Help: "Of apiary_queen_prompt_tokens_total, those the workers found in their caches."}, []string{"model"}),
		affinity: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "apiary_queen_affinity_total", Help: "Requests with X-Session-Id: hit (served by the session's worker) or miss."}, []string{"result"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "apiary_queen_upstream_retries_total", Help: "Requests tried again on another worker before their first byte, by why."},
			[]string{"model", "reason"}),
		broken: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "apiary_queen_streams_broken_total", Help: "Streams whose worker stopped answering after the first byte (ended with an error event)."},
			[]string{"model"}),
		preempted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "apiary_queen_batch_preemptions_total", Help: "Batch requests whose slot an interactive request took (the request was cancelled; its job is queued again, no attempt counted)."},
			[]string{"model"}),
		strikes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "apiary_queen_worker_strikes_total", Help: "Requests a RUNNING worker failed (refused or broken connection, 5xx other than 503), and failed health checks while degraded, by lifecycle id; the series goes when the row is no longer RUNNING."},
			[]string{"lifecycle_id"}),
		degraded: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "apiary_queen_workers_degraded", Help: "Workers the queen keeps out of routing after --strike-limit failures in a row."}),
		strikeStops: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "apiary_queen_strike_stops_total", Help: "Stops the queen asked for of workers that failed 3 × --strike-limit requests in a row."}),
		rounds: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "apiary_queen_controller_rounds_total", Help: "Times the demand controller weighed waiting requests (it does nothing while none wait)."}),
		crashLoop: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "apiary_queen_model_crashloop", Help: "1 while a model with min_workers is in a crash loop (replaced only at the slow pace), 0 after."},
			[]string{"model"}),
		sessionsDesc: prometheus.NewDesc("apiary_queen_affinity_sessions", "Sessions pinned to a worker.", nil, nil),
		sessions:     sessions,
	}
	reg.MustRegister(m.requests, m.ttft, m.interToken, m.queueDepth, m.queueWait, m.rejected, m.placements, m.evictions, m.affinity, m.prefixRoutes, m.promptTokens, m.cachedTokens,
		m.retries, m.broken, m.preempted, m.strikes, m.degraded, m.strikeStops, m.rounds, m.crashLoop, sessionGauge{m})
	return m
}

type sessionGauge struct{ m *routeMetrics }

func (g sessionGauge) Describe(ch chan<- *prometheus.Desc) { ch <- g.m.sessionsDesc }
func (g sessionGauge) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(g.m.sessionsDesc, prometheus.GaugeValue, float64(g.m.sessions()))
}
