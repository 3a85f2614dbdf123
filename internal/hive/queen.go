package hive

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/rpc"
	"github.com/apiary-llm/apiary/internal/transport"
	"github.com/apiary-llm/apiary/internal/version"
)

// queenClient registers the hive with its queen, heartbeats, and pushes
// every worker transition as it happens. The queen being away is not an
// error: the hive keeps working, and registers again when it answers.
type queenClient struct {
	h *Hive
	// queens are the queens' URLs (one, or those of queens sharing a
	// PostgreSQL database) and the one spoken to: the next when it stops
	// answering or answers as a standby.
	queens *rpc.Queens
	token  string
	hc     *http.Client
	log    *slog.Logger
	events chan api.WorkerEvent
	// last is the last full heartbeat the queen took whole (the
	// heartbeat loop's alone); noUnchanged is set when the queen refused
	// an unchanged beat (one older than this hive): full beats only.
	last        lastBeat
	noUnchanged bool
	// load is the node's load the beats carry when the queen asks (the
	// heartbeat loop's alone).
	load nodeLoad
	// stream is the open heartbeat stream (nil: none), on streamHC (no
	// time limit of its own); noStream is set when the queen has none (an
	// older queen): one POST a beat then.
	stream     *rpc.Stream
	streamBase string // the base stream was opened on
	streamHC   *http.Client
	noStream   bool
	// up says whether the last registration or heartbeat was taken.
	up atomic.Bool
	// instance is this hive process's, drawn at random when it starts:
	// sent at registration and, in api.HiveInstanceHeader (header), with
	// every later call, so that the queen tells it from another hive with
	// the same pool id.
	instance string
	header   http.Header
	// heldLogged is when the heartbeat loop last logged that another hive
	// holds the pool (the heartbeat loop's alone).
	heldLogged time.Time
	// unsent are the events the queen did not take for want of an answer
	// (unsent.go).
	unsent unsent
}

// heldLogEvery is how often a hive that the queen refuses because another
// hive holds its pool id says so again while it retries.
const heldLogEvery = 5 * time.Minute

// registerRetryMin is the first wait before a queen that did not answer is
// tried again; it doubles up to the heartbeat interval.
const registerRetryMin = 250 * time.Millisecond

// eventQueue bounds the events waiting for an unreachable queen; beyond it
// the oldest news is dropped (the next heartbeat carries the full state).
const eventQueue = 1024

// errQueenForgot means the queen answered that it does not know this pool.
var errQueenForgot = errors.New("queen does not know this pool")

// errPoolHeld means the queen answered that another live hive holds this
// hive's pool id (409 pool_id_in_use): at registration, or, for a hive
// that was taken over, at any later call.
var errPoolHeld = errors.New("another hive holds this pool id")

func newQueenClient(h *Hive) *queenClient {
	hc := transport.NewClient(nil, max(h.cfg.HeartbeatInterval, time.Second))
	bases, _ := transport.BaseURLs("", h.cfg.QueenURL) // checked by Config.Validate
	instance := rand.Text()[:16]
	return &queenClient{
		instance: instance,
		header:   http.Header{api.HiveInstanceHeader: {instance}},
		h:        h,
		queens:   rpc.NewQueens(bases),
		token:    h.cfg.ClusterToken,
		hc:       hc,
		// The stream shares the connections' pool, without the limit on
		// each request's time: a stream lives as long as the hive.
		streamHC: transport.NewClient(hc.Transport.(*http.Transport), 0),
		log:      h.log.With("queen", h.cfg.QueenURL),
		events:   make(chan api.WorkerEvent, eventQueue),
		load:     nodeLoad{proc: "/proc"},
	}
}

// base is the URL of the queen spoken to now.
func (q *queenClient) base() string { return q.queens.Base() }

// follow moves to another queen of the list after err from the current
// one (rpc.Queens.Follow).
func (q *queenClient) follow(err error) {
	if from, moved := q.queens.Follow(err); moved {
		q.log.Info("following the queens: trying the next", "from", from, "to", q.base(), "err", err)
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
// moment to deliver what is still queued and to take the pool offline.
func (q *queenClient) run(ctx context.Context) {
	if q.h.data != nil {
		evs, err := q.h.data.loadUnsent()
		if err != nil {
			q.log.Warn("cannot read the worker events a previous hive left unsent", "err", err)
		}
		if len(evs) > 0 {
			q.log.Info("worker events a previous hive left unsent: sent after the registration", "events", len(evs))
		}
		q.unsent.add(evs...)
	}
	var g errgroup.Group
	g.Go(func() error { q.heartbeats(ctx); return nil })
	g.Go(func() error { q.deliver(ctx); return nil })
	_ = g.Wait()
	if q.stream != nil {
		q.stream.Close()
	}
	q.goOffline()
	if q.h.data != nil {
		evs := q.unsent.take()
		if err := q.h.data.saveUnsent(evs); err != nil {
			q.log.Error("cannot keep the worker events the queen did not take; their rows will be marked lost", "events", len(evs), "err", err)
		} else if len(evs) > 0 {
			q.log.Warn("the queen did not take the last worker events; kept for when this hive registers again", "events", len(evs),
				"file", q.h.data.unsentPath())
		}
	}
	q.hc.CloseIdleConnections()
}

// goOffline tells the queen the hive stops, once its workers' last events
// are sent: the pool is offline at once instead of healthy until its
// heartbeats time out (requests meanwhile would fail against a hive that
// is gone).
func (q *queenClient) goOffline() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if q.unsent.pending() && q.sendUnsent(ctx) != nil {
		// Offline would write the rows off as lost before their events
		// arrive: they are kept for the next registration instead.
		q.log.Warn("pool not taken offline at the queen: worker events are unsent; it goes unhealthy when the heartbeats stop")
		return
	}
	err := q.post(ctx, "/v2/pools/"+url.PathEscape(q.h.cfg.PoolID)+"/offline", api.PoolAction{Reason: "the hive stopped"})
	if err != nil {
		q.log.Warn("could not take the pool offline at the queen; it goes unhealthy when the heartbeats stop", "err", err)
		return
	}
	q.log.Info("pool offline at the queen")
}

func (q *queenClient) heartbeats(ctx context.Context) {
	t := time.NewTimer(0)
	defer t.Stop()
	registered, down := false, false
	var retry time.Duration // the wait before the next try of an unreachable queen
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		var err error
		if !registered {
			if err = q.register(ctx); err == nil {
				registered, q.last = true, lastBeat{} // the queen holds no heartbeat of this registration
				q.log.Info("registered with queen")
			}
		}
		if registered && q.unsent.pending() {
			// Before the heartbeat, whose inventory lacks the workers
			// these events end.
			err = q.sendUnsent(ctx)
		}
		if registered && err == nil {
			if err = q.heartbeat(ctx); err == nil {
				q.h.renewLease()
			} else if errors.Is(err, errQueenForgot) || errors.Is(err, errPoolHeld) {
				registered = false // register again, then beat
			}
		}
		q.up.Store(registered && err == nil)
		if err != nil && ctx.Err() == nil {
			q.follow(err)
		}
		q.h.settle()
		switch {
		case errors.Is(err, errPoolHeld) && ctx.Err() == nil:
			// Not a passing fault: an operator must act (or the other
			// hive stop). Said at once, and again every heldLogEvery
			// while it lasts.
			down = true
			if now := time.Now(); now.Sub(q.heldLogged) >= heldLogEvery {
				q.heldLogged = now
				q.log.Error("the queen refuses this hive: another live hive holds its pool id; working standalone and "+
					"registering again every heartbeat interval until that hive stops, or give this hive its own --pool-id",
					"pool_id", q.h.cfg.PoolID, "err", err)
			}
		case err != nil && ctx.Err() == nil && !down:
			down = true
			if qe := (*queenAnswer)(nil); errors.As(err, &qe) {
				q.log.Warn("queen refuses this hive's messages; working standalone until it takes them", "status", qe.status, "err", err)
			} else {
				q.log.Warn("queen unreachable; working standalone until it answers", "err", err)
			}
		case err == nil && down:
			down, q.heldLogged = false, time.Time{}
			q.log.Info("queen takes this hive's messages again")
		}
		// A queen that does not answer (not yet started, restarting) is
		// tried again soon, then less often, up to the heartbeat
		// interval: a hive started before its queen registers within a
		// second or so of the queen serving.
		if err != nil && errors.Is(err, rpc.ErrUnreachable) {
			retry = min(max(2*retry, registerRetryMin), q.h.cfg.HeartbeatInterval)
			t.Reset(retry)
			continue
		}
		retry = 0
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
		Version: version.Version, GPUs: gpus, MaxLoaded: q.h.cfg.MaxLoaded, Instance: q.instance,
	})
}

func (q *queenClient) heartbeat(ctx context.Context) error {
	devs, err := q.h.devices.Devices(ctx)
	if err != nil {
		return err
	}
	gpus := q.h.reg.devices(devs)
	workers, tokens := q.h.reg.heartbeat()
	hb := api.Heartbeat{GPUs: gpus, Workers: workers, WorkerTokens: tokens}
	now := time.Now()
	var load *api.NodeLoad
	if q.load.due(now) {
		load = q.load.read(devs)
	}
	if !q.noUnchanged && q.last.unchanged(hb, now) {
		var ans api.HeartbeatAnswer
		err := q.beat(ctx, api.Heartbeat{Unchanged: true, Load: load}, &ans)
		var qa *queenAnswer
		if err == nil {
			q.h.seeQueenEpoch(ans.QueenEpoch)
			q.loadTaken(load, ans, now)
		}
		switch {
		case err == nil && !ans.FullWanted:
			q.h.metrics.heartbeats.WithLabelValues("unchanged").Inc()
			return nil
		case errors.As(err, &qa) && qa.status == http.StatusBadRequest:
			q.noUnchanged = true
			q.log.Warn("queen refuses unchanged heartbeats (an older queen?); sending full ones", "err", err)
		case err != nil:
			return err
		}
		// Asked for the full heartbeat: it goes at once.
	}
	var ans api.HeartbeatAnswer
	q.last = lastBeat{}
	hb.Load = load
	if err := q.beat(ctx, hb, &ans); err != nil {
		return err
	}
	hb.Load = nil
	q.h.seeQueenEpoch(ans.QueenEpoch)
	q.loadTaken(load, ans, now)
	q.last = lastBeat{hb: hb, at: now, ok: len(ans.Refused) == 0}
	q.h.metrics.heartbeats.WithLabelValues("full").Inc()
	for _, r := range ans.Refused {
		// The queen fails the row of such a worker and stops it; say why
		// here too, where the hive's operator looks.
		q.log.Warn("queen refused this hive's report of a worker", "worker_id", r.WorkerID, "reason", r.Reason)
	}
	return nil
}

// loadTaken notes a beat the queen answered: when its load went, and how
// often the queen wants one from now on.
func (q *queenClient) loadTaken(load *api.NodeLoad, ans api.HeartbeatAnswer, now time.Time) {
	if load != nil {
		q.load.sent = now
	}
	every := time.Duration(max(0, ans.LoadEverySeconds)) * time.Second
	if q.load.every == 0 && every > 0 {
		// The baseline: the first load's CPU is over the next beat.
		q.load.prev, _ = q.load.proc.cpu()
	}
	q.load.every = every
}

// beat sends one heartbeat on the pool's heartbeat stream, opening it
// when none is open; a queen without streams (404 or 405 to the opening)
// gets one POST a beat from then on. A broken stream is dropped, and the
// next beat opens another.
func (q *queenClient) beat(ctx context.Context, hb api.Heartbeat, ans *api.HeartbeatAnswer) error {
	pool := "/v2/pools/" + url.PathEscape(q.h.cfg.PoolID)
	if q.noStream {
		return q.postFor(ctx, pool+"/heartbeat", hb, ans)
	}
	timeout := max(q.h.cfg.HeartbeatInterval, time.Second)
	if q.stream != nil && q.streamBase != q.base() {
		q.stream.Close() // opened on a queen no longer followed
		q.stream = nil
	}
	if q.stream == nil {
		base := q.base()
		s, err := rpc.OpenStream(ctx, q.streamHC, rpc.Call{URL: base + pool + "/beats", Token: q.token, MaxAnswer: 64 << 10,
			Header: q.header}, timeout)
		var se *rpc.StatusError
		switch {
		case errors.As(err, &se) && (se.Status == http.StatusNotFound || se.Status == http.StatusMethodNotAllowed):
			q.noStream = true
			q.log.Warn("queen has no heartbeat stream (an older queen?); one request a heartbeat", "err", err)
			return q.postFor(ctx, pool+"/heartbeat", hb, ans)
		case err != nil:
			return q.answer(pool+"/beats", err)
		}
		q.stream, q.streamBase = s, base
	}
	err := q.stream.Round(hb, ans, timeout)
	if errors.Is(err, rpc.ErrUnreachable) {
		q.stream = nil // Round closed it
	}
	return q.answer(pool+"/beats", err)
}

// maxEventAttempts bounds how often one event is sent: after it, the
// event is dropped (the next heartbeat carries the worker's state) so
// that the events behind it are not held back for long.
const maxEventAttempts = 5

// deliver sends queued events in order. An event the queen refuses (4xx)
// is logged and dropped: sending it again would be refused again. One
// that fails otherwise (no answer, 5xx) is retried with a doubling pause
// from a tenth of the heartbeat interval, at most maxEventAttempts times,
// holding back the ones behind it meanwhile.
func (q *queenClient) deliver(ctx context.Context) {
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	for {
		var ev api.WorkerEvent
		select {
		case ev = <-q.events:
		case <-ctx.Done():
			q.flush()
			return
		}
		if q.unsent.pending() {
			q.unsent.add(ev) // behind the unsent ones, in order
			continue
		}
		pause := max(q.h.cfg.HeartbeatInterval/10, 10*time.Millisecond)
		for attempt := 1; ; attempt++ {
			err := q.post(ctx, "/v2/internal/workers/events", ev)
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				q.sendFinal(ev)
				q.flush()
				return
			}
			if drop, why := eventDropped(err, attempt); drop {
				if unreachable(err) {
					q.unsent.add(ev)
					q.log.Warn("the queen does not take worker events; kept, to be sent before the next heartbeat", "worker_id", ev.WorkerID,
						"to", ev.To, "attempts", attempt, "err", err)
					break
				}
				q.h.metrics.queenEventsDrop.Inc()
				q.log.Warn("queen event dropped: "+why, "worker_id", ev.WorkerID, "to", ev.To, "attempts", attempt, "err", err)
				break
			}
			retry.Reset(pause)
			pause = min(2*pause, q.h.cfg.HeartbeatInterval)
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

// eventDropped decides, after a failed attempt, whether an event is given
// up: refused by the queen (4xx), or tried maxEventAttempts times.
func eventDropped(err error, attempt int) (bool, string) {
	var qe *queenAnswer
	switch {
	case errors.As(err, &qe) && qe.status/100 == 4:
		return true, "the queen refused it"
	case attempt >= maxEventAttempts:
		return true, "the queen did not take it; the next heartbeat carries the worker's state"
	}
	return false, ""
}

// flush tries, briefly, to deliver what is queued when the hive stops: the
// queen wants to learn that the workers stopped.
func (q *queenClient) flush() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if q.unsent.pending() && q.sendUnsent(ctx) != nil {
		q.keepQueued()
		return
	}
	for {
		select {
		case ev := <-q.events:
			if err := q.post(ctx, "/v2/internal/workers/events", ev); err != nil {
				if unreachable(err) {
					q.unsent.add(ev)
					q.keepQueued()
				}
				return
			}
		default:
			return
		}
	}
}

// keepQueued moves what is queued to the unsent list, in order.
func (q *queenClient) keepQueued() {
	for {
		select {
		case ev := <-q.events:
			q.unsent.add(ev)
		default:
			return
		}
	}
}

func (q *queenClient) sendFinal(ev api.WorkerEvent) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := q.post(ctx, "/v2/internal/workers/events", ev); err != nil && unreachable(err) {
		q.unsent.add(ev)
	}
}

// queenAnswer is a non-2xx answer of the queen.
type queenAnswer struct {
	path    string
	status  int
	code    string
	message string
	se      *rpc.StatusError // the answer, for rpc.Queens.Follow
}

func (e *queenAnswer) Unwrap() error { return e.se }

func (e *queenAnswer) Error() string {
	return fmt.Sprintf("POST %s: %d %s: %s", e.path, e.status, http.StatusText(e.status), e.message)
}

// Is makes a 404 or 410 errQueenForgot (the queen does not know this
// pool), and a 409 pool_id_in_use errPoolHeld.
func (e *queenAnswer) Is(target error) bool {
	switch target {
	case errQueenForgot:
		return e.status == http.StatusNotFound || e.status == http.StatusGone
	case errPoolHeld:
		return e.status == http.StatusConflict && e.code == "pool_id_in_use"
	}
	return false
}

func (q *queenClient) post(ctx context.Context, path string, body any) error {
	return q.postFor(ctx, path, body, nil)
}

// postFor posts body and decodes a 2xx answer into out (when not nil); a
// non-2xx answer is a *queenAnswer.
func (q *queenClient) postFor(ctx context.Context, path string, body, out any) error {
	err := rpc.Do(ctx, q.hc, rpc.Call{Method: http.MethodPost, URL: q.base() + path, Token: q.token, In: body, Out: out, MaxAnswer: 64 << 10,
		Header: q.header})
	return q.answer(path, err)
}

// answer makes a non-2xx answer to path a *queenAnswer.
func (q *queenClient) answer(path string, err error) error {
	var se *rpc.StatusError
	if errors.As(err, &se) {
		return &queenAnswer{path: path, status: se.Status, code: se.Code, message: se.Message, se: se}
	}
	return err
}

// pullReports bounds the attempts to tell the queen how a pull ended.
const pullReports = 5

// reportPull tells the queen how a model pull ended (POST
// /v2/internal/models/pulls), for its audit log and model catalog; an
// unreachable queen is tried again a few times, a second apart.
func (q *queenClient) reportPull(ctx context.Context, pull api.ModelPull) {
	var err error
	for attempt := range pullReports {
		if attempt > 0 {
			t := time.NewTimer(time.Second)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
		if err = q.post(ctx, "/v2/internal/models/pulls", pull); err == nil {
			return
		}
		if _, refused := errors.AsType[*queenAnswer](err); refused {
			break
		}
	}
	q.log.Warn("cannot tell the queen how a model pull ended", "pull_id", pull.ID, "err", err)
}
