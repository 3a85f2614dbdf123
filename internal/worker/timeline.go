package worker

import (
	"context"
	"log/slog"
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
	gone       atomic.Int64 // unix ns the client went away, 0 if it did not
	stop       func() bool
}

func (w *Worker) newTimeline(ctx context.Context, endpoint string, stream bool) *timeline {
	if !w.log.Enabled(ctx, slog.LevelDebug) {
		return nil
	}
	t := &timeline{w: w, endpoint: endpoint, stream: stream, start: time.Now()}
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
	if !t.firstEvent.IsZero() {
		attrs = append(attrs, "first_event_us", t.firstEvent.Sub(t.start).Microseconds())
	}
	if at := t.gone.Load(); at != 0 {
		attrs = append(attrs, "gone_to_freed_us", now.Sub(time.Unix(0, at)).Microseconds())
	}
	t.w.log.Debug("generation timeline", attrs...)
}
