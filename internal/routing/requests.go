package routing

import (
	"bytes"
	"encoding/json"
	"sync"
	"time"
)

// Finished is one request as the dashboard's recent requests list it:
// what the queen saw of it and what the worker's answer said of its
// tokens. A field the answer did not give is nil.
type Finished struct {
	At       time.Time // arrival at the queen
	Endpoint string    // the API endpoint (chat_completions, ollama_chat, …)
	// Model is the model by its configured name (its file when the
	// config names it not); Worker the lifecycle id of the worker that
	// answered ("" when none did).
	Model  string
	Worker string
	// Route is how the worker was chosen: "prefix hit", "prefix miss"
	// (--routing prefix), "least-loaded", "session" (X-Session-Id); ""
	// when none was.
	Route  string
	Stream bool
	// Status is the HTTP status the client got (499: it went away).
	Status int
	// Tokens, from the answer's usage: prompt, completion, and the prompt
	// tokens the worker's cache held (prompt_tokens_details.cached_tokens).
	PromptTokens, CompletionTokens, CachedTokens *int
	// TTFT is the time from the request's arrival at the queen to the
	// first token: a stream's first event, or a whole answer's end less
	// the time its worker spent generating (its timings' predicted_ms).
	TTFT *time.Duration
	// TokensPerSecond is the generation's speed: the worker's own
	// (timings.predicted_per_second), else, for a stream, its events
	// after the first over the time they took at the queen.
	TokensPerSecond *float64
	Duration        time.Duration // arrival to the answer's end
}

// reqStats is what the relay learns of a request's answer, for Finished.
// One request's alone (its handler's goroutine).
type reqStats struct {
	stream bool
	worker string
	route  string // see Finished.Route
	usage  *answerUsage
	timing *answerTimings
	// A stream's data events, and when the first and the last came.
	events      int
	first, last time.Time
	end         time.Time
}

// answerUsage is the part of an answer's usage the list shows.
type answerUsage struct {
	PromptTokens     *int `json:"prompt_tokens"`
	CompletionTokens *int `json:"completion_tokens"`
	Details          *struct {
		CachedTokens *int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

// answerTimings is the part of llama-server's timings the list shows.
type answerTimings struct {
	PredictedMS        float64 `json:"predicted_ms"`
	PredictedPerSecond float64 `json:"predicted_per_second"`
}

var (
	usageKey   = []byte(`"usage":`)
	timingsKey = []byte(`"timings":`)
)

// readTail takes the usage and timings objects from b, the end of an
// answer (or one stream event): they are the last fields llama-server
// and apiary's workers write. What is not there, or does not decode,
// is left as it was.
func (st *reqStats) readTail(b []byte) {
	if i := bytes.LastIndex(b, usageKey); i >= 0 {
		var u answerUsage
		if json.NewDecoder(bytes.NewReader(b[i+len(usageKey):])).Decode(&u) == nil && (u.PromptTokens != nil || u.CompletionTokens != nil) {
			st.usage = &u
		}
	}
	if i := bytes.LastIndex(b, timingsKey); i >= 0 {
		var t answerTimings
		if json.NewDecoder(bytes.NewReader(b[i+len(timingsKey):])).Decode(&t) == nil && t.PredictedMS > 0 {
			st.timing = &t
		}
	}
}

// finished is the record of a request that arrived at start and ended
// with status.
func (st *reqStats) finished(start time.Time, endpoint, model string, stream bool, status int) Finished {
	end := st.end
	if end.IsZero() {
		end = time.Now()
	}
	f := Finished{At: start, Endpoint: endpoint, Model: model, Worker: st.worker, Route: st.route, Stream: stream, Status: status, Duration: end.Sub(start)}
	if u := st.usage; u != nil {
		f.PromptTokens, f.CompletionTokens = u.PromptTokens, u.CompletionTokens
		if u.Details != nil {
			f.CachedTokens = u.Details.CachedTokens
		}
	}
	switch {
	case !st.first.IsZero():
		ttft := st.first.Sub(start)
		f.TTFT = &ttft
	case st.timing != nil && status == 200:
		ttft := max(0, end.Sub(start)-time.Duration(st.timing.PredictedMS*float64(time.Millisecond)))
		f.TTFT = &ttft
	}
	switch {
	case st.timing != nil && st.timing.PredictedPerSecond > 0:
		tps := st.timing.PredictedPerSecond
		f.TokensPerSecond = &tps
	case st.events > 1 && st.last.After(st.first):
		tps := float64(st.events-1) / st.last.Sub(st.first).Seconds()
		f.TokensPerSecond = &tps
	}
	return f
}

// tailSize bounds what of a whole answer is kept to read its usage and
// timings from: its last bytes.
const tailSize = 4 << 10

// tailWriter keeps the last tailSize bytes written to it.
type tailWriter struct {
	buf []byte
}

var tailPool = sync.Pool{New: func() any { return &tailWriter{buf: make([]byte, 0, 2*tailSize)} }}

func (t *tailWriter) Write(p []byte) (int, error) {
	if len(p) >= tailSize {
		t.buf = append(t.buf[:0], p[len(p)-tailSize:]...)
		return len(p), nil
	}
	if len(t.buf)+len(p) > cap(t.buf) {
		keep := t.buf[len(t.buf)-min(len(t.buf), tailSize-len(p)):]
		t.buf = append(t.buf[:0], keep...)
	}
	t.buf = append(t.buf, p...)
	return len(p), nil
}

// streamEvent counts one data event of a stream that came at now, and
// reads its usage and timings when it has them (llama-server sends them
// with its last chunk).
func (st *reqStats) streamEvent(ev []byte, now time.Time) {
	if st.first.IsZero() {
		st.first = now
	}
	st.events++
	st.last, st.end = now, now
	if bytes.Contains(ev, usageKey) || bytes.Contains(ev, timingsKey) {
		st.readTail(ev)
	}
}
