package queen

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/jsonl"
	"github.com/apiary-llm/apiary/internal/registry"
)

// beatReadBuffer is the read buffer of one heartbeat stream: an unchanged
// beat's line fits many times; a full one longer than it is gathered.
const beatReadBuffer = 1 << 10

// postBeats serves a pool's heartbeat stream (POST /v2/pools/{id}/beats):
// the request body is the hive's heartbeats, one JSON object a line as
// POST /v2/pools/{id}/heartbeat takes them, and the answer is one line
// for each, in order: the HeartbeatAnswer, or the error that request
// would have been answered with alone, as an api.LineError. A hive then
// pays for one connection and one request for its whole life instead of
// one request a beat, and so does the queen.
//
// The stream ends when the hive ends it, when no beat comes for the
// heartbeat timeout (the pool goes unhealthy then anyway), at a line over
// the body limit (answered 413 first: the stream cannot be read on after
// it), at the first beat after the queen stepped down (answered 503
// standby, as a standby answers), or when the queen shuts down.
func (q *Queen) postBeats(w http.ResponseWriter, r *http.Request, _ caller) error {
	id := r.PathValue("id")
	if err := checkID("pool id", id); err != nil {
		return err
	}
	rc := http.NewResponseController(w) // full duplex: see handleBody
	if strings.EqualFold(r.Header.Get("Expect"), "100-continue") {
		// The answer's head goes out before the first beat is read, and
		// an HTTP/1.1 head before "100 Continue" tells the client not to
		// send its body at all: the hive's first beat would then fail
		// with a closed pipe, or not, by the scheduler's whim.
		w.WriteHeader(http.StatusContinue)
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	if err := rc.Flush(); err != nil {
		return nil // the hive is gone
	}
	if q.followers != nil { // a shutting-down queen ends every stream
		defer context.AfterFunc(q.followers, func() { _ = rc.SetReadDeadline(time.Now()) })()
	}
	lines := jsonl.NewReader(r.Body, beatReadBuffer, int(q.cfg.MaxBodyBytes))
	// The last plain answer (no entry refused), encoded: nearly every beat
	// of a stream gets the same one.
	var last struct {
		status     string
		fullWanted bool
		line       []byte
	}
	var hb api.Heartbeat // one for the stream: decoding into it makes it escape
	var dec api.LineDecoder
	// The arrays the registry left this stream (the last beat's, or
	// those it replaced), which the next beat is decoded into, and the
	// worker URIs checked.
	var st beatStream
	instance := hiveInstance(r) // the stream's hive, checked at each beat
	for {
		// The deadline first, the shutdown check after: a shutdown that
		// comes between them still ends the read.
		_ = rc.SetReadDeadline(time.Now().Add(q.cfg.HeartbeatTimeout))
		if q.followers != nil && q.followers.Err() != nil {
			return nil
		}
		line, err := lines.Next()
		switch {
		case errors.Is(err, jsonl.ErrTooLong):
			q.writeBeatLine(w, rc, api.FailLine(&api.RequestError{Status: http.StatusRequestEntityTooLarge, Code: "body_too_large",
				Err: fmt.Errorf("a heartbeat line over %d bytes; the stream ends", q.cfg.MaxBodyBytes)}, "queen"))
			return nil
		case errors.Is(err, os.ErrDeadlineExceeded) && (q.followers == nil || q.followers.Err() == nil):
			q.log.Warn("heartbeat stream ended: no beat within the heartbeat timeout", "pool_id", id, "timeout", q.cfg.HeartbeatTimeout)
			return nil
		case err != nil: // the hive ended it (io.EOF), went away, or the queen stops
			return nil
		case q.deposed():
			// As a standby answers: the hive moves to the next queen.
			q.writeBeatLine(w, rc, api.FailLine(ErrSteppedDown, "queen"))
			return nil
		}
		// Zeroed first: the decoder writes only the fields a line has.
		clear(st.spares.GPUs[:cap(st.spares.GPUs)])
		clear(st.spares.Workers[:cap(st.spares.Workers)])
		hb = api.Heartbeat{GPUs: st.spares.GPUs[:0], Workers: st.spares.Workers[:0]}
		st.spares = registry.Spares{} // filled again by the registry
		ans, err := api.HeartbeatAnswer{}, dec.Decode(line, &hb)
		if err == nil {
			ans, err = q.takeBeat(r.Context(), id, instance, hb, &st)
		}
		var ok bool
		switch plain := len(ans.Refused) == 0; {
		case err != nil:
			if status, _ := api.StatusOf(err); status >= 500 {
				q.log.Error("heartbeat failed", "pool_id", id, "err", err)
			}
			ok = q.writeBeatLine(w, rc, api.FailLine(err, "queen"))
		case plain && last.line != nil && ans.Status == last.status && ans.FullWanted == last.fullWanted:
			ok = q.writeBeatBytes(w, rc, last.line)
		case plain:
			b, _ := json.Marshal(ans)
			last.status, last.fullWanted, last.line = ans.Status, ans.FullWanted, append(b, '\n')
			ok = q.writeBeatBytes(w, rc, last.line)
		default:
			ok = q.writeBeatLine(w, rc, ans)
		}
		if !ok {
			return nil
		}
	}
}

// writeBeatLine writes one answer line of a heartbeat stream.
func (q *Queen) writeBeatLine(w io.Writer, rc *http.ResponseController, v any) bool {
	b, err := json.Marshal(v)
	if err != nil {
		return false
	}
	return q.writeBeatBytes(w, rc, append(b, '\n'))
}

// writeBeatBytes writes and flushes an encoded answer line, within the
// heartbeat timeout: a hive that reads no answers ends its stream.
func (q *Queen) writeBeatBytes(w io.Writer, rc *http.ResponseController, line []byte) bool {
	_ = rc.SetWriteDeadline(time.Now().Add(q.cfg.HeartbeatTimeout))
	if _, err := w.Write(line); err != nil {
		return false
	}
	return rc.Flush() == nil
}
