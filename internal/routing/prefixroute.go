package routing

import (
	"net/http"

	"github.com/apiary-llm/apiary/internal/api"
)

// prefixRoute is how the prefix policy routed one request: its text's
// blocks, the decision, and the worker's requests in flight beside it
// (the answer's prompt time is scaled by them).
type prefixRoute struct {
	key      prefixKey
	why      routeWhy
	inflight int // the worker's requests from the queen, this one not counted
}

// header is the X-Apiary-Route value.
func (p *prefixRoute) header() string { return p.why.String(p.key.bytes) }

// pickLocked is the routing decision for req: a session's pinned worker,
// the prefix policy (Config.Routing RoutePrefix, for a request with a
// text to hash), else pick's least loaded. route is nil unless the
// prefix policy chose.
func (r *router) pickLocked(req routeReq, cands []Candidate, counts []*int, slots int, pin *WorkerKey) (pickResult, *prefixRoute) {
	if req.prefix == nil {
		return pick(cands, counts, slots, pin, req.exclude), nil
	}
	if pin != nil {
		res := pick(cands, counts, slots, pin, req.exclude)
		if res.index < 0 {
			return res, nil
		}
		return res, &prefixRoute{key: *req.prefix, why: routeWhy{pinned: res.pinned, coldMS: -1}}
	}
	est := make([]prefixEstimate, len(cands))
	r.prefix.estimates(cands, *req.prefix, est)
	i, why := pickPrefix(cands, counts, slots, req.exclude, req.prefix.bytes, est)
	if i < 0 {
		return pickResult{index: -1}, nil
	}
	return pickResult{index: i}, &prefixRoute{key: *req.prefix, why: why}
}

// learn records what a worker's answer said of its cache (its
// api.PrefixTrailer) for the request routed with p, and counts the
// prompt tokens it found cached.
func (s *Service) learn(l lease, trailer string) {
	rep, ok := api.ParsePrefixReport(trailer)
	if ok {
		s.m.promptTokens.WithLabelValues(l.model).Add(float64(rep.Prompt))
		s.m.cachedTokens.WithLabelValues(l.model).Add(float64(rep.Cached))
	}
	if l.route == nil {
		return
	}
	slots := s.cfg.WorkerSlots
	if s.router.slots != nil {
		slots = s.router.slots(l.model)
	}
	s.router.prefix.record(l.cand.Key, l.route.key, rep, ok, l.route.inflight, slots)
}

// routeSession is a Finished.Route: the worker a session id is pinned to.
const routeSession = "session"

// routed says how l was chosen: the X-Apiary-Route header, a Debug log
// line, and the prefix routes' hit rate.
func (s *Service) routed(w http.ResponseWriter, l lease, rr relayReq) {
	why, kind := RouteLeastLoaded, RouteLeastLoaded
	switch {
	case l.route != nil && l.route.why.pinned:
		why, kind = l.route.header(), routeSession
	case l.route != nil:
		why, kind = l.route.header(), "prefix miss"
		result := "miss"
		if l.route.why.hit {
			result, kind = "hit", "prefix hit"
		}
		s.m.prefixRoutes.WithLabelValues(result).Inc()
	case l.pinned:
		why, kind = "session: the worker X-Session-Id is pinned to", routeSession
	}
	if rr.stats != nil {
		rr.stats.route = kind
	}
	w.Header().Set(api.RouteHeader, why)
	s.log.Debug("request routed", "model_ref", rr.model, "lifecycle_id", l.cand.LifecycleID, "route", why)
}
