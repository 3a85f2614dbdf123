package worker

import (
	"fmt"
	"net/http"

	"github.com/apiary-llm/apiary/internal/engine"
)

// The worker's GET /metrics: its load in Prometheus's text format, under
// names that an inference gateway's endpoint picker reads (the Gateway
// API Inference Extension's model-server protocol: the queue, the
// requests running, the KV cache's use; its flags name the metrics, e.g.
// --total-queued-requests-metric apiary_worker_requests_waiting).
// Answered without the token, as /health is: it says no more than
// /health does.

// metricsText is the body of GET /metrics.
func (w *Worker) metricsText() string {
	h := w.Health()
	w.mu.Lock()
	eng := w.eng
	w.mu.Unlock()
	var kv float64
	if c, ok := eng.(engine.CacheUsage); ok && eng != nil {
		kv = c.KVCacheUsage()
	}
	ready := 0
	if h.Status == StatusReady || h.Status == StatusBusy {
		ready = 1
	}
	return fmt.Sprintf(`# HELP apiary_worker_requests_waiting Requests admitted and waiting for a slot (the model-server protocol's TotalQueuedRequests).
# TYPE apiary_worker_requests_waiting gauge
apiary_worker_requests_waiting{model=%[1]q} %[2]d
# HELP apiary_worker_requests_running Requests being generated, one a slot (TotalRunningRequests).
# TYPE apiary_worker_requests_running gauge
apiary_worker_requests_running{model=%[1]q} %[3]d
# HELP apiary_worker_kv_cache_usage_ratio Share of the KV cache (every slot's context) the running requests hold, 0 to 1 (KVCacheUtilization).
# TYPE apiary_worker_kv_cache_usage_ratio gauge
apiary_worker_kv_cache_usage_ratio{model=%[1]q} %[4]g
# HELP apiary_worker_slots Requests the worker generates at once.
# TYPE apiary_worker_slots gauge
apiary_worker_slots{model=%[1]q} %[5]d
# HELP apiary_worker_ready 1 while the worker takes requests (ready or busy).
# TYPE apiary_worker_ready gauge
apiary_worker_ready{model=%[1]q} %[6]d
`, w.cfg.ModelRef, h.Queued, h.InFlight, kv, h.Slots, ready)
}

func (w *Worker) handleMetrics(rw http.ResponseWriter, _ *http.Request) error {
	rw.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	_, err := rw.Write([]byte(w.metricsText()))
	return err
}
