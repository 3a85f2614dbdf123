package worker

import (
	"context"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"
)

// timeline is where one generation's time went, logged at Debug when it
// ends (nil, and free, when Debug is off): from the handler's start to
// its slot (admit), to its first stream event written, and for a client
// that went away, from then to the slot freed. The queen's own
// timeline (routing's "relay timeline") and the engine's ("sequence
// timeline") complete it.
type timeline struct {
	w          *Worker
	endpoint   string
	stream     bool
	start      time.Time
	admitted   time.Time
	firstEvent time.Time
	// firstTokens is how many tokens the first event carries: more than
	// one when the text filter held the first ones back (a partial UTF-8
	// character, a possible stop sequence's start).
	firstTokens int
	arrival     any          // the request's arrival (a time.Time, or nil)
	gone        atomic.Int64 // unix ns the client went away, 0 if it did not
	stop        func() bool
}

// arrivalKey is the context key of a request's arrival time, set (at
// Debug only) before any handler runs.
type arrivalKey struct{}

func (w *Worker) markArrival(r *http.Request) *http.Request {
	if !w.log.Enabled(r.Context(), slog.LevelDebug) {
		return r
	}
	return r.WithContext(context.WithValue(r.Context(), arrivalKey{}, time.Now()))
}

func (w *Worker) newTimeline(ctx context.Context, endpoint string, stream bool) *timeline {
	if !w.log.Enabled(ctx, slog.LevelDebug) {
		return nil
	}
	t := &timeline{w: w, endpoint: endpoint, stream: stream, start: time.Now(), arrival: ctx.Value(arrivalKey{})}
	t.stop = context.AfterFunc(ctx, func() { t.gone.Store(time.Now().UnixNano()) })
	return t
}

// log is deferred before the slot's release, so it runs after it:
// "freed" is the time it is called.
func (t *timeline) log() {
	if t == nil {
		return
	}
	t.stop()
	now := time.Now()
	attrs := []any{"endpoint", t.endpoint, "stream", t.stream, "start", t.start, "admit_us", t.admitted.Sub(t.start).Microseconds()}
	if at, ok := t.arrival.(time.Time); ok {
		attrs = append(attrs, "arrived_us", at.Sub(t.start).Microseconds()) // before start: negative
	}
	if !t.firstEvent.IsZero() {
		attrs = append(attrs, "first_event_us", t.firstEvent.Sub(t.start).Microseconds(), "first_event_tokens", t.firstTokens)
	}
	if at := t.gone.Load(); at != 0 {
		attrs = append(attrs, "gone_to_freed_us", now.Sub(time.Unix(0, at)).Microseconds())
	}
	t.w.log.Debug("generation timeline", attrs...)
}
