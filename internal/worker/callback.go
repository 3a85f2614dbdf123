package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/rpc"
	"github.com/apiary-llm/apiary/internal/transport"
)

// reportReady POSTs {"worker_id","vram_bytes","uri"} to the callback URL
// with the worker's token (see deliver): ErrCallbackRefused,
// ErrCallbackFailed.
func (w *Worker) reportReady(ctx context.Context) error {
	w.mu.Lock()
	cb := api.ReadyCallback{WorkerID: w.cfg.WorkerID, VRAMBytes: w.info.MemoryBytes, URI: w.uri()}
	w.mu.Unlock()
	attempt, err := w.deliver(ctx, func() string { return w.cfg.CallbackURL }, w.cfg.Token, cb, nil, false, nil)
	var re refusedError
	switch {
	case err == nil:
		w.log.Info("ready callback accepted", "callback_url", w.cfg.CallbackURL, "uri", cb.URI,
			"vram_bytes", cb.VRAMBytes, "attempt", attempt)
		return nil
	case ctx.Err() != nil:
		return ctx.Err()
	case errors.As(err, &re):
		return fmt.Errorf("%w by %s: %w", ErrCallbackRefused, w.cfg.CallbackURL, err)
	}
	return fmt.Errorf("%w: %s did not accept it after %d attempts: %w", ErrCallbackFailed, w.cfg.CallbackURL, attempt, err)
}

// uri is the worker's URI for others: Advertise, else its scheme and
// listening address. Callers hold mu.
func (w *Worker) uri() string {
	if w.cfg.Advertise != "" {
		return strings.TrimSuffix(w.cfg.Advertise, "/")
	}
	return w.cfg.TLS.Scheme() + "://" + w.addr.String()
}

// deliver POSTs in to url() with token, and decodes a 2xx answer into out
// (when not nil). Connection errors and 5xx answers are retried
// CallbackAttempts times, pausing CallbackBackoff, then twice as long, …
// (failed, when not nil, hears of each such error first: it may change
// what url gives). A 4xx answer is final: a refusedError. It returns the
// attempts made.
// When ctx ends no attempt is made; with finish, the attempt under way
// still gets its answer (bounded by CallbackTimeout), so that a change
// the other side made is not lost.
func (w *Worker) deliver(ctx context.Context, url func() string, token string, in, out any, finish bool, failed func(error)) (int, error) {
	body, err := json.Marshal(in)
	if err != nil {
		return 0, fmt.Errorf("encode: %w", err)
	}
	client := transport.NewClient(nil, w.cfg.CallbackTimeout)
	defer client.CloseIdleConnections()
	pause := w.cfg.CallbackBackoff
	actx := ctx
	if finish {
		actx = context.WithoutCancel(ctx)
	}
	for attempt := 1; ; attempt++ {
		to := url()
		err := post(actx, client, to, token, body, out)
		if err == nil {
			return attempt, nil
		}
		if ctx.Err() != nil {
			return attempt, ctx.Err()
		}
		if re := (refusedError{}); errors.As(err, &re) || attempt >= w.cfg.CallbackAttempts {
			return attempt, err
		}
		if failed != nil {
			failed(err)
		}
		w.log.Warn("call failed; retrying", "url", to, "attempt", attempt, "retry_in_ms", pause.Milliseconds(), "err", err)
		t := time.NewTimer(pause)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return attempt, ctx.Err()
		}
		pause *= 2
	}
}

// refusedError is a 4xx answer: retrying will not help.
type refusedError struct{ err error }

func (e refusedError) Error() string { return e.err.Error() }
func (e refusedError) Unwrap() error { return e.err }

// post makes one attempt.
func post(ctx context.Context, client *http.Client, url, token string, body []byte, out any) error {
	err := rpc.Do(ctx, client, rpc.Call{Method: http.MethodPost, URL: url, Token: token,
		In: json.RawMessage(body), Out: out, MaxAnswer: 64 << 10})
	var se *rpc.StatusError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &se) && se.Status >= 400 && se.Status < 500:
		return refusedError{fmt.Errorf("answered %d %s: %s: %s", se.Status, http.StatusText(se.Status), se.Code, se.Message)}
	case errors.As(err, &se):
		return answerError{fmt.Sprintf("answered %d %s: %s: %s", se.Status, http.StatusText(se.Status), se.Code, se.Message), se}
	}
	return err
}

// answerError is a 5xx answer, said briefly, with the answer itself for
// errors.As (a standby queen's names the active one).
type answerError struct {
	msg string
	se  *rpc.StatusError
}

func (e answerError) Error() string { return e.msg }
func (e answerError) Unwrap() error { return e.se }
