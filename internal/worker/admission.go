package worker

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/apiary-llm/apiary/internal/engine"
	"github.com/apiary-llm/apiary/internal/openai"
)

// Error codes the worker adds to openai's.
const (
	codeModelLoading   = "model_loading"
	codeDraining       = "draining"
	codeQueueFull      = "queue_full"
	codeShuttingDown   = "shutting_down"
	codeGenerationFail = "generation_failed"
)

// serving returns the engine when the worker takes requests, or the 503 a
// client should see: model_loading or draining.
func (w *Worker) serving() (engine.Engine, engine.ModelInfo, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.acceptingLocked(); err != nil {
		return nil, engine.ModelInfo{}, err
	}
	return w.eng, w.info, nil
}

func (w *Worker) acceptingLocked() error {
	switch w.status {
	case StatusReady:
		return nil
	case StatusLoading:
		return &openai.Error{Status: http.StatusServiceUnavailable, Code: codeModelLoading,
			Message: fmt.Sprintf("model %s is still loading; retry shortly", w.cfg.ModelRef), RetryAfter: w.cfg.RetryAfter}
	default:
		return &openai.Error{Status: http.StatusServiceUnavailable, Code: codeDraining,
			Message: "this worker is shutting down and takes no new requests"}
	}
}

// admit waits for a generation slot. It fails at once with 503 queue_full
// when Slots generations run and QueueSize requests already wait, with 503
// draining when a shutdown begins while waiting, and with ctx's error when
// the client goes away. The returned release must be called once the
// generation ended.
func (w *Worker) admit(ctx context.Context) (release func(), err error) {
	return w.admitFor(ctx, false)
}

// admitGeneration is admit for a generation: a client that goes away
// hands its slot to the next request at once, while the engine still
// finishes the step it is in. The engine drops the abandoned sequence
// before it takes the next one (which waits for it in Engine.Generate
// meanwhile), so the next request joins the very next step rather than
// one after the abandoned request's handler has returned. (Embeddings
// keep their slot to the end: nothing else bounds their work.)
func (w *Worker) admitGeneration(ctx context.Context) (release func(), err error) {
	return w.admitFor(ctx, true)
}

func (w *Worker) admitFor(ctx context.Context, handOn bool) (release func(), err error) {
	w.mu.Lock()
	if err := w.acceptingLocked(); err != nil {
		w.mu.Unlock()
		return nil, err
	}
	if w.inFlight+w.queued >= w.cfg.Slots+w.cfg.QueueSize {
		inFlight, queued := w.inFlight, w.queued
		w.mu.Unlock()
		return nil, &openai.Error{Status: http.StatusServiceUnavailable, Code: codeQueueFull, RetryAfter: w.cfg.RetryAfter,
			Message: fmt.Sprintf("all %d slots are generating and %d requests are queued; retry later", inFlight, queued)}
	}
	w.queued++
	w.mu.Unlock()

	select {
	case w.slots <- struct{}{}:
	case <-ctx.Done():
		w.leaveQueue()
		return nil, context.Cause(ctx)
	case <-w.drainCtx.Done():
		w.leaveQueue()
		return nil, &openai.Error{Status: http.StatusServiceUnavailable, Code: codeDraining,
			Message: "this worker began shutting down while the request waited for a slot"}
	}

	w.mu.Lock()
	defer w.mu.Unlock()
	w.queued--
	if err := w.acceptingLocked(); err != nil {
		<-w.slots
		w.checkIdleLocked()
		return nil, err
	}
	w.inFlight++
	w.lastRequestAt = time.Now()
	var once sync.Once
	free := func() { once.Do(func() { <-w.slots }) }
	stop := func() bool { return false }
	if handOn {
		stop = context.AfterFunc(ctx, free)
	}
	return func() {
		stop()
		free()
		w.release()
	}, nil
}

// takeFreeSlots takes up to n more slots for a request already admitted,
// only those free now (it never waits, so requests that each want several
// cannot hold each other up), and returns how many it took and the
// function that gives them back.
func (w *Worker) takeFreeSlots(n int) (int, func()) {
	took := 0
	for took < n {
		select {
		case w.slots <- struct{}{}:
			took++
			continue
		default:
		}
		break
	}
	return took, func() {
		for range took {
			<-w.slots
		}
	}
}

func (w *Worker) leaveQueue() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.queued--
	w.checkIdleLocked()
}

// release ends a generation whose slot was freed.
func (w *Worker) release() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.inFlight--
	w.lastRequestAt = time.Now()
	w.checkIdleLocked()
}

// checkIdleLocked closes idle when a draining worker has nothing left.
func (w *Worker) checkIdleLocked() {
	if w.status == StatusDraining && w.inFlight == 0 && w.queued == 0 {
		close(w.idle)
	}
}
