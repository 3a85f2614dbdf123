package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/rpc"
	"github.com/apiary-llm/apiary/internal/transport"
)

// reportReady POSTs {"worker_id","vram_bytes","uri"} to the callback URL
// with the worker's token. Connection errors and 5xx answers are retried
// CallbackAttempts times, pausing CallbackBackoff, then twice as long, …
// A 4xx answer is final: ErrCallbackRefused. No 2xx after every try:
// ErrCallbackFailed.
func (w *Worker) reportReady(ctx context.Context) error {
	w.mu.Lock()
	cb := api.ReadyCallback{WorkerID: w.cfg.WorkerID, VRAMBytes: w.info.MemoryBytes, URI: w.cfg.TLS.Scheme() + "://" + w.addr.String()}
	w.mu.Unlock()
	body, err := json.Marshal(cb)
	if err != nil {
		return fmt.Errorf("%w: encode: %w", ErrCallbackFailed, err)
	}
	client := transport.NewClient(nil, w.cfg.CallbackTimeout)
	defer client.CloseIdleConnections()
	pause := w.cfg.CallbackBackoff
	for attempt := 1; ; attempt++ {
		err := w.postReady(ctx, client, body)
		if err == nil {
			w.log.Info("ready callback accepted", "callback_url", w.cfg.CallbackURL, "uri", cb.URI,
				"vram_bytes", cb.VRAMBytes, "attempt", attempt)
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if re := (refusedError{}); errors.As(err, &re) {
			return fmt.Errorf("%w by %s: %w", ErrCallbackRefused, w.cfg.CallbackURL, err)
		}
		if attempt >= w.cfg.CallbackAttempts {
			return fmt.Errorf("%w: %s did not accept it after %d attempts: %w", ErrCallbackFailed, w.cfg.CallbackURL, attempt, err)
		}
		w.log.Warn("ready callback failed; retrying", "callback_url", w.cfg.CallbackURL, "attempt", attempt,
			"retry_in_ms", pause.Milliseconds(), "err", err)
		t := time.NewTimer(pause)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
		pause *= 2
	}
}

// refusedError is a 4xx answer to the callback: retrying will not help.
type refusedError struct{ err error }

func (e refusedError) Error() string { return e.err.Error() }
func (e refusedError) Unwrap() error { return e.err }

// postReady makes one callback attempt.
func (w *Worker) postReady(ctx context.Context, client *http.Client, body []byte) error {
	err := rpc.Do(ctx, client, rpc.Call{Method: http.MethodPost, URL: w.cfg.CallbackURL, Token: w.cfg.Token,
		In: json.RawMessage(body), MaxAnswer: 4096})
	var se *rpc.StatusError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &se) && se.Status >= 400 && se.Status < 500:
		return refusedError{fmt.Errorf("answered %d %s: %s: %s", se.Status, http.StatusText(se.Status), se.Code, se.Message)}
	case errors.As(err, &se):
		return fmt.Errorf("answered %d %s: %s: %s", se.Status, http.StatusText(se.Status), se.Code, se.Message)
	}
	return err
}
