package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/rpc"
	"github.com/apiary-llm/apiary/internal/transport"
)

// Sentinel errors of a worker run by hand (Config.QueenURL).
var (
	// ErrClaimRefused means the queen answered the claim with a 4xx: no
	// such row, a row of another model, a row that no longer waits, or a
	// worker the queen could not check.
	ErrClaimRefused = errors.New("claim refused by the queen")
	// ErrClaimFailed means the claim never got an answer it could accept
	// within the allowed attempts.
	ErrClaimFailed = errors.New("claim failed")
)

// claim tells the queen that this worker serves (POST
// /v2/workers/claim with the cluster token, tried as the ready callback
// is): it takes the row LifecycleID, or, without one, a row the queen
// creates for it. It returns the row's lifecycle id.
func (w *Worker) claim(ctx context.Context) (string, error) {
	w.mu.Lock()
	cl := api.WorkerClaim{LifecycleID: w.cfg.LifecycleID, ModelRef: w.cfg.ModelRef, URI: w.uri(), WorkerToken: w.cfg.Token,
		VRAMBytes: w.info.MemoryBytes, PID: os.Getpid()}
	w.mu.Unlock()
	url := func() string { return w.queenURL("/v2/workers/claim") }
	var resp api.AdminWorkerResponse
	// A shutdown during the claim lets the attempt under way finish: a
	// row the queen adopted must learn that its worker stops.
	attempt, err := w.deliver(ctx, url, w.cfg.ClusterToken, cl, &resp, true, w.followQueens)
	var re refusedError
	switch {
	case err == nil:
		w.log.Info("row claimed at the queen", "queen_url", w.queens.Base(), "lifecycle_id", resp.LifecycleID, "uri", cl.URI,
			"vram_bytes", cl.VRAMBytes, "attempt", attempt)
		return resp.LifecycleID, nil
	case ctx.Err() != nil:
		return "", ctx.Err()
	case errors.As(err, &re):
		return "", fmt.Errorf("%w: %w", ErrClaimRefused, err)
	}
	return "", fmt.Errorf("%w: %s did not accept it after %d attempts: %w", ErrClaimFailed, w.cfg.QueenURL, attempt, err)
}

// reclaim sends the claim of row id again every ClaimInterval until ctx
// ends: the queen takes it as a refresh (the row does not change) and so
// learns the worker's token again after a restart, when it had lost it.
// One try each time: a queen that does not answer is asked again at the
// next interval. A queen that answers that the row is not this worker's
// any more (404 worker_not_found: no such row; 409 claim_refused: the row
// ended, the queen found the worker lost) stops the worker: reclaim asks
// for the shutdown and returns ErrClaimRefused. Other refusals (the queen
// could not check the worker this time) are logged and tried again.
func (w *Worker) reclaim(ctx context.Context, id string) error {
	w.mu.Lock()
	cl := api.WorkerClaim{LifecycleID: id, ModelRef: w.cfg.ModelRef, URI: w.uri(), WorkerToken: w.cfg.Token,
		VRAMBytes: w.info.MemoryBytes, PID: os.Getpid()}
	w.mu.Unlock()
	client := transport.NewClient(nil, w.cfg.CallbackTimeout)
	defer client.CloseIdleConnections()
	t := time.NewTicker(w.cfg.ClaimInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		cctx, cancel := context.WithTimeout(ctx, w.cfg.CallbackTimeout)
		err := rpc.Do(cctx, client, rpc.Call{Method: http.MethodPost, URL: w.queenURL("/v2/workers/claim"), Token: w.cfg.ClusterToken, In: cl, MaxAnswer: 64 << 10})
		cancel()
		var se *rpc.StatusError
		switch {
		case err == nil:
			w.log.Debug("row claimed again at the queen", "lifecycle_id", id)
			continue
		case ctx.Err() != nil:
			return nil
		case errors.As(err, &se) && (se.Status == http.StatusNotFound || se.Status == http.StatusConflict):
			err = fmt.Errorf("%w: the queen no longer has row %s for this worker: %d %s: %s", ErrClaimRefused, id, se.Status, se.Code, se.Message)
			w.log.Error("row lost at the queen; shutting down", "queen_url", w.queens.Base(), "lifecycle_id", id, "err", err)
			w.requestQuit()
			return err
		}
		w.log.Warn("cannot claim the row again at the queen; trying at the next interval", "queen_url", w.queens.Base(),
			"lifecycle_id", id, "retry_in_ms", w.cfg.ClaimInterval.Milliseconds(), "err", err)
		w.followQueens(err)
	}
}

// report tells the queen that the row id is DRAINING or STOPPED, once
// (the next queen of the list when one does not answer or stands by): a
// queen that does not hear it finds out by its health checks.
func (w *Worker) report(id, status, reason string) {
	if id == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), w.cfg.CallbackTimeout)
	defer cancel()
	client := transport.NewClient(nil, w.cfg.CallbackTimeout)
	defer client.CloseIdleConnections()
	body, err := json.Marshal(api.WorkerReport{Status: status, Reason: reason})
	for range w.queens.Len() {
		if err != nil {
			break
		}
		if err = post(ctx, client, w.queenURL("/v2/workers/"+id+"/report"), w.cfg.ClusterToken, body, nil); err == nil {
			break
		}
		if _, moved := w.queens.Follow(err); !moved {
			break
		}
	}
	if err != nil {
		w.log.Warn("cannot report to the queen", "queen_url", w.cfg.QueenURL, "status", status, "err", err)
		return
	}
	w.log.Info("reported to the queen", "status", status)
}

// followQueens moves to another queen of the list after err from the one
// spoken to (rpc.Queens.Follow).
func (w *Worker) followQueens(err error) {
	if from, moved := w.queens.Follow(err); moved {
		w.log.Info("following the queens: trying the next", "from", from, "to", w.queens.Base(), "err", err)
	}
}

// queensOf is the queens of a worker run by hand (list checked by
// Config.Validate), or nil.
func queensOf(list string) *rpc.Queens {
	if list == "" {
		return nil
	}
	urls, _ := transport.BaseURLs("queen URL", list)
	return rpc.NewQueens(urls)
}

func (w *Worker) queenURL(path string) string { return w.queens.Base() + path }
