package hive

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/transport"
	"github.com/apiary-llm/apiary/internal/version"
)

// queenClient registers the hive with its queen, heartbeats, and pushes
// every worker transition as it happens. The queen being away is not an
// error: the hive keeps working, and registers again when it answers.
type queenClient struct {
	h      *Hive
	base   string
	token  string
	hc     *http.Client
	log    *slog.Logger
	events chan api.WorkerEvent
}

// eventQueue bounds the events waiting for an unreachable queen; beyond it
// the oldest news is dropped (the next heartbeat carries the full state).
const eventQueue = 1024

// errQueenForgot means the queen answered that it does not know this pool.
var errQueenForgot = errors.New("hive: queen does not know this pool")

func newQueenClient(h *Hive) *queenClient {
	return &queenClient{
		h:      h,
		base:   strings.TrimSuffix(h.cfg.QueenURL, "/"),
		token:  h.cfg.ClusterToken,
		hc:     transport.NewClient(nil, max(h.cfg.HeartbeatInterval, time.Second)),
		log:    h.log.With("queen", h.cfg.QueenURL),
		events: make(chan api.WorkerEvent, eventQueue),
	}
}

// enqueue never blocks a worker's owner: a full queue drops the event.
func (q *queenClient) enqueue(ev api.WorkerEvent) {
	select {
	case q.events <- ev:
	default:
		q.h.metrics.queenEventsDrop.Inc()
		q.log.Warn("queen event queue full; dropping event", "worker_id", ev.WorkerID, "to", ev.To)
	}
}

// run heartbeats and delivers events until ctx ends, then tries for a
// moment to deliver what is still queued.
func (q *queenClient) run(ctx context.Context) {
	var g errgroup.Group
	g.Go(func() error { q.heartbeats(ctx); return nil })
	g.Go(func() error { q.deliver(ctx); return nil })
	_ = g.Wait()
	q.hc.CloseIdleConnections()
}

func (q *queenClient) heartbeats(ctx context.Context) {
	t := time.NewTimer(0)
	defer t.Stop()
	registered, down := false, false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		var err error
		if !registered {
			if err = q.register(ctx); err == nil {
				registered = true
				q.log.Info("registered with queen")
			}
		}
		if registered {
			if err = q.heartbeat(ctx); err != nil {
				registered = false
			} else {
				q.h.renewLease()
			}
		}
		switch {
		case err != nil && ctx.Err() == nil && !down:
			down = true
			q.log.Warn("queen unreachable; working standalone until it answers", "err", err)
		case err == nil && down:
			down = false
			q.log.Info("queen reachable again")
		}
		t.Reset(q.h.cfg.HeartbeatInterval)
	}
}

func (q *queenClient) register(ctx context.Context) error {
	gpus, err := q.h.gpus(ctx)
	if err != nil {
		return err
	}
	return q.post(ctx, "/v2/pools/register", api.RegisterPool{
		PoolID: q.h.cfg.PoolID, Endpoint: q.h.URL(), NodeID: q.h.cfg.NodeID,
		Version: version.Version, GPUs: gpus,
	})
}

func (q *queenClient) heartbeat(ctx context.Context) error {
	gpus, err := q.h.gpus(ctx)
	if err != nil {
		return err
	}
	return q.post(ctx, "/v2/pools/"+url.PathEscape(q.h.cfg.PoolID)+"/heartbeat", api.Heartbeat{
		GPUs: gpus, Workers: q.h.reg.brief(), WorkerTokens: q.h.reg.tokens(),
	})
}

// deliver sends queued events in order; one that fails is retried after a
// heartbeat interval, holding back the ones behind it.
func (q *queenClient) deliver(ctx context.Context) {
	var retry *time.Timer
	for {
		var ev api.WorkerEvent
		select {
		case ev = <-q.events:
		case <-ctx.Done():
			q.flush()
			return
		}
		for {
			err := q.post(ctx, "/v2/internal/workers/events", ev)
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				q.sendFinal(ev)
				q.flush()
				return
			}
			if retry == nil {
				retry = time.NewTimer(q.h.cfg.HeartbeatInterval)
				defer retry.Stop()
			} else {
				retry.Reset(q.h.cfg.HeartbeatInterval)
			}
			select {
			case <-retry.C:
			case <-ctx.Done():
				q.sendFinal(ev)
				q.flush()
				return
			}
		}
	}
}

// flush tries, briefly, to deliver what is queued when the hive stops: the
// queen wants to learn that the workers stopped.
func (q *queenClient) flush() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for {
		select {
		case ev := <-q.events:
			if err := q.post(ctx, "/v2/internal/workers/events", ev); err != nil {
				return
			}
		default:
			return
		}
	}
}

func (q *queenClient) sendFinal(ev api.WorkerEvent) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = q.post(ctx, "/v2/internal/workers/events", ev)
}

func (q *queenClient) post(ctx context.Context, path string, body any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, q.base+path, bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if q.token != "" {
		req.Header.Set("Authorization", "Bearer "+q.token)
	}
	resp, err := q.hc.Do(req)
	if err != nil {
		return fmt.Errorf("POST %s: %w", path, err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	switch {
	case resp.StatusCode/100 == 2:
		return nil
	case resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusGone:
		return fmt.Errorf("POST %s: %w (%s)", path, errQueenForgot, resp.Status)
	default:
		return fmt.Errorf("POST %s: %s: %s", path, resp.Status, api.RemoteError(resp.StatusCode, msg).Message)
	}
}
