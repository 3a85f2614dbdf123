package routing

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/openai"
	"github.com/apiary-llm/apiary/internal/responses"
)

// Answer is a worker's answer to one request of a batch job: an OpenAI
// answer (200) or the worker's OpenAI error (4xx), as it sent it.
type Answer struct {
	Status      int
	Body        []byte
	LifecycleID string // the worker that answered
}

// AttemptError is an attempt of a batch request that a worker failed
// before it answered (its connection broke, it answered 5xx): another
// attempt may do better.
type AttemptError struct {
	LifecycleID string
	Err         error
}

func (e *AttemptError) Error() string {
	return fmt.Sprintf("worker %s failed: %v", e.LifecycleID, e.Err)
}
func (e *AttemptError) Unwrap() error { return e.Err }

// BatchLimits bound one attempt of a batch request.
type BatchLimits struct {
	// Timeout bounds the attempt from the slot it was given to its
	// answer's end; 0: none. Past it the upstream request is cancelled and
	// Serve fails with a *LimitError of ErrAttemptTimeout.
	Timeout time.Duration
	// MaxAnswerBytes bounds the answer kept; 0: none. A larger answer is
	// cut off (the upstream request cancelled) and Serve fails with a
	// *LimitError of ErrAnswerTooLarge.
	MaxAnswerBytes int64
}

// Limits a batch attempt ran past.
var (
	ErrAttemptTimeout = errors.New("the attempt ran past its deadline")
	ErrAnswerTooLarge = errors.New("the answer is larger than its bound")
)

// LimitError is a batch attempt that ran past one of its BatchLimits:
// not the worker's fault, and trying again would do the same.
type LimitError struct {
	LifecycleID string // the worker of the attempt
	Err         error  // ErrAttemptTimeout or ErrAnswerTooLarge
}

func (e *LimitError) Error() string {
	return fmt.Sprintf("on worker %s: %v", e.LifecycleID, e.Err)
}
func (e *LimitError) Unwrap() error { return e.Err }

// Serve sends one request of a batch job (body as the batch's file has
// it, to path /v1/completions, /v1/chat/completions, /v1/embeddings or
// /v1/responses, which goes as a chat completion and is answered as a
// response object)
// through the same routing as an interactive request (the same checks,
// leases, relay, strikes), at lower priority: it waits in its target's
// batch queue, which the router serves only when no interactive request
// waits, so it only ever takes a slot nothing else wants. While it waits
// it is demand: the controller may place workers for it, within the
// model's max workers, as for any waiting request. It never starts a worker
// itself and tries one worker: a worker that fails is an
// *AttemptError, and the caller decides whether to try again.
//
// An interactive request that finds every slot of its model taken may
// take the slot of the youngest batch request: that request is cancelled
// and Serve fails with ErrPreempted (no fault of the worker's; the caller
// queues it again).
//
// When withdraw ends while the request still waits for a slot, it
// leaves the queue and Serve fails with ErrWithdrawn; once it has a slot,
// withdraw no longer matters (the request runs to its end, as a request
// of a cancelled batch that already runs does). withdraw may be nil.
//
// lim bounds the attempt once it has a slot: its time and the answer it
// keeps (a *LimitError past either).
//
// It fails with the routing errors of an interactive request
// (ErrModelNotFound, the controller's ErrNoCapacity, ErrShuttingDown),
// with ErrPreempted, ErrWithdrawn, a *LimitError, and with ctx's error.
func (s *Service) Serve(ctx, withdraw context.Context, path string, body []byte, lim BatchLimits) (Answer, error) {
	var model string
	var err error
	var translated *responses.Answer // a /v1/responses request's answer
	switch path {
	case "/v1/completions":
		var req openai.CompletionRequest
		req, err = openai.DecodeCompletionRequest(body, openai.Limits{})
		model = req.Model
	case "/v1/chat/completions":
		var req openai.ChatCompletionRequest
		req, err = openai.DecodeChatCompletionRequest(body, openai.Limits{})
		model = req.Model
	case "/v1/embeddings":
		var req openai.EmbeddingRequest
		req, err = openai.DecodeEmbeddingRequest(body)
		model = req.Model
	case "/v1/responses":
		// A chat completion, its answer a response object (not kept;
		// previous_response_id continues a kept one).
		var rq responses.Request
		if rq, err = responses.Parse(body); err != nil {
			return Answer{}, err
		}
		var prior []map[string]any
		if rq.PreviousResponseID != nil && s.cfg.Responses != nil {
			prev, perr := s.cfg.Responses.Response(ctx, *rq.PreviousResponseID)
			if perr != nil {
				return Answer{}, openai.Invalid("previous_response_id", "previous response with id '%s': %v", api.Printable(*rq.PreviousResponseID, 100), perr)
			}
			if perr := json.Unmarshal(prev.Messages, &prior); perr != nil {
				return Answer{}, perr
			}
		}
		if body, _, err = responses.Build(rq, prior); err != nil {
			return Answer{}, err
		}
		translated = responses.NewAnswer(rq, rq.Model, time.Now())
		path = "/v1/chat/completions"
		var req openai.ChatCompletionRequest
		req, err = openai.DecodeChatCompletionRequest(body, openai.Limits{})
		model = req.Model
	default:
		return Answer{}, openai.Invalid("url", "%s is not an endpoint a batch runs (/v1/chat/completions, /v1/completions, /v1/embeddings, /v1/responses)", path)
	}
	if err != nil {
		return Answer{}, err
	}
	// A configured name or alias, as for an interactive request.
	res := s.resolve(model)
	if body, err = rewriteBody(body, model, res); err != nil {
		return Answer{}, err
	}
	model = res.ref
	if err := s.knownModel(ctx, model, ""); err != nil {
		return Answer{}, err
	}
	// The router cancels pctx (ErrPreempted) when an interactive request
	// takes the slot.
	pctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	wctx, unqueue := context.WithCancelCause(pctx) // ends the wait only
	if withdraw != nil {
		defer context.AfterFunc(withdraw, func() { unqueue(ErrWithdrawn) })()
	}
	l, err := s.router.acquire(wctx, routeReq{model: model, batch: true, preempt: cancel})
	unqueue(nil)
	if err != nil {
		return Answer{}, err
	}
	rec := &recorder{h: http.Header{}, max: lim.MaxAnswerBytes}
	actx := pctx
	if lim.Timeout > 0 {
		var stop context.CancelFunc
		actx, stop = context.WithTimeoutCause(pctx, lim.Timeout, ErrAttemptTimeout)
		defer stop()
	}
	o := s.attempt(actx, rec, l, relayReq{model: model, path: path, body: body, batch: true})
	broken := o.verdict == verdictBroken
	if step := s.router.settle(l, o.verdict, o.err); step != stepNone || o.verdict == verdictFailed || broken {
		s.wakeStrikes()
	}
	if broken {
		s.suspect(l, o.err)
	}
	switch {
	case o.err != nil && ctx.Err() == nil && errors.Is(context.Cause(pctx), ErrPreempted):
		// An answer that came whole before the cancel is kept (o.err nil).
		return Answer{}, fmt.Errorf("%w: its slot on %s went to it", ErrPreempted, l.cand.LifecycleID)
	case o.err != nil && ctx.Err() == nil && errors.Is(context.Cause(actx), ErrAttemptTimeout):
		return Answer{}, &LimitError{LifecycleID: l.cand.LifecycleID, Err: ErrAttemptTimeout}
	case rec.over:
		return Answer{}, &LimitError{LifecycleID: l.cand.LifecycleID, Err: ErrAnswerTooLarge}
	case o.retry:
		return Answer{}, &AttemptError{LifecycleID: l.cand.LifecycleID, Err: o.err}
	case o.err != nil && !o.started:
		return Answer{}, o.err
	case o.err != nil:
		// The answer began and broke (errClientGone: ctx ended while it
		// was copied): nothing whole came.
		if ctx.Err() != nil {
			return Answer{}, context.Cause(ctx)
		}
		return Answer{}, &AttemptError{LifecycleID: l.cand.LifecycleID, Err: o.err}
	case rec.status == 0:
		return Answer{}, &AttemptError{LifecycleID: l.cand.LifecycleID, Err: errors.New("the worker sent no answer")}
	}
	out := rec.body.Bytes()
	if translated != nil && rec.status == http.StatusOK {
		if out, err = translated.Whole(out, time.Now()); err != nil {
			return Answer{}, &AttemptError{LifecycleID: l.cand.LifecycleID, Err: err}
		}
	}
	return Answer{Status: rec.status, Body: out, LifecycleID: l.cand.LifecycleID}, nil
}

// recorder keeps the answer the relay writes for a batch request, at
// most max bytes of it (0: no bound); a write past that fails and marks
// it over.
type recorder struct {
	h      http.Header
	status int
	body   bytes.Buffer
	max    int64
	over   bool
}

func (r *recorder) Header() http.Header { return r.h }
func (r *recorder) WriteHeader(status int) {
	if r.status == 0 {
		r.status = status
	}
}
func (r *recorder) Write(b []byte) (int, error) {
	r.WriteHeader(http.StatusOK)
	if r.max > 0 && int64(r.body.Len()+len(b)) > r.max {
		r.over = true
		return 0, ErrAnswerTooLarge
	}
	return r.body.Write(b)
}

// Handle serves fn at pattern as an OpenAI endpoint of the queen: the
// same bearer token (APIARY_API_TOKEN), CORS and error mapping as
// /v1/chat/completions; endpoint labels its metrics.
func (s *Service) Handle(mux *http.ServeMux, pattern, endpoint string, fn func(w http.ResponseWriter, r *http.Request) error) {
	mux.Handle(pattern, s.inference(endpoint, func(w http.ResponseWriter, r *http.Request, _ *call) error { return fn(w, r) }))
}
