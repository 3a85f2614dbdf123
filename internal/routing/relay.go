package routing

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync"
	"time"

	"github.com/apiary-llm/apiary/internal/anthropic"
	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/openai"
	"github.com/apiary-llm/apiary/internal/rpc"
)

// relayReq is a checked OpenAI request on its way to a worker.
type relayReq struct {
	model   string
	pool    string // pinned to this pool (X-Apiary-Pool); "": any
	path    string // /v1/completions or /v1/chat/completions
	body    []byte // as the client sent it
	sent    int64  // the body's size as the client sent it, before a translation (checkBodySize)
	stream  bool
	session string
	start   time.Time // arrival at the queen
	// anthropic: Anthropic's /v1/messages, whose errors and stream
	// events have their own shapes.
	anthropic bool
	// batch: a Batch API request, sent on the batch requests' own
	// connections (Service.upBatch).
	batch bool
	// name is the model as the client named it, when that is a configured
	// name or alias of model (the worker answers with it).
	name string
	// tl records where the time went, for the Debug log (nil: Debug is off).
	tl *relayTimeline
	// granted, when set, learns how long the request waited for its
	// first worker.
	granted func(waited time.Duration)
	// stats, when set, learns what the answer said of its tokens.
	stats *reqStats
}

// outcome is how one attempt on one worker ended.
type outcome struct {
	// retry: nothing reached the client; another worker may be tried.
	retry bool
	// verdict is what the attempt says of the worker, for its strikes:
	// verdictBroken (it failed the connection: refused, reset, or a
	// stream that ended without its end) also keeps it out of routing for
	// a while and has it checked.
	verdict verdict
	// started: the answer to the client began.
	started bool
	err     error
	// prefix is the worker's api.PrefixTrailer, read at the answer's end.
	prefix string
}

// relay sends rr to a worker of its model and relays the answer. The
// request waits in the router's queue while no worker has a free slot.
// Until the first byte reaches the client, a worker that fails (refused
// connection, 5xx, a stream that breaks before its first event) is left
// out and another is tried, up to maxAttempts; after it, a worker that
// fails ends the stream with an error event.
func (s *Service) relay(w http.ResponseWriter, r *http.Request, rr relayReq) error {
	rt := s
	ctx := r.Context()
	if s.log.Enabled(ctx, slog.LevelDebug) {
		rr.tl = &relayTimeline{}
		defer rr.tl.log(s.log, rr)
	}
	exclude := map[WorkerKey]bool{}
	var last error
	var prefix *prefixKey
	if s.cfg.Routing == RoutePrefix && !rr.batch {
		k := requestPrefix(s.prefixSeed, rr.body)
		prefix = &k
	}
	for attempt := 1; attempt <= maxAttempts; attempt++ {
		l, err := rt.router.acquire(ctx, routeReq{model: rr.model, pool: rr.pool, session: rr.session, exclude: exclude, retry: attempt > 1, prefix: prefix})
		if err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("%w: while waiting for a worker: %w", errClientGone, err)
			}
			if last != nil {
				// The workers' failures name them and their addresses:
				// the log has them, the client reads that they failed.
				why := fmt.Sprintf("%s (after %d workers failed)", openai.PublicText(err), attempt-1)
				if p := (interface{ PublicMessage() string })(nil); errors.As(last, &p) {
					why = fmt.Sprintf("%s (after %d workers failed; the last: %s)", openai.PublicText(err), attempt-1, p.PublicMessage())
				}
				return openai.Public(fmt.Errorf("%w (after: %w)", err, last), "%s", why)
			}
			return err
		}
		rr.tl.granted(attempt)
		if rr.granted != nil && attempt == 1 {
			rr.granted(time.Since(rr.start))
		}
		if rr.session != "" && attempt == 1 {
			result := "miss"
			if l.pinned {
				result = "hit"
			}
			rt.m.affinity.WithLabelValues(result).Inc()
		}
		w.Header().Set(api.WorkerHeader, l.cand.LifecycleID)
		if rr.stats != nil {
			rr.stats.worker = l.cand.LifecycleID
		}
		s.routed(w, l, rr)
		o := s.attempt(ctx, w, l, rr)
		if o.verdict == verdictServed {
			s.learn(l, o.prefix)
		}
		broken := o.verdict == verdictBroken
		if step := rt.router.settle(l, o.verdict, o.err); step != stepNone || o.verdict == verdictFailed || broken {
			s.wakeStrikes() // the step's effects; the watcher also sweeps the entry once its row ends
		}
		if broken {
			s.suspect(l, o.err)
		}
		if !o.retry {
			return o.err
		}
		exclude[l.cand.Key] = true
		last = o.err
		reason := "worker_error"
		if broken {
			reason = "connection"
		}
		rt.m.retries.WithLabelValues(rr.model, reason).Inc()
		s.log.Warn("worker failed before the first byte; trying another", "model_ref", rr.model, "lifecycle_id", l.cand.LifecycleID,
			"attempt", attempt, "err", o.err)
	}
	// The client reads that the workers failed, and the last one's status
	// and code when it answered; the log has each worker and why.
	if ue := new(upstreamError); errors.As(last, &ue) {
		// The workers' own answer (a 503 busy, say) says how to answer.
		return openai.Public(fmt.Errorf("%s: %d workers failed: %w", ErrUpstream, maxAttempts, last),
			"%s: %d workers failed; the last answered %d %s", ErrUpstream, maxAttempts, ue.status, ue.code)
	}
	return openai.Public(fmt.Errorf("%w: %d workers failed: %w", ErrUpstream, maxAttempts, last),
		"%s: %d workers failed", ErrUpstream, maxAttempts)
}

// attempt sends rr to the leased worker and relays its answer.
func (s *Service) attempt(ctx context.Context, w http.ResponseWriter, l lease, rr relayReq) outcome {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(l.cand.URI, "/")+rr.path, bytes.NewReader(rr.body))
	if err != nil {
		return outcome{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	if l.cand.Token != "" {
		req.Header.Set("Authorization", "Bearer "+l.cand.Token)
	}
	if rr.stream {
		req.Header.Set("Accept", "text/event-stream")
	}
	if rr.batch {
		req.Header.Set(api.BatchHeader, "1")
	}
	if rr.name != "" {
		req.Header.Set(api.ModelNameHeader, rr.name)
	}
	if rr.tl != nil {
		req = req.WithContext(httptrace.WithClientTrace(ctx, rr.tl.trace()))
	}
	// Straight to the transport: the client would only add its redirect
	// handling (it follows none) and a copy of the headers for it.
	rt := s.up.Transport
	if rr.batch {
		rt = s.upBatch
	}
	resp, err := rt.RoundTrip(req)
	rr.tl.headers()
	if err != nil {
		if ctx.Err() != nil {
			return outcome{err: fmt.Errorf("%w: %w", errClientGone, context.Cause(ctx))}
		}
		// Clients read this reason (a refusal names the last one): the
		// network's words, not the worker's address.
		return outcome{retry: true, verdict: verdictBroken, err: fmt.Errorf("worker %s did not answer: %s", l.cand.LifecycleID, workerNetReason(err))}
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode >= 500:
		// A 503 is the worker's honest "not now" (loading, draining, its
		// queue full): tried elsewhere, but not a strike.
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		v := verdictFailed
		if resp.StatusCode == http.StatusServiceUnavailable {
			v = verdictNone
		}
		return outcome{retry: true, verdict: v, err: workerAnswer(resp.StatusCode, data)}
	case resp.StatusCode != http.StatusOK:
		// The client's fault (400, 404 …): the worker's error is the
		// answer, when it is one. Anything else (a redirect, a page, a
		// body of another shape) is not the worker's to send on.
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		if resp.StatusCode == http.StatusUnauthorized {
			// The queen's token for it is stale or lost: its hive is
			// asked for it again (a strike still: a worker that refuses
			// every token is stopped as any failing one).
			s.cp.TokenRefused(l.cand.Key.Pool, l.cand.Key.Worker)
			return outcome{retry: true, verdict: verdictFailed, err: fmt.Errorf("worker %s refused the queen's token for it (401); its hive is asked for it again", l.cand.LifecycleID)}
		}
		if rr.anthropic {
			ae, ok := anthropicClientError(resp.StatusCode, data)
			if !ok {
				return outcome{retry: true, verdict: verdictFailed, err: openai.Public(fmt.Errorf("worker %s answered %s without an Anthropic error", l.cand.LifecycleID, resp.Status),
					"a worker answered %s without an Anthropic error", resp.Status)}
			}
			anthropic.WriteError(w, ae)
			return outcome{started: true}
		}
		oe, ok := clientError(resp.StatusCode, data)
		if !ok {
			return outcome{retry: true, verdict: verdictFailed, err: openai.Public(fmt.Errorf("worker %s answered %s without an OpenAI error", l.cand.LifecycleID, resp.Status),
				"a worker answered %s without an OpenAI error", resp.Status)}
		}
		openai.WriteError(w, oe)
		return outcome{started: true}
	case rr.stream && strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream"):
		return s.relayStream(ctx, w, resp, l, rr)
	case strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json"):
		return s.copyAnswer(w, resp, rr.stats)
	default:
		ct := api.Printable(resp.Header.Get("Content-Type"), 100)
		return outcome{retry: true, verdict: verdictFailed, err: openai.Public(fmt.Errorf("worker %s answered 200 with Content-Type %q, not an OpenAI answer",
			l.cand.LifecycleID, ct), "a worker answered 200 with Content-Type %q, not an OpenAI answer", ct)}
	}
}

// clientError reads a worker's 4xx answer as an OpenAI error, its text
// kept printable and bounded; ok is false for any other status or shape,
// and for 401 and 403: a worker that refuses the queen is the queen's
// problem, not the client's.
func clientError(status int, data []byte) (*openai.Error, bool) {
	var e openai.ErrorResponse
	if status < 400 || status >= 500 || status == http.StatusUnauthorized || status == http.StatusForbidden || json.Unmarshal(data, &e) != nil || e.Error.Code == "" || e.Error.Message == "" {
		return nil, false
	}
	oe := &openai.Error{Status: status, Code: api.Printable(e.Error.Code, 64), Type: api.Printable(e.Error.Type, 64),
		Message: api.Printable(e.Error.Message, api.MaxRemoteMessage)}
	if e.Error.Param != nil {
		oe.Param = api.Printable(*e.Error.Param, 256)
	}
	return oe, true
}

// anthropicClientError reads a worker's 4xx answer to /v1/messages in
// Anthropic's shape, as clientError does OpenAI's.
func anthropicClientError(status int, data []byte) (*openai.Error, bool) {
	d, ok := anthropic.ParseError(data)
	if !ok || status < 400 || status >= 500 || status == http.StatusUnauthorized || status == http.StatusForbidden {
		return nil, false
	}
	return &openai.Error{Status: status, Code: api.Printable(d.Type, 64), Message: api.Printable(d.Message, api.MaxRemoteMessage)}, true
}

// workerAnswer turns a worker's error body into an upstreamError.
func workerAnswer(status int, data []byte) error {
	if d, ok := anthropic.ParseError(data); ok {
		return newUpstreamError(status, api.Printable(d.Type, 64), api.Printable(d.Message, api.MaxRemoteMessage))
	}
	d := api.RemoteError(status, data)
	return newUpstreamError(status, d.Code, d.Message)
}

// copyAnswer passes a worker's whole answer on; st, when set, learns its
// usage and timings from its last bytes.
func (s *Service) copyAnswer(w http.ResponseWriter, resp *http.Response, st *reqStats) outcome {
	for _, h := range []string{"Content-Type", "Content-Length", "Retry-After"} {
		if v := resp.Header.Get(h); v != "" {
			w.Header().Set(h, v)
		}
	}
	w.WriteHeader(resp.StatusCode)
	var body io.Reader = resp.Body
	var tail *tailWriter
	if st != nil {
		tail = tailPool.Get().(*tailWriter)
		tail.buf = tail.buf[:0]
		defer tailPool.Put(tail)
		body = io.TeeReader(resp.Body, tail)
	}
	if _, err := io.Copy(w, body); err != nil {
		return outcome{started: true, err: fmt.Errorf("%w: copying the answer: %w", errClientGone, err)}
	}
	if st != nil {
		st.end = time.Now()
		st.readTail(tail.buf)
	}
	prefix := resp.Header.Get(api.PrefixTrailer) // a whole answer's
	if v := resp.Trailer.Get(api.PrefixTrailer); v != "" {
		prefix = v
	}
	return outcome{started: true, verdict: verdictServed, prefix: prefix}
}

// SSE lines the relay looks for.
var (
	sseDone  = []byte("data: [DONE]")
	sseError = []byte(`data: {"error"`)
	sseData  = []byte("data:")
	sseEnd   = []byte("\n\n")
	// Anthropic's named events: the last of a stream that went well, and
	// the error that ends one.
	sseMessageStop = []byte("event: message_stop")
	sseNamedError  = []byte("event: error")
	sseNamed       = []byte("event:")
)

// streamBufs are a relayed stream's read buffer and event, kept between
// streams: a fresh 16 KiB reader a stream was most of the bytes a
// streamed request allocated in the queen.
type streamBufs struct {
	br *bufio.Reader
	ev []byte
}

var streamBufPool = sync.Pool{New: func() any { return &streamBufs{br: bufio.NewReaderSize(nil, 16<<10)} }}

// maxPooledEvent bounds the event buffer a stream hands back to the pool
// (a worker's rare huge event is not kept for every later stream).
const maxPooledEvent = 64 << 10

// relayStream relays a worker's event stream: each event is written to
// the client as soon as its blank line arrives, bytes as they came, and
// flushed unless the next complete event has already arrived with it
// (then both go in one write). The 200 header goes out with the first
// event, so that a worker failing before it can still be replaced. A
// stream that ends without [DONE] or the worker's own error event lost
// its worker: the client gets a final error event.
//
// The headers and the framing are openai.SSEWriter's; the relay writes
// the worker's bytes itself because the writer only encodes values and
// flushes its header on its own.
func (s *Service) relayStream(ctx context.Context, w http.ResponseWriter, resp *http.Response, l lease, rr relayReq) outcome {
	m := s.m
	ttft := m.ttft.WithLabelValues(rr.model)
	itl := m.interToken.WithLabelValues(rr.model)
	rc := http.NewResponseController(w)
	bufs := streamBufPool.Get().(*streamBufs)
	br := bufs.br
	br.Reset(resp.Body)
	ev := bufs.ev[:0]
	defer func() {
		br.Reset(nil)
		bufs.ev = nil
		if cap(ev) <= maxPooledEvent {
			bufs.ev = ev[:0]
		}
		streamBufPool.Put(bufs)
	}()
	var last time.Time
	started, ended, done := false, false, false
	for {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			ev = append(ev, line...)
			continue
		}
		if err != nil {
			switch {
			case done:
				return outcome{started: started, verdict: verdictServed, prefix: resp.Trailer.Get(api.PrefixTrailer)}
			case ended:
				return outcome{started: started} // the worker's own error event
			case ctx.Err() != nil:
				return outcome{started: started, err: fmt.Errorf("%w: %w", errClientGone, context.Cause(ctx))}
			case !started:
				return outcome{retry: true, verdict: verdictBroken, err: fmt.Errorf("worker %s: the stream ended before its first event: %w", l.cand.LifecycleID, noEOF(err))}
			}
			m.broken.WithLabelValues(rr.model).Inc()
			cause := fmt.Errorf("worker %s stopped answering mid-stream: %w", l.cand.LifecycleID, noEOF(err))
			fe := &openai.Error{Status: http.StatusBadGateway, Code: "worker_failed", Type: openai.TypeServer,
				Message: "the worker serving this stream stopped answering; the answer is incomplete"}
			final, _ := json.Marshal(openai.Response(fe))
			name := ""
			if rr.anthropic {
				final, _ = json.Marshal(anthropic.Body(fe))
				name = "event: error\n"
			}
			if _, err := fmt.Fprintf(w, "%sdata: %s\n\n", name, final); err == nil {
				_ = rc.Flush()
			}
			return outcome{started: true, verdict: verdictBroken, err: cause}
		}
		ev = append(ev, line...)
		if len(bytes.TrimRight(line, "\r\n")) > 0 {
			continue // the event goes on
		}
		if len(bytes.TrimSpace(ev)) == 0 {
			ev = ev[:0]
			continue
		}
		if !started {
			started = true
			h := w.Header()
			h.Set("Content-Type", "text/event-stream")
			h.Set("Cache-Control", "no-cache")
			h.Set("X-Accel-Buffering", "no") // keep reverse proxies from buffering
			w.WriteHeader(http.StatusOK)
		}
		if _, err := w.Write(ev); err != nil {
			return outcome{started: true, err: fmt.Errorf("%w: %w", errClientGone, err)}
		}
		if !eventBuffered(br) {
			if err := rc.Flush(); err != nil {
				return outcome{started: true, err: fmt.Errorf("%w: %w", errClientGone, err)}
			}
		}
		now := time.Now()
		switch {
		case bytes.HasPrefix(ev, sseDone), bytes.HasPrefix(ev, sseMessageStop):
			ended, done = true, true
		case bytes.HasPrefix(ev, sseError), bytes.HasPrefix(ev, sseNamedError):
			ended = true
		case bytes.HasPrefix(ev, sseData), bytes.HasPrefix(ev, sseNamed):
			if last.IsZero() {
				rr.tl.firstEvent(now)
				ttft.Observe(now.Sub(rr.start).Seconds())
			} else {
				itl.Observe(now.Sub(last).Seconds())
			}
			last = now
			if st := rr.stats; st != nil {
				st.streamEvent(ev, now)
			}
		}
		ev = ev[:0]
	}
}

// eventBuffered reports whether a whole event has already arrived after
// the one just written (it is written in the same flush).
func eventBuffered(br *bufio.Reader) bool {
	n := br.Buffered()
	if n == 0 {
		return false
	}
	peek, _ := br.Peek(n)
	return bytes.Contains(peek, sseEnd)
}

// noEOF names a stream cut short.
func noEOF(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

// suspect is a worker that broke a connection.
type suspect struct {
	lease lease
	err   error
	at    time.Time
}

// suspectGrace is how long the hive has to report a worker that broke a
// connection before the queen checks it itself.
const suspectGrace = time.Second

// suspect queues a check of a worker that broke a connection.
func (s *Service) suspect(l lease, err error) {
	select {
	case s.suspects <- suspect{lease: l, err: err, at: time.Now()}:
	default:
	}
}

// checkSuspects checks each worker that broke a connection, suspectGrace
// after it did: when its row is still RUNNING (its hive has not reported
// it) and it does not answer GET /health, its row is FAILED.
func (s *Service) checkSuspects(ctx context.Context) {
	for {
		var sus suspect
		select {
		case <-ctx.Done():
			return
		case sus = <-s.suspects:
		}
		t := time.NewTimer(time.Until(sus.at.Add(suspectGrace)))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		c := sus.lease.cand
		if !s.cp.Running(c.Key.Pool, c.LifecycleID, c.Key.Worker) {
			continue // its hive reported it, or it stopped
		}
		hctx, cancel := context.WithTimeout(ctx, time.Second)
		herr := probeHealth(hctx, s.up, c.URI)
		cancel()
		if herr == nil || ctx.Err() != nil {
			continue
		}
		reason := fmt.Sprintf("lost: the worker broke a request (%v) and does not answer /health (%v)", sus.err, herr)
		if err := s.cp.WorkerLost(context.WithoutCancel(ctx), c.LifecycleID, reason); err != nil {
			s.log.Error("cannot fail the row of a lost worker", "lifecycle_id", c.LifecycleID, "err", err)
		}
		// Requests waiting for the worker learn it is gone.
		s.Poke()
	}
}

// probeHealth asks a worker's GET /health: nil when it answers 200.
func probeHealth(ctx context.Context, hc *http.Client, uri string) error {
	_, err := rpc.WorkerHealth(ctx, hc, uri)
	return err
}

// workerNetReason is why a worker's connection failed, for clients: the
// network's words, never its address.
func workerNetReason(err error) string {
	if why, ok := rpc.NetReason(err); ok {
		return why
	}
	return "the connection failed"
}
