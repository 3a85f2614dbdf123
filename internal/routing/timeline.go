package routing

import (
	"log/slog"
	"net/http/httptrace"
	"time"
)

// relayTimeline is where an interactive request's time went in the
// queen, logged at Debug when it is answered: the wait for a lease, the
// connection to the worker (and whether an idle one was reused), the
// worker's answer headers (sent once it has a slot), and the first event
// relayed. Its methods do nothing on a nil timeline (Debug off). The
// worker's "generation timeline" and its engine's "sequence timeline"
// go on from the request's arrival there.
type relayTimeline struct {
	attempts int
	grant    time.Time
	gotConn  time.Time
	reused   bool
	wrote    time.Time
	head     time.Time
	first    time.Time
}

func (t *relayTimeline) granted(attempt int) {
	if t != nil {
		t.attempts, t.grant = attempt, time.Now()
	}
}

func (t *relayTimeline) trace() *httptrace.ClientTrace {
	return &httptrace.ClientTrace{
		GotConn: func(i httptrace.GotConnInfo) { t.gotConn, t.reused = time.Now(), i.Reused },
		WroteRequest: func(httptrace.WroteRequestInfo) {
			t.wrote = time.Now()
		},
	}
}

func (t *relayTimeline) headers() {
	if t != nil {
		t.head = time.Now()
	}
}

func (t *relayTimeline) firstEvent(now time.Time) {
	if t != nil && t.first.IsZero() {
		t.first = now
	}
}

func (t *relayTimeline) log(log *slog.Logger, rr relayReq) {
	us := func(a time.Time) int64 {
		if a.IsZero() {
			return -1
		}
		return a.Sub(rr.start).Microseconds()
	}
	log.Debug("relay timeline", "model_ref", rr.model, "path", rr.path, "stream", rr.stream, "start", rr.start, "attempts", t.attempts,
		"grant_us", us(t.grant), "conn_us", us(t.gotConn), "conn_reused", t.reused, "sent_us", us(t.wrote),
		"headers_us", us(t.head), "first_event_us", us(t.first))
}
