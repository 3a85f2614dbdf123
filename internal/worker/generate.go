package worker

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/engine"
	"github.com/apiary-llm/apiary/internal/openai"
)

// Sampling defaults for parameters a request leaves out: those of
// llama.cpp's server, which users of llama.cpp-based servers expect.
const (
	defaultTemperature = 0.8
	defaultTopP        = 0.95
	defaultTopK        = 40
	defaultMinP        = 0.05
)

// streamEventTimeout bounds the write of one stream event: a client that
// stops reading loses its stream (and frees its slot) after it.
const streamEventTimeout = time.Minute

// errClientGone means the client disconnected; there is no one to answer.
var errClientGone = errors.New("client went away")

// job is one generation, ready for the engine.
type job struct {
	req     engine.Request
	stops   []string
	choices int // n: seeds Seed, Seed+1, …; at once on an engine.Choices with free slots, else one after another
	// hold, when not nil, is called before each piece of text after the
	// first that goes out (the test knob Config.TestHoldDir).
	hold func(ctx context.Context, sent int)
	// free releases the prompt's images (engine.Vision); nil when none.
	free func()
}

// release frees what j holds once its generation is over.
func (j job) release() {
	if j.free != nil {
		j.free()
	}
}

// newJob tokenizes prompt and turns the request's sampling into an engine
// request. param names the request field holding the prompt, for errors.
func newJob(eng engine.Engine, info engine.ModelInfo, prompt, param string, s openai.Sampling, images [][]byte) (j job, err error) {
	ids, imgs, free, err := tokenizePrompt(eng, info, prompt, param, images)
	if err != nil {
		return job{}, err
	}
	defer func() {
		if err != nil && free != nil {
			free()
		}
	}()
	if len(ids) == 0 {
		return job{}, openai.Invalid(param, "%s is empty: the model needs at least one token to continue from", param)
	}
	room := info.CtxSize - len(ids)
	if room <= 0 {
		return job{}, &openai.Error{Status: http.StatusBadRequest, Code: openai.CodeContextLength, Param: param,
			Message: fmt.Sprintf("%s is %d tokens; the context holds %d per request and needs room for at least one more",
				param, len(ids), info.CtxSize), Err: engine.ErrPromptTooLong}
	}
	r := engine.Request{
		Prompt:      ids,
		Images:      imgs,
		MaxTokens:   room,
		Temperature: defaultTemperature,
		TopP:        defaultTopP,
		TopK:        defaultTopK,
		MinP:        defaultMinP,
		IgnoreEOS:   s.IgnoreEOS,
	}
	if s.MaxTokens != nil {
		r.MaxTokens = min(*s.MaxTokens, room)
	}
	if s.Temperature != nil {
		r.Temperature = float32(*s.Temperature)
	}
	if s.TopP != nil {
		r.TopP = float32(*s.TopP)
	}
	if s.TopK != nil {
		r.TopK = *s.TopK
	}
	if s.MinP != nil {
		r.MinP = float32(*s.MinP)
	}
	if s.FrequencyPenalty != nil {
		r.FrequencyPenalty = float32(*s.FrequencyPenalty)
	}
	if s.PresencePenalty != nil {
		r.PresencePenalty = float32(*s.PresencePenalty)
	}
	if s.RepeatPenalty != nil {
		r.RepeatPenalty = float32(*s.RepeatPenalty)
	}
	if len(s.LogitBias) > 0 {
		r.LogitBias = make(map[int]float32, len(s.LogitBias))
		for id, b := range s.LogitBias {
			if id >= info.Vocab {
				return job{}, openai.Invalid(fmt.Sprintf("logit_bias.%d", id), "logit_bias names token %d; this model's token ids are 0..%d", id, info.Vocab-1)
			}
			r.LogitBias[id] = float32(b)
		}
	}
	r.Grammar = s.Grammar
	r.JSONSchema = s.ResponseFormat.Schema()
	r.Logprobs, r.TopLogprobs = s.Logprobs, s.TopLogprobs
	if s.Seed == nil || *s.Seed == -1 { // -1 means random, as in llama.cpp
		r.Seed = rand.Uint32()
	} else {
		r.Seed = uint32(*s.Seed) // larger seeds wrap; the same seed still gives the same draw
	}
	if err := eng.Check(r); err != nil {
		param := "grammar"
		if r.JSONSchema != nil {
			param = "response_format"
		}
		if errors.Is(err, engine.ErrGrammar) {
			return job{}, &openai.Error{Status: http.StatusBadRequest, Code: openai.CodeInvalidValue, Param: param,
				Message: fmt.Sprintf("%s cannot be enforced: %v", param, err), Err: errors.Join(openai.ErrInvalidRequest, err)}
		}
		return job{}, err
	}
	return job{req: r, stops: s.Stop, choices: s.Choices(), free: free}, nil
}

// tokenizePrompt tokenizes prompt; with images, through the engine's
// projector, which a model without one refuses with a 400.
func tokenizePrompt(eng engine.Engine, info engine.ModelInfo, prompt, param string, images [][]byte) ([]int, []engine.Image, func(), error) {
	if len(images) == 0 {
		ids, err := eng.Tokenize(prompt, true)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("tokenize %s: %w", param, err)
		}
		return ids, nil, nil, nil
	}
	v, ok := eng.(engine.Vision)
	if !ok || !info.Vision {
		return nil, nil, nil, &openai.Error{Status: http.StatusBadRequest, Code: openai.CodeInvalidValue, Param: param,
			Message: "this model does not read images: it has no vision projector (mmproj); send text only, or use a model that sees",
			Err:     openai.ErrInvalidRequest}
	}
	ids, imgs, free, err := v.TokenizeImages(prompt, images)
	if err != nil {
		return nil, nil, nil, &openai.Error{Status: http.StatusBadRequest, Code: openai.CodeInvalidValue, Param: param,
			Message: err.Error(), Err: errors.Join(openai.ErrInvalidRequest, err)}
	}
	return ids, imgs, free, nil
}

// outcome is a finished generation: the engine's result, and the stop
// sequence that ended it when one did.
type outcome struct {
	engine.Result
	stop string
}

// generateChoices runs choices first … first+m-1 of j at once (m > 1 only
// on an engine.Choices, which decodes their prompt once), each through its
// own stop filter: out gets choice i's text as the filter lets it through,
// with the tokens it came from. Choice i samples with the request's seed
// + i.
func generateChoices(ctx context.Context, eng engine.Engine, j job, first, m int, out func(i int, text string, toks []engine.Token) error) ([]outcome, error) {
	filters := make([]*textFilter, m)
	toks := make([][]engine.Token, m)
	for k := range filters {
		filters[k] = newTextFilter(j.stops)
	}
	sent := 0 // chunks that went out: the test knob holds the next
	emit := func(k int, t engine.Token) error {
		f := filters[k]
		text, stopped := f.push(t.Piece)
		toks[k] = append(toks[k], t)
		if text != "" {
			if sent > 0 && j.hold != nil {
				j.hold(ctx, sent)
				if ctx.Err() != nil {
					return context.Cause(ctx) // ended while held: as the engine ends on a cancel
				}
			}
			if err := out(first+k, text, toks[k]); err != nil {
				return err
			}
			toks[k] = toks[k][:0]
			sent++
		}
		if stopped {
			return engine.ErrStop
		}
		return nil
	}
	req := j.req
	req.Seed += uint32(first)
	var (
		results []engine.Result
		err     error
	)
	if ce, ok := eng.(engine.Choices); ok && m > 1 {
		results, err = ce.GenerateChoices(ctx, req, m, emit)
	} else {
		var res engine.Result
		res, err = eng.Generate(ctx, req, func(t engine.Token) error { return emit(0, t) })
		results = []engine.Result{res}
	}
	outs := make([]outcome, m)
	for k := range outs {
		if k < len(results) {
			outs[k].Result = results[k]
		}
	}
	if err != nil {
		return outs, err
	}
	for k := range outs {
		f, res := filters[k], &outs[k].Result
		if rest := f.flush(); rest != "" || (len(toks[k]) > 0 && !f.stopped && j.req.Logprobs) {
			if err := out(first+k, rest, toks[k]); err != nil {
				return outs, err
			}
		}
		if f.stopped || res.FinishReason == "" {
			res.FinishReason = engine.FinishStop
		}
		if res.PromptTokens == 0 {
			res.PromptTokens = len(j.req.Prompt)
		}
		outs[k].stop = f.matched
	}
	return outs, nil
}

// choice is one finished choice of a non-streamed answer.
type choice struct {
	text   string
	finish string
	stop   string         // the stop sequence that ended it, if one did
	toks   []engine.Token // with their logprobs, when asked for
}

// format builds the response bodies and stream events of one endpoint.
type format interface {
	// first is the event that opens choice i's stream, or nil. (Each
	// event method may also return nil for none, or []any for several.)
	first(i int) any
	// delta is the event carrying choice i's next text and the tokens it
	// came from; offset counts the bytes of the choice's tokens before them.
	delta(i int, text string, toks []engine.Token, offset int) any
	// last is the event carrying choice i's finish reason, and whatever
	// the choice still held back.
	last(i int, o outcome) any
	// usage is the usage event, sent when stream_options.include_usage.
	usage(u *openai.Usage) any
	// whole is the body of a non-streamed answer.
	whole(choices []choice, u *openai.Usage) any
	// end closes a stream that went well; fail closes one with err.
	end(sse *openai.SSEWriter) error
	fail(sse *openai.SSEWriter, err error) error
}

// openAIStream is the end of OpenAI's streams: data: [DONE], or a final
// {"error":{…}} event.
type openAIStream struct{}

func (openAIStream) end(sse *openai.SSEWriter) error             { return sse.Done() }
func (openAIStream) fail(sse *openai.SSEWriter, err error) error { return sse.Error(err) }

// serveGeneration admits j, runs its choices one after another and
// answers, streamed or not. Errors before the stream began are returned for
// the handler adapter to write; after that they end the stream with an
// error event.
func (w *Worker) serveGeneration(rw http.ResponseWriter, r *http.Request, eng engine.Engine, j job, s openai.Sampling, f format, endpoint string) error {
	j.req.Background = r.Header.Get(api.BatchHeader) == "1"
	j.hold = w.testHold()
	tl := w.newTimeline(r.Context(), endpoint, s.Stream)
	defer tl.log()
	release, err := w.admitGeneration(r.Context())
	if tl != nil {
		tl.admitted = time.Now()
	}
	if err != nil {
		if r.Context().Err() != nil {
			return fmt.Errorf("%w: while queued: %w", errClientGone, err)
		}
		return err
	}
	defer release()

	ctx, cancel := context.WithCancelCause(r.Context())
	defer cancel(nil)
	defer context.AfterFunc(w.hardCtx, func() { cancel(ErrShutdown) })()

	// Choices run at once, their prompt decoded once, when the engine can
	// and slots are free beside the one admitted; the rest after them.
	wave := 1
	if _, ok := eng.(engine.Choices); ok && j.choices > 1 {
		n, free := w.takeFreeSlots(j.choices - 1)
		defer free()
		wave += n
	}
	start := time.Now()
	var firstToken time.Time // of any choice
	var total engine.Result
	// The queen learns what the slot now holds from api.PrefixTrailer: a
	// header on a whole answer (written at its end), a trailer after a
	// stream (the slot is known only once the engine took the request).
	report := func() {
		if firstToken.IsZero() {
			firstToken = time.Now()
		}
		rw.Header().Set(api.PrefixTrailer, api.PrefixReport{Slot: total.Slot, Slots: w.cfg.Slots, Prompt: total.PromptTokens,
			Cached: total.CachedTokens, PromptMS: float64(firstToken.Sub(start).Microseconds()) / 1000}.String())
	}
	run := func(first, m int, out func(int, string, []engine.Token) error) ([]outcome, error) {
		outs, err := generateChoices(ctx, eng, j, first, m, out)
		for _, o := range outs {
			total.PromptTokens = o.PromptTokens
			total.CachedTokens = o.CachedTokens
			total.Slot = o.Slot
			total.CompletionTokens += o.CompletionTokens
			total.FinishReason = o.FinishReason
		}
		return outs, err
	}
	if !s.Stream {
		choices := make([]choice, j.choices)
		texts := make([]strings.Builder, j.choices)
		keep := s.Logprobs
		for first := 0; first < j.choices; first += wave {
			m := min(wave, j.choices-first)
			outs, err := run(first, m, func(i int, s string, toks []engine.Token) error {
				if firstToken.IsZero() && len(toks) > 0 {
					firstToken = time.Now()
				}
				texts[i].WriteString(s)
				if keep {
					choices[i].toks = append(choices[i].toks, toks...)
				}
				return nil
			})
			if err != nil {
				return w.generationError(ctx, err)
			}
			for k, o := range outs {
				c := &choices[first+k]
				c.text, c.finish, c.stop = texts[first+k].String(), o.FinishReason, o.stop
			}
		}
		body := f.whole(choices, usageOf(total))
		// OpenAI's shapes carry llama-server's timings beside their
		// fields (Anthropic's have no place for them).
		timings := openai.NewTimings(total.PromptTokens, total.CachedTokens, total.CompletionTokens, start, firstToken, time.Now())
		switch b := body.(type) {
		case openai.ChatCompletion:
			b.Timings = &timings
			body = b
		case openai.Completion:
			b.Timings = &timings
			body = b
		}
		report()
		openai.WriteJSON(rw, http.StatusOK, body)
	} else {
		rw.Header().Set("Trailer", api.PrefixTrailer)
		sse := openai.NewSSEWriter(rw)
		sse.SetEventTimeout(streamEventTimeout)
		var send func(ev any) error
		send = func(ev any) error {
			switch ev := ev.(type) {
			case nil:
				return nil
			case []any: // several events
				for _, e := range ev {
					if err := send(e); err != nil {
						return err
					}
				}
				return nil
			}
			if err := sse.Event(ev); err != nil {
				return fmt.Errorf("%w: %w", errClientGone, err)
			}
			if tl != nil && tl.firstEvent.IsZero() {
				tl.firstEvent = time.Now()
			}
			return nil
		}
		err = sse.Start()
		offsets := make([]int, j.choices)
		for first := 0; err == nil && first < j.choices; first += wave {
			m := min(wave, j.choices-first)
			for i := first; err == nil && i < first+m; i++ {
				err = send(f.first(i))
			}
			var outs []outcome
			if err == nil {
				outs, err = run(first, m, func(i int, s string, toks []engine.Token) error {
					if firstToken.IsZero() && len(toks) > 0 {
						firstToken = time.Now()
					}
					ev := f.delta(i, s, toks, offsets[i])
					if tl != nil && tl.firstEvent.IsZero() {
						tl.firstTokens = len(toks)
					}
					for _, t := range toks {
						offsets[i] += len(t.Piece)
					}
					return send(ev)
				})
			}
			for k := 0; err == nil && k < m; k++ {
				err = send(f.last(first+k, outs[k]))
			}
		}
		if err == nil && s.IncludeUsage() {
			err = send(f.usage(usageOf(total)))
		}
		if err == nil {
			err = f.end(sse)
		}
		if err != nil {
			err = w.generationError(ctx, err)
			if !errors.Is(err, errClientGone) {
				_ = f.fail(sse, err) // the client may be gone too; nothing more to do
			}
			return err
		}
	}
	if s.Stream {
		report()
	}
	elapsed := time.Since(start)
	w.log.Info("generation finished", "endpoint", endpoint, "stream", s.Stream, "choices", j.choices, "prompt_tokens", total.PromptTokens,
		"cached_tokens", total.CachedTokens,
		"completion_tokens", total.CompletionTokens, "finish_reason", total.FinishReason, "duration_ms", elapsed.Milliseconds())
	return nil
}

func usageOf(res engine.Result) *openai.Usage {
	return openai.NewCachedUsage(res.PromptTokens, res.CachedTokens, res.CompletionTokens)
}

// generationError classifies an error that ended a generation.
func (w *Worker) generationError(ctx context.Context, err error) error {
	switch {
	case errors.Is(context.Cause(ctx), ErrShutdown) || errors.Is(err, engine.ErrClosed):
		return &openai.Error{Status: http.StatusServiceUnavailable, Code: codeShuttingDown,
			Message: "the worker shut down before the generation finished; retry elsewhere", Err: errors.Join(ErrShutdown, err)}
	case errors.Is(err, errClientGone) || ctx.Err() != nil:
		return fmt.Errorf("%w: %w", errClientGone, err)
	case errors.Is(err, engine.ErrGrammar), errors.Is(err, engine.ErrTokenID):
		return &openai.Error{Status: http.StatusBadRequest, Code: openai.CodeInvalidValue, Message: err.Error(),
			Err: errors.Join(openai.ErrInvalidRequest, err)}
	case errors.Is(err, engine.ErrPromptTooLong):
		return &openai.Error{Status: http.StatusBadRequest, Code: openai.CodeContextLength,
			Message: "the prompt does not fit the model's context", Err: err}
	default:
		return &openai.Error{Status: http.StatusInternalServerError, Code: codeGenerationFail,
			Message: "the engine failed while generating", Err: err}
	}
}

// answerModel is the model an answer names: the name the client sent the
// queen (api.ModelNameHeader: a configured name or alias of this
// worker's file), else the worker's own.
func (w *Worker) answerModel(r *http.Request) string {
	if n := r.Header.Get(api.ModelNameHeader); n != "" && len(n) <= 256 && api.Printable(n, 256) == n {
		return n
	}
	return w.cfg.ModelRef
}

// checkModel accepts an empty model or the worker's own.
func (w *Worker) checkModel(model string) error {
	if model == "" || model == w.cfg.ModelRef {
		return nil
	}
	return &openai.Error{Status: http.StatusNotFound, Code: openai.CodeModelNotFound, Param: "model",
		Message: fmt.Sprintf("model %q is not served here; this worker serves %q", model, w.cfg.ModelRef)}
}
