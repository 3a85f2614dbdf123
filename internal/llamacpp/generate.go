package llamacpp

/*
#include <math.h>
#include <stdlib.h>
#include "llama.h"

static void batch_put(struct llama_batch *b, llama_token id, llama_pos pos, llama_seq_id seq, bool logits) {
	int i = b->n_tokens;
	b->token[i] = id;
	b->pos[i] = pos;
	b->n_seq_id[i] = 1;
	b->seq_id[i][0] = seq;
	b->logits[i] = logits ? 1 : 0;
	b->n_tokens = i + 1;
}

// sample_lazy samples from chain without the grammar first and keeps the
// token when the grammar allows it; else it applies the grammar to every
// candidate and samples again, as llama.cpp's own server does: the
// grammar is checked against one token in most steps instead of the whole
// vocabulary. Both samplers accept the token. buf holds n_vocab entries.
static llama_token sample_lazy(struct llama_sampler *chain, struct llama_sampler *grammar, struct llama_context *ctx,
		int32_t idx, llama_token_data *buf, int32_t n_vocab) {
	const float *logits = llama_get_logits_ith(ctx, idx);
	for (int32_t i = 0; i < n_vocab; i++) {
		buf[i].id = i;
		buf[i].logit = logits[i];
		buf[i].p = 0.0f;
	}
	llama_token_data_array cur = {buf, (size_t)n_vocab, -1, false};
	llama_sampler_apply(chain, &cur);
	llama_token id = cur.data[cur.selected].id;
	llama_token_data one = {id, 1.0f, 0.0f};
	llama_token_data_array single = {&one, 1, -1, false};
	llama_sampler_apply(grammar, &single);
	if (single.data[0].logit == -INFINITY) {
		for (int32_t i = 0; i < n_vocab; i++) {
			buf[i].id = i;
			buf[i].logit = logits[i];
			buf[i].p = 0.0f;
		}
		cur = (llama_token_data_array){buf, (size_t)n_vocab, -1, false};
		llama_sampler_apply(grammar, &cur);
		llama_sampler_apply(chain, &cur);
		id = cur.data[cur.selected].id;
	}
	llama_sampler_accept(grammar, id);
	llama_sampler_accept(chain, id);
	return id;
}
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"
	"unsafe"

	"github.com/apiary-llm/apiary/internal/engine"
)

// sequence is one generation. The fields after the divider belong to the
// decode loop; the caller talks to it through the mailbox (mu, pending,
// notify) and the cancelled flag.
type sequence struct {
	ctx       context.Context
	req       engine.Request
	cancelled atomic.Bool

	mu       sync.Mutex
	pending  []engine.Token // guarded by mu
	finished bool           // guarded by mu
	result   engine.Result  // guarded by mu; final once finished
	err      error          // guarded by mu; final once finished
	notify   chan struct{}  // capacity 1, shared by a request's choices: "look at pending/finished"

	// --- owned by the decode loop ---
	choice    int       // its index among its request's choices
	follow    *sequence // the choice decoding the shared prompt, until this one gets a copy of it
	seq       int       // llama.cpp sequence id (= slot)
	sampler   sampling
	promptPos int   // prompt tokens already decoded
	nPast     int   // tokens in the KV cache for this sequence
	cached    int   // prompt tokens its slot's memory held already (see slotCache)
	outs      []int // the tokens sampled, for slotCache.keep
	generated int
	last      C.llama_token // last sampled token, decoded in the next step
	outIdx    int           // index in the current batch whose logits to sample, -1 if none
	// stepPromptPos and stepNPast are promptPos and nPast before the
	// step under way: an aborted step goes back to them.
	stepPromptPos, stepNPast int
	// spoken: its pieces so far hold a whole character, so its first
	// event can go out. Until a foreground sequence has spoken,
	// background ones sit out the steps (see leadLimit).
	spoken bool
	lead   []byte // its pieces until it has spoken

	// Timeline, for the Debug log at the end (see logTimeline).
	submitted  time.Time    // Generate handed it to the loop
	cancelAt   atomic.Int64 // unix ns its context ended, 0 if it did not
	taken      time.Time    // the loop took it (decode loop's)
	firstToken time.Time    // its first token was sampled (decode loop's)
	firstStep  time.Duration
}

func (s *sequence) deliver(t engine.Token) {
	s.mu.Lock()
	s.pending = append(s.pending, t)
	s.mu.Unlock()
	s.poke()
}

func (s *sequence) finish(res engine.Result, err error) {
	s.mu.Lock()
	s.finished, s.result, s.err = true, res, err
	s.mu.Unlock()
	s.poke()
}

func (s *sequence) poke() {
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

// Check builds the sampler req asks for and frees it: an error is the one
// Generate would return for it.
func (e *Engine) Check(req engine.Request) error {
	s, err := e.newSampler(req)
	if err != nil {
		return err
	}
	s.free()
	return nil
}

// Generate runs one sequence. Tokens reach emit on the caller's goroutine as
// soon as the decode loop samples them; the loop never waits for emit.
func (e *Engine) Generate(ctx context.Context, req engine.Request, emit engine.Emit) (engine.Result, error) {
	res, err := e.GenerateChoices(ctx, req, 1, func(_ int, t engine.Token) error { return emit(t) })
	if len(res) == 0 {
		return engine.Result{}, err
	}
	return res[0], err
}

// GenerateChoices runs n sequences of one prompt at once: the first
// decodes the prompt and the others get a copy of its KV cache in the
// step the prompt ends, so the prompt is decoded once. Choice i samples
// with req.Seed+i. Tokens reach emit on the caller's goroutine; an emit
// error other than ErrStop ends every choice.
func (e *Engine) GenerateChoices(ctx context.Context, req engine.Request, n int, emit engine.EmitChoice) ([]engine.Result, error) {
	if len(req.Prompt) == 0 {
		return nil, errors.New("empty prompt")
	}
	if len(req.Prompt) >= e.nCtxSeq {
		return nil, fmt.Errorf("%w: %d prompt tokens, context holds %d", engine.ErrPromptTooLong, len(req.Prompt), e.nCtxSeq)
	}
	if req.MaxTokens <= 0 {
		return nil, errors.New("max tokens must be positive")
	}
	if n < 1 || n > e.slots {
		return nil, fmt.Errorf("%d choices at once, the engine has %d slots", n, e.slots)
	}
	notify := make(chan struct{}, 1)
	seqs := make([]*sequence, n)
	freeAll := func() {
		for _, s := range seqs {
			if s != nil {
				s.sampler.free()
			}
		}
	}
	for i := range seqs {
		ri := req
		ri.Seed += uint32(i)
		sampler, err := e.newSampler(ri)
		if err != nil {
			freeAll()
			return nil, err
		}
		seqs[i] = &sequence{ctx: ctx, req: ri, sampler: sampler, notify: notify, choice: i, submitted: time.Now()}
		if i > 0 {
			seqs[i].follow = seqs[0]
		}
	}
	if e.debug {
		defer context.AfterFunc(ctx, func() {
			for _, s := range seqs {
				s.cancelAt.Store(time.Now().UnixNano())
			}
		})()
	}
	if !req.Background && e.abortFlag != nil {
		// The loop may be in a step of background tokens only: it ends
		// that step now rather than make this request wait for it (see
		// run). The loop counts the request off when it takes it.
		e.fgComing.Add(1)
		if e.bgStep.Load() {
			atomic.StoreInt32((*int32)(unsafe.Pointer(e.abortFlag)), 1)
		}
	}
	select {
	case e.submit <- seqs:
	case <-ctx.Done():
		e.notComing(seqs)
		freeAll()
		return nil, ctx.Err()
	case <-e.quit:
		e.notComing(seqs)
		freeAll()
		return nil, engine.ErrClosed
	}
	var (
		batch   []engine.Token
		stopped = make([]bool, n)
		ended   = make([]bool, n)
		left    = n
		emitErr error
	)
	for left > 0 {
		<-notify
		for i, s := range seqs {
			if ended[i] {
				continue
			}
			s.mu.Lock()
			batch, s.pending = s.pending, batch[:0]
			finished := s.finished
			s.mu.Unlock()
			for _, t := range batch {
				if stopped[i] || emitErr != nil {
					break
				}
				if err := emit(i, t); err != nil {
					if errors.Is(err, engine.ErrStop) {
						stopped[i] = true
						s.cancelled.Store(true)
					} else {
						emitErr = err
						for _, o := range seqs {
							o.cancelled.Store(true)
						}
					}
				}
			}
			if finished {
				ended[i] = true
				left--
			}
		}
	}
	results := make([]engine.Result, n)
	var firstErr error
	for i, s := range seqs {
		results[i] = s.result
		switch {
		case stopped[i]:
			results[i].FinishReason = engine.FinishStop
		case s.err != nil && firstErr == nil:
			firstErr = s.err
		}
	}
	if emitErr != nil {
		return results, emitErr
	}
	return results, firstErr
}

// notComing counts off a request of choices u that Generate counted in
// fgComing, when the loop takes it or its caller gives up first.
func (e *Engine) notComing(u []*sequence) {
	if !u[0].req.Background && e.abortFlag != nil {
		e.fgComing.Add(-1)
	}
}

// run is the decode loop: it owns the llama.cpp context for the engine's
// life. It keeps one OS thread: that thread is ggml's compute thread 0 in
// every decode, beside the threadpool's, so it stays the same thread (its
// caches, its place in the kernel's scheduler) from token to token rather
// than whichever thread the Go scheduler hands the goroutine next.
func (e *Engine) run() {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	defer close(e.done)
	active := make([]*sequence, e.slots)
	batch := C.llama_batch_init(C.int32_t(e.batchSize), 0, 1)
	defer C.llama_batch_free(batch)
	mem := C.llama_get_memory(e.lctx)
	pieceBuf := make([]byte, 256)
	cache := e.cache             // the decode loop's: ExportSlots and ImportSlot run on it too
	var cand *C.llama_token_data // candidates of a grammar's lazy sampling, made on first use
	defer func() {
		if cand != nil {
			C.free(unsafe.Pointer(cand))
		}
	}()

	// lastForeground is when a foreground sequence last ended: for
	// e.fgRecent after it, background prompts still go in chunks.
	var lastForeground time.Time
	release := func(s *sequence, res engine.Result, err error) {
		if !s.req.Background {
			lastForeground = time.Now()
		}
		cache.keep(mem, s, err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded))
		for _, f := range active {
			if f != nil && f.follow == s {
				f.follow = nil // decodes the prompt itself
			}
		}
		s.sampler.free()
		active[s.seq] = nil
		if e.debug {
			e.logTimeline(s, err)
		}
		res.PromptTokens = len(s.req.Prompt)
		res.CompletionTokens = s.generated
		res.CachedTokens = s.cached
		res.Slot = s.seq
		s.finish(res, err)
	}
	// waiting is a request's choices that came when fewer slots were
	// free than it has choices; nothing else is taken before it.
	var waiting []*sequence
	defer func() {
		for _, s := range active {
			if s != nil {
				release(s, engine.Result{}, engine.ErrClosed)
			}
		}
		for _, s := range waiting {
			s.sampler.free()
			s.finish(engine.Result{}, engine.ErrClosed)
		}
	}()
	free := e.slots
	admit := func(u []*sequence) bool {
		if len(u) > free {
			waiting = u
			return false
		}
		// The first choice takes the slot whose memory holds the most of
		// its prompt; the others (copies of it) the least recently used.
		for k, s := range u {
			if k == 0 {
				s.seq = cache.pick(active, s.req.Prompt)
			} else {
				s.seq = cache.pickLRU(active)
			}
			s.taken = time.Now()
			active[s.seq] = s
			s.cached = cache.reuse(e, mem, s)
			e.promptReused.Add(int64(s.cached))
		}
		free -= len(u)
		return true
	}
	for {
		// Drop sequences whose caller went away or asked to stop, before
		// taking new ones: a request waiting for a slot (the worker
		// admits one as soon as a client goes away) gets the slot of a
		// cancelled sequence in this step, not the next.
		n, inUse := 0, 0
		for _, s := range active {
			if s == nil {
				continue
			}
			if s.cancelled.Load() {
				release(s, engine.Result{FinishReason: engine.FinishStop}, nil)
			} else if err := s.ctx.Err(); err != nil {
				release(s, engine.Result{}, err)
			} else {
				n++
				inUse += max(s.nPast, s.cached)
			}
		}
		e.kvInUse.Store(int64(inUse))
		free = e.slots - n
		if waiting != nil && len(waiting) <= free {
			u := waiting
			waiting = nil
			admit(u)
		}
		if free == e.slots && waiting == nil {
			select {
			case u := <-e.submit:
				e.notComing(u)
				admit(u)
			case f := <-e.ctl: // ExportSlots, ImportSlot: only while no sequence runs
				f()
				continue
			case <-e.quit:
				return
			}
		}
		for free > 0 && waiting == nil {
			select {
			case u := <-e.submit:
				e.notComing(u)
				admit(u)
				continue
			default:
			}
			break
		}
		// A foreground request on its way (a step was ended or skipped
		// for it) is waited for a moment rather than passed by with a
		// background step; one the loop cannot take now (no free slot)
		// lets the next step run whole, so that background work goes on.
		preemptible := e.abortFlag != nil
		if e.fgComing.Load() > 0 {
			if free > 0 && waiting == nil {
				t := time.NewTimer(fgComingWait)
				select {
				case u := <-e.submit:
					e.notComing(u)
					admit(u)
				case <-t.C:
				case <-e.quit:
					t.Stop()
					return
				}
				t.Stop()
				continue // the top again: cancelled sequences, more requests
			}
			preemptible = false
		}
		select {
		case <-e.quit:
			return
		default:
		}

		// Until every foreground sequence has its first character out,
		// background sequences (engine.Request.Background) sit the steps
		// out: the interactive request's prompt and first tokens are
		// decoded in steps of their own, as fast as on an idle worker.
		fgPrompt, fgActive, fgLead := false, false, false
		for _, s := range active {
			if s != nil && !s.req.Background {
				fgActive = true
				fgPrompt = fgPrompt || (s.promptPos < len(s.req.Prompt) && s.follow == nil)
				fgLead = fgLead || !s.spoken
			}
		}

		// Images due in a prompt (vision.go) are decoded first, each in
		// batches of its own: the projector's embeddings cannot share a
		// batch with tokens. The step's tokens come after.
		for _, s := range active {
			if s == nil || s.follow != nil || (s.req.Background && fgLead) {
				continue
			}
			for im := imageAt(s); im != nil; im = imageAt(s) {
				if err := e.evalImage(s, im); err != nil {
					e.log.Error("image decode failed", "err", err, "slot", s.seq)
					release(s, engine.Result{}, err)
					break
				}
			}
		}

		// One batch: the next token of every generating sequence first, then
		// as much prompt as fits.
		batch.n_tokens = 0
		bgTokens := 0
		for _, s := range active {
			if s == nil {
				continue
			}
			s.outIdx = -1
			s.stepPromptPos, s.stepNPast = s.promptPos, s.nPast
			if s.req.Background && fgLead {
				continue
			}
			if s.promptPos == len(s.req.Prompt) {
				s.outIdx = int(batch.n_tokens)
				C.batch_put(&batch, s.last, C.llama_pos(s.nPast), C.llama_seq_id(s.seq), true)
				s.nPast++
				if s.req.Background {
					bgTokens++
				}
			}
		}
		// Prompts of foreground sequences first. A background sequence's
		// prompt (engine.Request.Background) waits while a foreground
		// prompt is decoded, and goes in chunks of backgroundChunk
		// tokens a step while a foreground sequence generates, so that
		// its steps stay short.
		bgBudget := e.batchSize
		switch {
		case fgPrompt || fgLead:
			bgBudget = 0
		case fgActive || time.Since(lastForeground) < e.fgRecent:
			bgBudget = backgroundChunk
		}
		for _, s := range active {
			if s == nil || s.promptPos == len(s.req.Prompt) || s.follow != nil {
				continue
			}
			end := textEnd(s) // an image (vision.go) is decoded at the top of a step
			for s.promptPos < end && int(batch.n_tokens) < e.batchSize && (!s.req.Background || bgBudget > 0) {
				last := s.promptPos == len(s.req.Prompt)-1
				if last {
					s.outIdx = int(batch.n_tokens)
				}
				C.batch_put(&batch, C.llama_token(s.req.Prompt[s.promptPos]), C.llama_pos(s.nPast), C.llama_seq_id(s.seq), C.bool(last))
				s.promptPos++
				e.promptDecoded.Add(1)
				s.nPast++
				if s.req.Background {
					bgBudget--
					bgTokens++
				}
			}
		}
		if batch.n_tokens == 0 {
			continue
		}
		if e.onStep != nil {
			e.onStep(int(batch.n_tokens)-bgTokens, bgTokens)
		}
		// A step of background tokens only ends (llama.cpp aborts it
		// between two nodes of its graph, and takes its tokens out of
		// the memory again) when a foreground request comes meanwhile:
		// the request then waits for a fraction of a step, not for a
		// whole one of the batch's work, which on a CPU costs several
		// token times. The step is decoded again after it.
		preemptible = preemptible && bgTokens == int(batch.n_tokens)
		if e.abortFlag != nil {
			atomic.StoreInt32((*int32)(unsafe.Pointer(e.abortFlag)), 0)
		}
		if preemptible {
			e.bgStep.Store(true)
			if e.fgComing.Load() > 0 { // came since the top: not begun
				e.bgStep.Store(false)
				e.stepsYielded.Add(1)
				e.stepBack(active)
				continue
			}
			if e.onBackgroundStep != nil {
				e.onBackgroundStep()
			}
		}
		stepStart := time.Now()
		rc := C.llama_decode(e.lctx, batch)
		e.bgStep.Store(false)
		if rc == 2 && e.abortFlag != nil {
			// Ended for a foreground request (or, rarely, by an ask that
			// came late, meant for the step before: this one is taken
			// again as well).
			e.stepsYielded.Add(1)
			if e.debug {
				e.log.Debug("background step ended for a foreground request", "tokens", int(batch.n_tokens),
					"after", time.Since(stepStart))
			}
			for _, s := range e.stepBack(active) {
				release(s, engine.Result{}, errors.New("an aborted step left the memory of the sequence changed"))
			}
			continue
		}
		if rc != 0 {
			err := fmt.Errorf("decode failed (code %d)", int(rc))
			e.log.Error("decode failed", "code", int(rc), "tokens", int(batch.n_tokens))
			for _, s := range active {
				if s != nil {
					release(s, engine.Result{}, err)
				}
			}
			continue
		}

		// A choice following another's prompt gets a copy of its KV cache
		// in the step that prompt ends, and samples from the same logits.
		for _, s := range active {
			if s == nil || s.follow == nil {
				continue
			}
			if l := s.follow; l.promptPos == len(l.req.Prompt) && l.outIdx >= 0 && l.generated == 0 {
				C.llama_memory_seq_cp(mem, C.llama_seq_id(l.seq), C.llama_seq_id(s.seq), -1, -1)
				s.promptPos, s.nPast, s.outIdx, s.follow = l.promptPos, l.nPast, l.outIdx, nil
				s.cached = l.cached
			}
		}
		for _, s := range active {
			if s == nil || s.outIdx < 0 {
				continue
			}
			var id C.llama_token
			if s.sampler.grammar == nil {
				id = C.llama_sampler_sample(s.sampler.chain, e.lctx, C.int32_t(s.outIdx))
			} else {
				if cand == nil {
					cand = (*C.llama_token_data)(C.malloc(C.size_t(e.info.Vocab) * C.size_t(unsafe.Sizeof(C.llama_token_data{}))))
				}
				id = C.sample_lazy(s.sampler.chain, s.sampler.grammar, e.lctx, C.int32_t(s.outIdx), cand, C.int32_t(e.info.Vocab))
			}
			s.generated++
			if bool(C.llama_vocab_is_eog(e.vocab, id)) && !s.req.IgnoreEOS {
				s.generated-- // the end-of-generation token is not part of the answer
				release(s, engine.Result{FinishReason: engine.FinishStop}, nil)
				continue
			}
			s.last = id
			s.outs = append(s.outs, int(id))
			if s.generated == 1 {
				s.firstToken = time.Now()
				s.firstStep = s.firstToken.Sub(stepStart)
			}
			tok := engine.Token{ID: int(id), Piece: e.piece(id, pieceBuf)}
			if !s.spoken {
				s.lead = append(s.lead, tok.Piece...)
				s.spoken = len(s.lead) > 0 && utf8.Valid(s.lead) || s.generated >= leadLimit
				if s.spoken {
					s.lead = nil
				}
			}
			if s.req.Logprobs || s.req.TopLogprobs > 0 {
				e.logprobs(&tok, s.outIdx, s.req.TopLogprobs, pieceBuf)
			}
			s.deliver(tok)
			switch {
			case s.generated >= s.req.MaxTokens:
				release(s, engine.Result{FinishReason: engine.FinishLength}, nil)
			case s.nPast >= e.nCtxSeq:
				release(s, engine.Result{FinishReason: engine.FinishLength}, nil)
			}
		}
	}
}

// logTimeline logs, at Debug, where s's time went: waiting for the
// loop to take it, from then to its first token (and the decode step
// that made it), and for a sequence whose context ended, how long the
// loop took to see that.
func (e *Engine) logTimeline(s *sequence, err error) {
	now := time.Now()
	attrs := []any{"seq", s.seq, "prompt_tokens", len(s.req.Prompt), "generated", s.generated,
		"submitted", s.submitted, "take_wait_us", s.taken.Sub(s.submitted).Microseconds()}
	if !s.firstToken.IsZero() {
		attrs = append(attrs, "first_token_us", s.firstToken.Sub(s.taken).Microseconds(), "first_step_us", s.firstStep.Microseconds())
	}
	if at := s.cancelAt.Load(); at != 0 && err != nil {
		attrs = append(attrs, "cancel_noticed_us", now.Sub(time.Unix(0, at)).Microseconds())
	}
	e.log.Debug("sequence timeline", attrs...)
}

// stepBack undoes the step the loop was about to decode, or whose decode
// was aborted (llama.cpp removed its tokens from the memory): every
// sequence goes back to where it was before the step. It returns the
// sequences whose memory does not end where they went back to (none,
// unless llama.cpp's abort changes what it keeps).
func (e *Engine) stepBack(active []*sequence) (bad []*sequence) {
	mem := C.llama_get_memory(e.lctx)
	for _, s := range active {
		if s == nil {
			continue
		}
		e.promptDecoded.Add(int64(s.stepPromptPos - s.promptPos))
		s.promptPos, s.nPast, s.outIdx = s.stepPromptPos, s.stepNPast, -1
		if s.follow == nil && int(C.llama_memory_seq_pos_max(mem, C.llama_seq_id(s.seq))) != s.nPast-1 {
			bad = append(bad, s)
		}
	}
	return bad
}

// fgComingWait is how long the loop waits for a foreground request that
// Generate counted on its way before it goes on without it.
const fgComingWait = 2 * time.Millisecond

// leadLimit bounds the tokens a foreground sequence may take to speak
// (its first whole character) while background sequences wait for it.
const leadLimit = 4

// backgroundChunk is how many prompt tokens of background sequences a
// step decodes while a foreground sequence generates, and for
// foregroundRecent after one was last active: a step under way when an
// interactive request comes is what it waits for first, and a step of
// whole background prompts is many token times long. With no
// interactive traffic, background prompts go whole (the batch's
// throughput).
const (
	backgroundChunk  = 8
	foregroundRecent = 250 * time.Millisecond
)

// penaltyLastN is how many recent tokens the penalties look at, llama.cpp
// server's default.
const penaltyLastN = 64

// sampling is a sequence's samplers: the chain, and the grammar apart
// from it (nil for none), which sample_lazy checks the chain's token
// against and applies to every candidate only when that token breaks it.
type sampling struct {
	chain, grammar *C.struct_llama_sampler
}

func (s sampling) free() {
	if s.chain != nil {
		C.llama_sampler_free(s.chain)
	}
	if s.grammar != nil {
		C.llama_sampler_free(s.grammar)
	}
}

// newSampler builds the samplers llama.cpp's server uses for these
// settings: the chain [logit biases, EOG ban] → [penalties] → top-k →
// top-p → min-p → temperature → draw (greedy when the temperature is 0,
// after the biases and penalties), and the grammar beside it, checked
// against the chain's token first (see sample_lazy). A grammar or schema
// that llama.cpp cannot read yields an error wrapping engine.ErrGrammar.
func (e *Engine) newSampler(req engine.Request) (sampling, error) {
	grammar := req.Grammar
	if len(req.JSONSchema) > 0 {
		g, err := SchemaGrammar(req.JSONSchema)
		if err != nil {
			return sampling{}, err
		}
		if req.Wrap != nil {
			g = WrapGrammar(g, *req.Wrap)
		}
		grammar = g
	}
	var bias []C.llama_logit_bias
	for id, b := range req.LogitBias {
		if id < 0 || id >= e.info.Vocab {
			return sampling{}, fmt.Errorf("%w: %d is not a token id of this model (0..%d)", engine.ErrTokenID, id, e.info.Vocab-1)
		}
		bias = append(bias, C.llama_logit_bias{token: C.llama_token(id), bias: C.float(b)})
	}
	if req.IgnoreEOS {
		bias = append(bias, e.eog...)
	}
	params := C.llama_sampler_chain_default_params()
	params.no_perf = true
	chain := C.llama_sampler_chain_init(params)
	if len(bias) > 0 {
		cb := (*C.llama_logit_bias)(C.malloc(C.size_t(len(bias)) * C.size_t(unsafe.Sizeof(C.llama_logit_bias{}))))
		copy(unsafe.Slice(cb, len(bias)), bias)
		C.llama_sampler_chain_add(chain, C.llama_sampler_init_logit_bias(C.int32_t(e.info.Vocab), C.int32_t(len(bias)), cb))
		C.free(unsafe.Pointer(cb))
	}
	var g *C.struct_llama_sampler
	if grammar != "" {
		cg, root := C.CString(grammar), C.CString("root")
		g = C.llama_sampler_init_grammar(e.vocab, cg, root)
		C.free(unsafe.Pointer(cg))
		C.free(unsafe.Pointer(root))
		if g == nil {
			C.llama_sampler_free(chain)
			return sampling{}, fmt.Errorf("%w: llama.cpp could not parse the grammar (a GBNF grammar with a rule named root)", engine.ErrGrammar)
		}
	}
	repeat := req.RepeatPenalty
	if repeat <= 0 {
		repeat = 1
	}
	if req.FrequencyPenalty != 0 || req.PresencePenalty != 0 || repeat != 1 {
		C.llama_sampler_chain_add(chain, C.llama_sampler_init_penalties(C.int32_t(e.info.Vocab), penaltyLastN, C.float(repeat),
			C.float(req.FrequencyPenalty), C.float(req.PresencePenalty)))
	}
	if req.Temperature <= 0 {
		C.llama_sampler_chain_add(chain, C.llama_sampler_init_greedy())
		return sampling{chain, g}, nil
	}
	if req.TopK > 0 {
		C.llama_sampler_chain_add(chain, C.llama_sampler_init_top_k(C.int32_t(req.TopK)))
	}
	if req.TopP > 0 && req.TopP < 1 {
		C.llama_sampler_chain_add(chain, C.llama_sampler_init_top_p(C.float(req.TopP), 1))
	}
	if req.MinP > 0 {
		C.llama_sampler_chain_add(chain, C.llama_sampler_init_min_p(C.float(req.MinP), 1))
	}
	C.llama_sampler_chain_add(chain, C.llama_sampler_init_temp(C.float(req.Temperature)))
	C.llama_sampler_chain_add(chain, C.llama_sampler_init_dist(C.uint32_t(req.Seed)))
	return sampling{chain, g}, nil
}

// logprobs fills tok's log probability and its top alternatives from the
// logits of batch index idx: the log-softmax of the model's raw logits,
// before any sampler changes them.
func (e *Engine) logprobs(tok *engine.Token, idx, top int, pieceBuf []byte) {
	logits := unsafe.Slice((*float32)(unsafe.Pointer(C.llama_get_logits_ith(e.lctx, C.int32_t(idx)))), e.info.Vocab)
	lse := logSumExp(logits)
	tok.Logprob = logits[tok.ID] - lse
	if top <= 0 {
		return
	}
	best := topIndices(logits, top)
	tok.Top = make([]engine.TokenLogprob, len(best))
	for i, id := range best {
		tok.Top[i] = engine.TokenLogprob{ID: id, Piece: e.piece(C.llama_token(id), pieceBuf), Logprob: logits[id] - lse}
	}
}

// logSumExp is log(Σ exp(x)), computed stably.
func logSumExp(xs []float32) float32 {
	m := float32(math.Inf(-1))
	for _, x := range xs {
		m = max(m, x)
	}
	var sum float64
	for _, x := range xs {
		sum += math.Exp(float64(x - m))
	}
	return m + float32(math.Log(sum))
}

// topIndices returns the indices of the n largest values, largest first
// (ties: lower index first).
func topIndices(xs []float32, n int) []int {
	n = min(n, len(xs))
	best := make([]int, 0, n+1)
	for i, x := range xs {
		if len(best) == n && x <= xs[best[n-1]] {
			continue
		}
		j := len(best)
		for j > 0 && x > xs[best[j-1]] {
			j--
		}
		best = slices.Insert(best, j, i)
		if len(best) > n {
			best = best[:n]
		}
	}
	return best
}
