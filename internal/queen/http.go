package queen

import (
	"crypto/subtle"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/registry"
	"github.com/apiary-llm/apiary/internal/transport"
	"github.com/apiary-llm/apiary/internal/version"
)

// role is a kind of caller, named by the token it shows.
type role int

const (
	roleAdmin role = iota
	roleCluster
)

// caller is who made a request: its audit actor.
type caller struct{ actor string }

// handlerFunc is a handler that returns its error; handle maps it once.
type handlerFunc func(w http.ResponseWriter, r *http.Request, c caller) error

func (q *Queen) routes() http.Handler {
	mux := http.NewServeMux()
	open := func(fn handlerFunc) http.Handler { return q.handle(fn) }
	admin := func(fn handlerFunc) http.Handler { return q.handle(fn, roleAdmin) }
	cluster := func(fn handlerFunc) http.Handler { return q.handle(fn, roleCluster) }
	either := func(fn handlerFunc) http.Handler { return q.handle(fn, roleAdmin, roleCluster) }

	mux.Handle("GET /health", open(q.getHealth))
	mux.Handle("GET /health/live", open(q.getHealthLive))
	mux.Handle("GET /metrics", either(q.getMetrics(promhttp.HandlerFor(q.metrics.reg, promhttp.HandlerOpts{}))))

	mux.Handle("POST /v2/pools/register", cluster(q.postRegister))
	mux.Handle("POST /v2/pools/{id}/heartbeat", cluster(q.postHeartbeat))
	// A stream's body is bounded line by line (postBeats), not as a whole.
	mux.Handle("POST /v2/pools/{id}/beats", q.handleBody(q.postBeats, false, roleCluster))
	mux.Handle("POST /v2/internal/workers/events", cluster(q.postEvent))
	mux.Handle("POST /v2/workers/claim", cluster(q.postClaim))
	mux.Handle("POST /v2/workers/{id}/report", cluster(q.postWorkerReport))
	mux.Handle("POST /v2/pools/{id}/offline", cluster(q.postOffline))
	mux.Handle("GET /v2/pools", either(q.getPools))
	mux.Handle("GET /v2/pools/{id}", either(q.getPool))
	mux.Handle("POST /v2/pools/{id}/drain", admin(q.postDrain))
	mux.Handle("POST /v2/pools/{id}/undrain", admin(q.postUndrain))
	mux.Handle("DELETE /v2/pools/{id}", admin(q.deletePool))
	mux.Handle("POST /v2/internal/models/pulls", cluster(q.postPullReport))
	mux.Handle("GET /api/admin/pools/models", admin(q.getPoolModels))
	mux.Handle("POST /api/admin/pools/{id}/models/pull", admin(q.postPoolPull))
	mux.Handle("GET /api/admin/pools/{id}/models/pulls", admin(q.getPoolPulls))

	mux.Handle("GET /api/admin/workers", admin(q.getWorkers))
	mux.Handle("GET /api/admin/workers/{id}", admin(q.getWorker))
	mux.Handle("GET /api/admin/workers/{id}/logs", admin(q.getWorkerLogs))
	mux.Handle("POST /api/admin/workers", admin(q.postWorkers))
	mux.Handle("GET /api/admin/audit", admin(q.getAudit))
	mux.Handle("GET /api/admin/models", admin(q.getModels))
	mux.Handle("PUT /api/admin/models/{name}", admin(q.putModel))
	mux.Handle("POST /api/admin/models/{name}/unload", admin(q.postModelUnload))
	mux.Handle("GET /api/admin/nodes", admin(q.getNodes))
	mux.Handle("POST /api/admin/nodes", admin(q.postNode))
	mux.Handle("DELETE /api/admin/nodes/{name}", admin(q.deleteNode))
	mux.Handle("POST /api/admin/shutdown", admin(q.postShutdown))
	mux.Handle("GET /ui", open(q.getUI))
	mux.Handle("GET /ui/{file...}", open(q.getUI))
	mux.Handle("GET /api/admin/ui/snapshot", admin(q.getUISnapshot))
	mux.Handle("GET /api/admin/ui/events", admin(q.getUIEvents))
	q.routing.Routes(mux)
	q.batch.Routes(mux)
	return q.contractErrors(mux)
}

// getMetrics serves Prometheus' exposition behind the queen's tokens.
func (q *Queen) getMetrics(h http.Handler) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request, _ caller) error {
		h.ServeHTTP(w, r)
		return nil
	}
}

// contractErrors answers the mux's own 404 and 405 in the contract's
// error shape, and counts every answer. A queen without tokens answers
// only requests addressed to loopback (transport.CheckHost). A request
// for apiary's own API (/v2/…, /api/admin/…) that no route of its method
// takes is authenticated first, with either token: without one it is
// 401 like a request for a route that exists, so that a caller without
// a token cannot tell which paths and methods do.
func (q *Queen) contractErrors(mux *http.ServeMux) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := &api.StatusRecorder{ResponseWriter: w}
		_, pattern := mux.Handler(r)
		if err := q.checkHost(r); err != nil {
			writeError(sw, err)
		} else if ownAPI(r.URL.Path) && !strings.Contains(pattern, " ") {
			if _, ok := q.authenticate(r, []role{roleAdmin, roleCluster}); !ok {
				writeError(sw, fmt.Errorf("%w: missing or wrong bearer token (%s)", ErrUnauthorized, tokenNames([]role{roleAdmin, roleCluster})))
			} else {
				q.noRoute(sw, mux, r, w.Header())
			}
		} else if pattern == "" {
			q.noRoute(sw, mux, r, w.Header())
		} else {
			mux.ServeHTTP(sw, r)
		}
		q.metrics.request(sw.Code())
	})
}

// ownAPI says whether path is apiary's own API, which only its tokens
// may explore.
func ownAPI(path string) bool {
	return strings.HasPrefix(path, "/v2/") || strings.HasPrefix(path, "/api/admin/") || path == "/v2" || path == "/api/admin"
}

// noRoute answers a request no route takes: 405 when the path takes
// other methods, else 404.
func (q *Queen) noRoute(sw *api.StatusRecorder, mux *http.ServeMux, r *http.Request, h http.Header) {
	probe := &api.StatusRecorder{ResponseWriter: discardWriter{h: h}}
	mux.ServeHTTP(probe, r)
	if probe.Status == http.StatusMethodNotAllowed {
		writeError(sw, fmt.Errorf("%w: %s %s", errMethodNotAllowed, r.Method, r.URL.Path))
		return
	}
	writeError(sw, &api.RequestError{Status: http.StatusNotFound, Code: "not_found", Err: fmt.Errorf("no such endpoint: %s %s", r.Method, r.URL.Path)})
}

type discardWriter struct{ h http.Header }

func (d discardWriter) Header() http.Header         { return d.h }
func (d discardWriter) Write(b []byte) (int, error) { return len(b), nil }
func (d discardWriter) WriteHeader(int)             {}

// checkHost is transport.CheckHost when the queen runs without tokens.
func (q *Queen) checkHost(r *http.Request) error {
	if q.cfg.Tokens.None() {
		return transport.CheckHost(r)
	}
	return nil
}

// handle authenticates (any of roles; none: open), refuses what a
// browser can forge on authenticated endpoints, limits the body, runs fn
// and maps its error.
func (q *Queen) handle(fn handlerFunc, roles ...role) http.Handler {
	return q.handleBody(fn, true, roles...)
}

// handleBody is handle, with the body limited to MaxBodyBytes or not
// (a stream that bounds each of its lines itself).
func (q *Queen) handleBody(fn handlerFunc, limit bool, roles ...role) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !limit {
			// A refusal goes out at once, without first reading to the
			// end of a body that does not end (HTTP/2 always allows it).
			_ = http.NewResponseController(w).EnableFullDuplex()
		}
		if len(roles) > 0 {
			if err := transport.CheckNotForged(r); err != nil {
				writeError(w, err)
				return
			}
		}
		c, ok := q.authenticate(r, roles)
		if !ok {
			if len(roles) == 1 && roles[0] == roleCluster {
				q.hiveRefused(r)
			}
			writeError(w, fmt.Errorf("%w: missing or wrong bearer token (%s)", ErrUnauthorized, tokenNames(roles)))
			return
		}
		if limit {
			r.Body = http.MaxBytesReader(w, r.Body, q.cfg.MaxBodyBytes)
		}
		if err := fn(w, r, c); err != nil {
			status, _ := api.StatusOf(err)
			switch {
			case r.Context().Err() != nil:
				// The client went away (an apiary infer that ended, a
				// page closed): nobody reads the answer, and it is not
				// the queen's failure.
				q.log.Debug("request ended: the client went away", "method", r.Method, "path", r.URL.Path, "err", err)
			case status >= 500:
				q.log.Error("request failed", "method", r.Method, "path", r.URL.Path, "err", err)
			}
			writeError(w, err)
		}
	})
}

// authenticate compares the bearer token with each allowed role's token in
// constant time. Without tokens (Tokens.open) everyone is admitted: the
// queen then listens on loopback only and answers only requests addressed
// there; Validate refuses a partial set of tokens.
func (q *Queen) authenticate(r *http.Request, roles []role) (caller, bool) {
	if len(roles) == 0 {
		return caller{actor: "anonymous"}, true
	}
	got := []byte(api.Bearer(r))
	for _, ro := range roles {
		token, actor := q.cfg.Tokens.Admin, "admin"
		if ro == roleCluster {
			token, actor = q.cfg.Tokens.Cluster, "cluster"
		}
		if token == "" || subtle.ConstantTimeCompare(got, []byte(token)) == 1 {
			return caller{actor: actor}, true
		}
	}
	return caller{}, false
}

func tokenNames(roles []role) string {
	var names []string
	for _, ro := range roles {
		if ro == roleAdmin {
			names = append(names, AdminTokenEnv)
		} else {
			names = append(names, ClusterTokenEnv)
		}
	}
	return strings.Join(names, " or ")
}

// query checks that r has no query parameters but allowed, and returns
// them.
func query(r *http.Request, allowed ...string) (map[string]string, error) {
	out := map[string]string{}
	for k, vs := range r.URL.Query() {
		ok := false
		for _, a := range allowed {
			ok = ok || a == k
		}
		if !ok {
			return nil, api.BadRequest("unknown query parameter %q (allowed: %s)", k, strings.Join(allowed, ", "))
		}
		if len(vs) > 1 {
			return nil, api.BadRequest("query parameter %q given %d times", k, len(vs))
		}
		out[k] = vs[0]
	}
	return out, nil
}

// Input limits.
const (
	maxReasonLen = 1000
	maxGPUs      = 256
	maxWorkers   = registry.MaxWorkersPerPool
)

// checkID is api.CheckID: the hives check ids the same way.
func checkID(what, s string) error { return api.CheckID(what, s) }

func checkModel(s string) error { return api.CheckModel(s) }

func checkLifecycleID(s string) error {
	if !api.IsLifecycleID(s) {
		return api.BadRequest("lifecycle id %q is not valid (want wk- and 16 hex digits)", s)
	}
	return nil
}

// checkReason requires a reason: one line of printable text.
func checkReason(s string) (string, error) {
	s = strings.TrimSpace(s)
	switch {
	case s == "":
		return "", api.BadRequest("reason is required: say why, for the audit log")
	case len(s) > maxReasonLen:
		return "", api.BadRequest("reason is longer than %d bytes", maxReasonLen)
	case strings.IndexFunc(s, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0:
		return "", api.BadRequest("reason must be printable text on one line")
	}
	return s, nil
}

func (q *Queen) getHealth(w http.ResponseWriter, _ *http.Request, _ caller) error {
	api.WriteJSON(w, http.StatusOK, api.Health{Status: "ok", Version: version.Version, Tokens: !q.cfg.Tokens.None()})
	return nil
}

// getHealthLive is the liveness of the process, for a watchdog: 200
// whenever the queen answers, active or standby (a standby's /health is
// 503, so that a load balancer skips it; restarting it would not help).
func (q *Queen) getHealthLive(w http.ResponseWriter, _ *http.Request, _ caller) error {
	api.WriteJSON(w, http.StatusOK, api.Liveness{Status: "live", Role: "active", Version: version.Version})
	return nil
}

// parseSince accepts a Go duration (1h: entries of the last hour) or an
// RFC 3339 time.
func parseSince(s string, now time.Time) (time.Time, error) { return parseTime("since", s, now) }

// parseTime reads the query parameter name: a Go duration before now
// (1h: an hour ago) or an RFC 3339 time.
func parseTime(name, s string, now time.Time) (time.Time, error) {
	if d, err := time.ParseDuration(s); err == nil {
		if d < 0 {
			return time.Time{}, api.BadRequest("%s %q must not be negative", name, s)
		}
		return now.Add(-d), nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	return time.Time{}, api.BadRequest("%s %q is neither a duration (e.g. 1h, 30m) nor an RFC 3339 time", name, api.Printable(s, 100))
}

func parseLimit(s string, def, maxN int) (int, error) {
	if s == "" {
		return def, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > maxN {
		return 0, api.BadRequest("limit %q must be a number from 1 to %d", s, maxN)
	}
	return n, nil
}

// hiveRefused records a call to a hive endpoint refused for its token: a
// hive with a wrong or missing APIARY_CLUSTER_TOKEN would otherwise run
// "standalone" with a warning only in its own log. Counted
// (apiary_queen_hive_calls_refused_total) and logged, once a minute per
// caller address.
func (q *Queen) hiveRefused(r *http.Request) {
	pattern := r.Pattern
	if _, p, ok := strings.Cut(pattern, " "); ok {
		pattern = p
	}
	q.metrics.refusedHiveCalls.WithLabelValues(pattern).Inc()
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	now := time.Now()
	q.refusedMu.Lock()
	last, seen := q.refusedAt[host]
	if !seen || now.Sub(last) >= time.Minute {
		if len(q.refusedAt) >= 1024 {
			clear(q.refusedAt)
		}
		q.refusedAt[host] = now
	}
	q.refusedMu.Unlock()
	if !seen || now.Sub(last) >= time.Minute {
		q.log.Warn("refused a hive's call: missing or wrong cluster token (APIARY_CLUSTER_TOKEN must be the queen's); logged once a minute per address",
			"remote", host, "endpoint", pattern, "pool_id", api.Printable(r.PathValue("id"), 100))
	}
}
