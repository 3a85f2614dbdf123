package routing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

func TestPick(t *testing.T) {
	a, b, c := WorkerKey{"p1", "a"}, WorkerKey{"p1", "b"}, WorkerKey{"p2", "c"}
	cands := []Candidate{{Key: a, Reported: 3}, {Key: b, Reported: 0}, {Key: c}}
	for _, tc := range []struct {
		name     string
		inflight map[WorkerKey]int
		slots    int
		pin      *WorkerKey
		exclude  map[WorkerKey]bool
		want     pickResult
	}{
		{name: "fewest in flight, then fewest reported, then the first", slots: 1, want: pickResult{index: 1}},
		{name: "fewest in flight from the queen first", slots: 4, inflight: map[WorkerKey]int{b: 2, c: 1}, want: pickResult{index: 0}},
		{name: "full workers are skipped", slots: 1, inflight: map[WorkerKey]int{a: 1, b: 1}, want: pickResult{index: 2}},
		{name: "all full", slots: 1, inflight: map[WorkerKey]int{a: 1, b: 1, c: 1}, want: pickResult{index: -1}},
		{name: "excluded workers are skipped", slots: 1, exclude: map[WorkerKey]bool{b: true}, want: pickResult{index: 2}},
		{name: "a pin to a live worker wins", slots: 2, pin: &c, inflight: map[WorkerKey]int{c: 1}, want: pickResult{index: 2, pinned: true}},
		{name: "a pin to a full worker waits for it", slots: 1, pin: &c, inflight: map[WorkerKey]int{c: 1}, want: pickResult{index: -1, pinned: true}},
		{name: "a pin to a gone worker is a miss", slots: 1, pin: &WorkerKey{"p9", "x"}, want: pickResult{index: 1}},
		{name: "a pin to an excluded worker is a miss", slots: 1, pin: &b, exclude: map[WorkerKey]bool{b: true, c: true}, want: pickResult{index: 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := pick(cands, counters(cands, tc.inflight), tc.slots, tc.pin, tc.exclude); got != tc.want {
				t.Errorf("pick = %+v, want %+v", got, tc.want)
			}
		})
	}
	// Ties go to the first listed (the control plane lists by key).
	tied := []Candidate{{Key: c}, {Key: b}, {Key: a}}
	if got := pick(tied, counters(tied, map[WorkerKey]int{c: 1}), 4, nil, nil); got != (pickResult{index: 1}) {
		t.Errorf("pick among ties = %+v, want the first of the least loaded (index 1)", got)
	}
}

func TestDecideScale(t *testing.T) {
	now := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	const after = 2 * time.Second
	for _, tc := range []struct {
		name string
		in   modelDemand
		want scaleDecision
	}{
		{name: "cold start places at once",
			in: modelDemand{Model: "m", Queued: 3, MaxWorkers: 1},
			want: scaleDecision{Place: []placeOrder{{Model: "m", Kind: "cold_start",
				Reason: "demand: 3 requests for m waiting, no worker runs it"}}, Recheck: demandResync}},
		{name: "one placement at a time",
			in:   modelDemand{Model: "m", Queued: 3, Live: 1, Starting: 1, MaxWorkers: 4, OldestWait: time.Minute},
			want: scaleDecision{Recheck: demandResync}},
		{name: "short waits wait for the threshold",
			in:   modelDemand{Model: "m", Queued: 3, Live: 1, Routable: 1, MaxWorkers: 2, OldestWait: 1800 * time.Millisecond},
			want: scaleDecision{Recheck: 200 * time.Millisecond}},
		{name: "waiting targets are looked at again within demandResync",
			in:   modelDemand{Model: "m", Queued: 3, Live: 1, Routable: 1, MaxWorkers: 2, OldestWait: 500 * time.Millisecond},
			want: scaleDecision{Recheck: demandResync}},
		{name: "a long wait scales up",
			in: modelDemand{Model: "m", Queued: 5, Live: 1, Routable: 1, MaxWorkers: 2, OldestWait: 2500 * time.Millisecond},
			want: scaleDecision{Place: []placeOrder{{Model: "m", Kind: "scale_up",
				Reason: "demand: 5 requests for m waiting, the oldest for 2.5s (threshold 2s), 1 of at most 2 workers live"}}, Recheck: demandResync}},
		{name: "never beyond max workers",
			in:   modelDemand{Model: "m", Queued: 5, Live: 2, Routable: 2, MaxWorkers: 2, OldestWait: time.Minute},
			want: scaleDecision{Recheck: demandResync}},
		{name: "not before the retry time",
			in:   modelDemand{Model: "m", Queued: 1, MaxWorkers: 1, RetryAt: now.Add(300 * time.Millisecond)},
			want: scaleDecision{Recheck: 300 * time.Millisecond}},
		{name: "max workers 0 and none live: refused",
			in: modelDemand{Model: "m", Queued: 1},
			want: scaleDecision{Refuse: []refusal{{Model: "m",
				Why: "model m is not placed on demand (its max workers is 0) and no worker of it runs; an operator must start one"}}}},
		{name: "max workers 0 with an operator's worker: wait for it",
			in:   modelDemand{Model: "m", Queued: 1, Live: 1, Routable: 1, OldestWait: time.Minute},
			want: scaleDecision{Recheck: demandResync}},
		{name: "nothing queued", in: modelDemand{Model: "m", MaxWorkers: 3}, want: scaleDecision{}},
		{name: "pinned: cold start on the pool while the model runs elsewhere",
			in: modelDemand{Model: "m", Pool: "n1", Queued: 2, ModelLive: 1, MaxWorkers: 2},
			want: scaleDecision{Place: []placeOrder{{Model: "m", Pool: "n1", Kind: "cold_start",
				Reason: "demand: 2 requests for m on pool n1 waiting, no worker runs it on pool n1"}}, Recheck: demandResync}},
		{name: "pinned: the pool's worker is waited for",
			in:   modelDemand{Model: "m", Pool: "n1", Queued: 2, Live: 1, Routable: 1, ModelLive: 2, MaxWorkers: 4, OldestWait: 1500 * time.Millisecond},
			want: scaleDecision{Recheck: 500 * time.Millisecond}},
		{name: "pinned: scale up counts the model's workers on every pool",
			in: modelDemand{Model: "m", Pool: "n1", Queued: 2, Live: 1, Routable: 1, ModelLive: 2, MaxWorkers: 3, OldestWait: 3 * time.Second},
			want: scaleDecision{Place: []placeOrder{{Model: "m", Pool: "n1", Kind: "scale_up",
				Reason: "demand: 2 requests for m on pool n1 waiting, the oldest for 3s (threshold 2s), 2 of at most 3 workers live"}}, Recheck: demandResync}},
		{name: "pinned: the pool's first worker even with the max elsewhere",
			in: modelDemand{Model: "m", Pool: "n1", Queued: 1, ModelLive: 2, MaxWorkers: 2},
			want: scaleDecision{Place: []placeOrder{{Model: "m", Pool: "n1", Kind: "cold_start",
				Reason: "demand: 1 requests for m on pool n1 waiting, no worker runs it on pool n1"}}, Recheck: demandResync}},
		{name: "pinned: no scale up beyond the max",
			in:   modelDemand{Model: "m", Pool: "n1", Queued: 1, Live: 1, Routable: 1, ModelLive: 2, MaxWorkers: 2, OldestWait: time.Minute},
			want: scaleDecision{Recheck: demandResync}},
		{name: "pinned: max workers 0",
			in: modelDemand{Model: "m", Pool: "n1", Queued: 1, ModelLive: 1},
			want: scaleDecision{Refuse: []refusal{{Model: "m", Pool: "n1",
				Why: "model m is not placed on demand (its max workers is 0) and no worker of it runs on pool n1; an operator must start one"}}}},

		// Requests wait only for capacity that is coming.
		{name: "nothing serves or starts and no pool can take one: refused with the reasons",
			in:   modelDemand{Model: "m", Queued: 2, MaxWorkers: 1, NoPlace: "no pool can run m (a: pool is draining)"},
			want: scaleDecision{Refuse: []refusal{{Model: "m", Why: "no pool can run m (a: pool is draining)"}}}},
		{name: "no pool can take one, during a backoff too",
			in: modelDemand{Model: "m", Queued: 1, MaxWorkers: 1, NoPlace: "no pool can run m (a: pool is unhealthy)",
				RetryAt: now.Add(4 * time.Second), LastFailure: "the worker placed for m failed to start: exit 1"},
			want: scaleDecision{Refuse: []refusal{{Model: "m", Why: "no pool can run m (a: pool is unhealthy)"}}}},
		{name: "the last placement failed: refused with its reason until the retry",
			in: modelDemand{Model: "m", Queued: 1, MaxWorkers: 1, RetryAt: now.Add(2 * time.Second),
				LastFailure: "the worker placed for m on pool a failed to start"},
			want: scaleDecision{Refuse: []refusal{{Model: "m", Why: "the worker placed for m on pool a failed to start",
				RetryAfter: 2 * time.Second}}}},
		{name: "after the backoff the last failure is tried again",
			in: modelDemand{Model: "m", Queued: 1, MaxWorkers: 1, RetryAt: now.Add(-time.Second), LastFailure: "hive refused"},
			want: scaleDecision{Place: []placeOrder{{Model: "m", Kind: "cold_start",
				Reason: "demand: 1 requests for m waiting, no worker runs it"}}, Recheck: demandResync}},
		{name: "a worker starting is waited for",
			in:   modelDemand{Model: "m", Queued: 1, Live: 1, Starting: 1, MaxWorkers: 1, RetryAt: now.Add(time.Second), LastFailure: "earlier"},
			want: scaleDecision{Recheck: demandResync}},
		{name: "a serving worker's slot is waited for",
			in:   modelDemand{Model: "m", Queued: 1, Live: 1, Routable: 1, MaxWorkers: 1, RetryAt: now.Add(time.Second), LastFailure: "earlier"},
			want: scaleDecision{Recheck: demandResync}},
		{name: "a live worker that does not serve now (degraded) is waited for",
			in:   modelDemand{Model: "m", Queued: 1, Live: 1, MaxWorkers: 1, OldestWait: time.Minute},
			want: scaleDecision{Recheck: demandResync}},
		{name: "pinned: the pool's reason",
			in:   modelDemand{Model: "m", Pool: "n1", Queued: 1, ModelLive: 1, MaxWorkers: 2, NoPlace: "no pool can run m (n1: pool is draining)"},
			want: scaleDecision{Refuse: []refusal{{Model: "m", Pool: "n1", Why: "no pool can run m (n1: pool is draining)"}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.in.Pool == "" && tc.in.ModelLive == 0 {
				tc.in.ModelLive = tc.in.Live
			}
			got := decideScale(now, []modelDemand{tc.in}, after)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("decision (-want +got):\n%s", diff)
			}
		})
	}
}

func TestPlaceBackoff(t *testing.T) {
	var got []time.Duration
	for n := range 9 {
		got = append(got, placeBackoff(n))
	}
	want := []time.Duration{0, time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second,
		30 * time.Second, 30 * time.Second, 30 * time.Second}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("backoff (-want +got):\n%s", diff)
	}
}

// testRouter is a router over a list of candidates the test changes.
type testRouter struct {
	*router
	reg    *prometheus.Registry
	mu     sync.Mutex
	cands  []Candidate // guarded by mu
	demand int         // guarded by mu
}

func newTestRouter(cfg Config, cands ...Candidate) *testRouter {
	tr := &testRouter{cands: cands, reg: prometheus.NewRegistry()}
	cfg = cfg.WithDefaults()
	m := newRouteMetrics(tr.reg, func() int { return 0 })
	tr.router = newRouter(cfg, slog.New(slog.DiscardHandler), func(t target) []Candidate {
		tr.mu.Lock()
		defer tr.mu.Unlock()
		var out []Candidate
		for _, c := range tr.cands {
			if t.pool == "" || c.Key.Pool == t.pool {
				out = append(out, c)
			}
		}
		return out
	}, newAffinity(cfg.AffinityTTL, 10), m, func() {
		tr.mu.Lock()
		tr.demand++
		tr.mu.Unlock()
	})
	return tr
}

func (tr *testRouter) set(cands ...Candidate) {
	tr.mu.Lock()
	tr.cands = cands
	tr.mu.Unlock()
	tr.poke()
}

// acquireAsync starts an acquire and returns where its answer comes.
func (tr *testRouter) acquireAsync(ctx context.Context, req routeReq) chan grant {
	ch := make(chan grant, 1)
	go func() {
		l, err := tr.acquire(ctx, req)
		ch <- grant{l, err}
	}()
	return ch
}

func TestRouterQueue(t *testing.T) {
	a, b := Candidate{Key: WorkerKey{"p", "a"}, URI: "http://a"}, Candidate{Key: WorkerKey{"p", "b"}, URI: "http://b"}
	synctest.Test(t, func(t *testing.T) {
		tr := newTestRouter(Config{QueueSize: 2, QueueTimeout: 10 * time.Second}, a)
		ctx := t.Context()

		l1, err := tr.acquire(ctx, routeReq{model: "m"})
		if err != nil || l1.cand.Key != a.Key {
			t.Fatalf("first acquire: %+v %v", l1, err)
		}
		// a is full: the next two wait, in order; the third is refused.
		w1 := tr.acquireAsync(ctx, routeReq{model: "m"})
		synctest.Wait()
		w2 := tr.acquireAsync(ctx, routeReq{model: "m"})
		synctest.Wait()
		if _, err := tr.acquire(ctx, routeReq{model: "m"}); !errors.Is(err, ErrQueueFull) {
			t.Fatalf("third waiter: %v, want ErrQueueFull", err)
		}
		if stats := tr.queueStats(); len(stats) != 1 || stats[0].queued != 2 || tr.demand != 2 {
			t.Fatalf("queue %+v, demand signals %d", stats, tr.demand)
		}
		// A worker appears: the oldest waiter gets it.
		tr.set(a, b)
		g := <-w1
		if g.err != nil || g.l.cand.Key != b.Key {
			t.Fatalf("first waiter: %+v", g)
		}
		// a's slot comes back: the second waiter gets it.
		tr.release(l1, false)
		g = <-w2
		if g.err != nil || g.l.cand.Key != a.Key {
			t.Fatalf("second waiter: %+v", g)
		}
		if got := tr.inFlight(); got[a.Key] != 1 || got[b.Key] != 1 {
			t.Errorf("in flight %v", got)
		}

		// Both full: a waiter gives up after the queue timeout.
		start := time.Now()
		if _, err := tr.acquire(ctx, routeReq{model: "m"}); !errors.Is(err, ErrQueueTimeout) || time.Since(start) != 10*time.Second {
			t.Errorf("timeout: %v after %s", err, time.Since(start))
		}
		// A client that leaves is out of the queue.
		cctx, cancel := context.WithCancel(ctx)
		w3 := tr.acquireAsync(cctx, routeReq{model: "m"})
		synctest.Wait()
		cancel()
		if g := <-w3; !errors.Is(g.err, context.Canceled) || len(tr.queueStats()) != 0 {
			t.Errorf("cancelled waiter: %v, queue %+v", g.err, tr.queueStats())
		}
		// A broken worker gets nothing until brokenFor passed.
		tr.release(g.l, false)
		tr.release(lease{model: "m", cand: a}, true)
		tr.release(lease{model: "m", cand: b}, false)
		l, err := tr.acquire(ctx, routeReq{model: "m"})
		if err != nil || l.cand.Key != b.Key {
			t.Fatalf("after a broke: %+v %v", l, err)
		}
		tr.release(l, false)
		time.Sleep(brokenFor)
		if l, err := tr.acquire(ctx, routeReq{model: "m"}); err != nil || l.cand.Key != a.Key {
			t.Errorf("after brokenFor: %+v %v", l, err)
		} else {
			tr.release(l, false)
		}

		// failModel and close answer the waiters.
		tr.set()
		w4 := tr.acquireAsync(ctx, routeReq{model: "m"})
		synctest.Wait()
		if n := tr.fail(target{model: "m"}, ErrNoCapacity); n != 1 {
			t.Errorf("fail answered %d", n)
		}
		if g := <-w4; !errors.Is(g.err, ErrNoCapacity) {
			t.Errorf("failed waiter: %v", g.err)
		}
		w5 := tr.acquireAsync(ctx, routeReq{model: "m"})
		synctest.Wait()
		tr.close()
		if g := <-w5; !errors.Is(g.err, ErrShuttingDown) {
			t.Errorf("waiter at close: %v", g.err)
		}
		if _, err := tr.acquire(ctx, routeReq{model: "m"}); !errors.Is(err, ErrShuttingDown) {
			t.Errorf("acquire after close: %v", err)
		}
		if got := tr.counter("apiary_queen_queue_rejected_total", "queue_full"); got != 1 {
			t.Errorf("queue_full count %v", got)
		}
		if got := tr.counter("apiary_queen_queue_rejected_total", "timeout"); got != 1 {
			t.Errorf("timeout count %v", got)
		}
	})
}

// A session is pinned to its worker: it waits for it while it is busy
// (others pass it), and is served elsewhere once the worker is gone.
func TestRouterAffinity(t *testing.T) {
	a, b := Candidate{Key: WorkerKey{"p", "a"}}, Candidate{Key: WorkerKey{"p", "b"}}
	synctest.Test(t, func(t *testing.T) {
		tr := newTestRouter(Config{AffinityTTL: time.Minute}, a, b)
		ctx := t.Context()
		s1, err := tr.acquire(ctx, routeReq{model: "m", session: "s"})
		if err != nil || s1.cand.Key != a.Key || s1.pinned {
			t.Fatalf("first request of the session: %+v %v", s1, err)
		}
		// s's worker a is full: s waits for it, another request passes to b.
		ws := tr.acquireAsync(ctx, routeReq{model: "m", session: "s"})
		synctest.Wait()
		other, err := tr.acquire(ctx, routeReq{model: "m"})
		if err != nil || other.cand.Key != b.Key {
			t.Fatalf("request without a session: %+v %v", other, err)
		}
		tr.release(s1, false)
		g := <-ws
		if g.err != nil || g.l.cand.Key != a.Key || !g.l.pinned {
			t.Fatalf("pinned request: %+v", g)
		}
		tr.release(g.l, false)
		tr.release(other, false)

		// The pin outlives requests by the TTL, then goes.
		time.Sleep(59 * time.Second)
		if k, ok := tr.aff.get("m", "s", time.Now()); !ok || k != a.Key {
			t.Errorf("pin before the TTL: %v %v", k, ok)
		}
		time.Sleep(time.Second)
		if _, ok := tr.aff.get("m", "s", time.Now()); ok {
			t.Error("pin lived past its TTL")
		}

		// A pin to a worker that is gone is a miss, and pins anew.
		l, _ := tr.acquire(ctx, routeReq{model: "m", session: "t"})
		tr.release(l, false)
		tr.set(b)
		l, err = tr.acquire(ctx, routeReq{model: "m", session: "t"})
		if err != nil || l.cand.Key != b.Key || l.pinned {
			t.Fatalf("session of a gone worker: %+v %v", l, err)
		}
		tr.release(l, false)
		if k, _ := tr.aff.get("m", "t", time.Now()); k != b.Key {
			t.Errorf("session t pinned to %v, want b", k)
		}
	})
}

// Expired pins are swept in the background, within a quarter of the TTL.
func TestAffinitySweep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		aff := newAffinity(time.Minute, 3)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { aff.run(ctx); close(done) }()
		now := time.Now()
		aff.set("m", "s1", WorkerKey{"p", "a"}, now)
		aff.set("m", "s2", WorkerKey{"p", "b"}, now.Add(30*time.Second))
		aff.set("n", "s1", WorkerKey{"p", "c"}, now)
		aff.set("m", "s4", WorkerKey{"p", "d"}, now) // over the limit: not pinned
		if aff.size() != 3 {
			t.Fatalf("%d pins, want 3 (the limit)", aff.size())
		}
		time.Sleep(time.Minute + aff.sweepEvery())
		synctest.Wait()
		if aff.size() != 1 {
			t.Errorf("%d pins after the first TTL, want 1", aff.size())
		}
		aff.forget(WorkerKey{"p", "b"})
		if aff.size() != 0 {
			t.Errorf("%d pins after forget", aff.size())
		}
		cancel()
		<-done
	})
}

// counter reads the counter name whose labels include value (0 if none).
func (tr *testRouter) counter(name, value string) float64 {
	if m := tr.metric(name, value); m != nil {
		return m.GetCounter().GetValue()
	}
	return 0
}

// gauge reads the gauge name whose labels include value (-1 if none).
func (tr *testRouter) gauge(name, value string) float64 {
	if m := tr.metric(name, value); m != nil {
		return m.GetGauge().GetValue()
	}
	return -1
}

func (tr *testRouter) metric(name, value string) *dto.Metric {
	families, err := tr.reg.Gather()
	if err != nil {
		panic(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetValue() == value {
					return m
				}
			}
		}
	}
	return nil
}

// A request pinned to a pool (X-Apiary-Pool) is served only by that
// pool's workers: it waits for them while they are full (requests for any
// pool pass it), and its queue is its own demand.
func TestRouterPoolPinning(t *testing.T) {
	a, c := Candidate{Key: WorkerKey{"p1", "a"}}, Candidate{Key: WorkerKey{"p2", "c"}}
	synctest.Test(t, func(t *testing.T) {
		tr := newTestRouter(Config{QueueSize: 4, QueueTimeout: time.Minute}, a, c)
		ctx := t.Context()
		busy, err := tr.acquire(ctx, routeReq{model: "m", pool: "p2"})
		if err != nil || busy.cand.Key != c.Key {
			t.Fatalf("pinned to p2: %+v %v", busy, err)
		}
		// c (p2's only worker) is full: a request pinned to p2 waits, one
		// for any pool goes to a.
		pinned := tr.acquireAsync(ctx, routeReq{model: "m", pool: "p2"})
		synctest.Wait()
		free, err := tr.acquire(ctx, routeReq{model: "m"})
		if err != nil || free.cand.Key != a.Key {
			t.Fatalf("unpinned while p2 is full: %+v %v", free, err)
		}
		if stats := tr.queueStats(); len(stats) != 1 || stats[0].target != (target{"m", "p2"}) || stats[0].queued != 1 {
			t.Fatalf("queues %+v, want one request pinned to p2", stats)
		}
		// a's slot coming back does not serve p2's waiter; c's does.
		tr.release(free, false)
		synctest.Wait()
		select {
		case g := <-pinned:
			t.Fatalf("p2's waiter served by p1's release: %+v", g)
		default:
		}
		tr.release(busy, false)
		if g := <-pinned; g.err != nil || g.l.cand.Key != c.Key {
			t.Fatalf("p2's waiter: %+v", g)
		} else {
			tr.release(g.l, false)
		}
		// A pool with no worker of the model: the request waits as demand
		// for that pool, and the depth gauge counts it under its model.
		none := tr.acquireAsync(ctx, routeReq{model: "m", pool: "p3"})
		synctest.Wait()
		if stats := tr.queueStats(); len(stats) != 1 || stats[0].target != (target{"m", "p3"}) {
			t.Fatalf("queues %+v, want one request pinned to p3", stats)
		}
		if got := tr.gauge("apiary_queen_queue_depth", "m"); got != 1 {
			t.Errorf("queue depth of m: %v, want 1", got)
		}
		p3 := Candidate{Key: WorkerKey{"p3", "d"}}
		tr.set(a, c, p3)
		if g := <-none; g.err != nil || g.l.cand.Key != p3.Key {
			t.Fatalf("p3's waiter: %+v", g)
		}
		if got := tr.gauge("apiary_queen_queue_depth", "m"); got != 0 {
			t.Errorf("queue depth of m after: %v, want 0", got)
		}
	})
}

// Batch requests take only the slots no interactive request waits for:
// a freed slot goes to the interactive waiter even when a batch request
// waited longer; a batch waiter is served once no interactive one is
// left; batch waiters count as demand but not against QueueSize, and
// wait past QueueTimeout.
func TestRouterBatchGoesLast(t *testing.T) {
	a := Candidate{Key: WorkerKey{"p", "a"}, URI: "http://a"}
	synctest.Test(t, func(t *testing.T) {
		tr := newTestRouter(Config{QueueSize: 1, QueueTimeout: 10 * time.Second}, a)
		ctx := t.Context()
		// A batch request takes the free slot at once.
		l1, err := tr.acquire(ctx, routeReq{model: "m", batch: true})
		if err != nil || l1.cand.Key != a.Key {
			t.Fatalf("batch acquire: %+v %v", l1, err)
		}
		// a is full: two batch requests wait (past QueueSize), then an
		// interactive one.
		b1 := tr.acquireAsync(ctx, routeReq{model: "m", batch: true})
		synctest.Wait()
		b2 := tr.acquireAsync(ctx, routeReq{model: "m", batch: true})
		synctest.Wait()
		i1 := tr.acquireAsync(ctx, routeReq{model: "m"})
		synctest.Wait()
		if stats := tr.queueStats(); len(stats) != 1 || stats[0].queued != 3 {
			t.Fatalf("queue %+v: want the 3 waiters as demand", stats)
		}
		// The slot comes back: the interactive request gets it.
		tr.release(l1, false)
		g := <-i1
		if g.err != nil {
			t.Fatalf("interactive waiter: %v", g.err)
		}
		select {
		case g := <-b1:
			t.Fatalf("a batch waiter was served before the interactive one ended: %+v", g)
		default:
		}
		// Past the queue timeout the batch requests still wait; the slot
		// goes to the oldest of them when no interactive request waits.
		time.Sleep(20 * time.Second)
		synctest.Wait()
		tr.release(g.l, false)
		gb1 := <-b1
		if gb1.err != nil || gb1.l.cand.Key != a.Key {
			t.Fatalf("first batch waiter: %+v", gb1)
		}
		// A new interactive request passes the batch request still waiting.
		i2 := tr.acquireAsync(ctx, routeReq{model: "m"})
		synctest.Wait()
		tr.release(gb1.l, false)
		gi2 := <-i2
		if gi2.err != nil {
			t.Fatalf("second interactive waiter: %v", gi2.err)
		}
		tr.release(gi2.l, false)
		if g := <-b2; g.err != nil {
			t.Fatalf("second batch waiter: %v", g.err)
		}
	})
}

// An interactive request that finds every slot held takes the slot of
// the youngest batch request at once (that request's context is
// cancelled with ErrPreempted); the preempted lease's release hands back
// nothing more; an interactive request never preempts another.
func TestRouterPreemptsYoungestBatch(t *testing.T) {
	a, b := Candidate{Key: WorkerKey{"p", "a"}, URI: "http://a"}, Candidate{Key: WorkerKey{"p", "b"}, URI: "http://b"}
	synctest.Test(t, func(t *testing.T) {
		tr := newTestRouter(Config{QueueSize: 4, QueueTimeout: 10 * time.Second}, a, b)
		ctx := t.Context()
		batch := func() (lease, context.Context) {
			bctx, cancel := context.WithCancelCause(ctx)
			t.Cleanup(func() { cancel(nil) })
			l, err := tr.acquire(bctx, routeReq{model: "m", batch: true, preempt: cancel})
			if err != nil {
				t.Fatal(err)
			}
			time.Sleep(time.Second) // the next one is younger
			return l, bctx
		}
		older, olderCtx := batch()
		younger, youngerCtx := batch()
		if older.cand.Key != a.Key || younger.cand.Key != b.Key {
			t.Fatalf("batch leases on %s and %s", older.cand.Key, younger.cand.Key)
		}

		i1, err := tr.acquire(ctx, routeReq{model: "m"})
		if err != nil || i1.cand.Key != b.Key {
			t.Fatalf("interactive: %+v %v, want b's slot at once", i1, err)
		}
		if context.Cause(youngerCtx) != ErrPreempted || olderCtx.Err() != nil {
			t.Fatalf("younger: %v, older: %v; want only the younger preempted", context.Cause(youngerCtx), olderCtx.Err())
		}
		tr.settle(younger, verdictNone, nil) // its Serve ends
		if got := tr.inFlight(); got[b.Key] != 1 {
			t.Fatalf("in flight on b after the preempted lease's release: %d, want 1 (the interactive request)", got[b.Key])
		}
		if n := tr.counter("apiary_queen_batch_preemptions_total", "m"); n != 1 {
			t.Fatalf("preemptions %v, want 1", n)
		}

		i2, err := tr.acquire(ctx, routeReq{model: "m"})
		if err != nil || i2.cand.Key != a.Key || context.Cause(olderCtx) != ErrPreempted {
			t.Fatalf("second interactive: %+v %v (older batch: %v)", i2, err, context.Cause(olderCtx))
		}
		// Every slot is interactive now: the next one waits.
		i3 := tr.acquireAsync(ctx, routeReq{model: "m"})
		synctest.Wait()
		tr.settle(older, verdictNone, nil)
		synctest.Wait()
		select {
		case g := <-i3:
			t.Fatalf("an interactive request got a slot held by another: %+v", g)
		default:
		}
		if n := tr.counter("apiary_queen_batch_preemptions_total", "m"); n != 2 {
			t.Fatalf("preemptions %v, want 2", n)
		}
		tr.release(i1, false)
		g := <-i3
		if g.err != nil || g.l.cand.Key != b.Key {
			t.Fatalf("third interactive: %+v", g)
		}
		tr.release(i2, false)
		tr.release(g.l, false)
		if got := tr.inFlight(); len(got) != 0 {
			t.Fatalf("in flight at the end: %v", got)
		}
	})
}

// counters is inflight as pick reads it: one counter per candidate.
func counters(cands []Candidate, inflight map[WorkerKey]int) []*int {
	out := make([]*int, len(cands))
	for i, c := range cands {
		n := inflight[c.Key]
		out[i] = &n
	}
	return out
}

// BenchmarkPick is the routing decision among 1,000 workers of a model
// (a thousand pools serving it), idle and with requests in flight on
// every one of them.
func BenchmarkPick(b *testing.B) {
	cands := make([]Candidate, 1000)
	busy := make(map[WorkerKey]int, len(cands))
	for i := range cands {
		cands[i] = Candidate{Key: WorkerKey{Pool: fmt.Sprintf("pool-%05d", i), Worker: "w-1"}}
		busy[cands[i].Key] = 1 + i%7
	}
	for _, tc := range []struct {
		name     string
		inflight map[WorkerKey]int
	}{{"idle", map[WorkerKey]int{}}, {"busy", busy}} {
		b.Run(tc.name, func(b *testing.B) {
			cs := counters(cands, tc.inflight)
			for b.Loop() {
				if pick(cands, cs, 64, nil, nil).index < 0 {
					b.Fatal("no worker picked")
				}
			}
		})
	}
}

// TestRouterCountsOnSharedLists: the control plane hands out one
// candidate slice until its workers change, and the router keeps that
// slice's counters; requests in flight stay counted when the list is
// replaced, and the counters of workers that left are dropped.
func TestRouterCountsOnSharedLists(t *testing.T) { synctest.Test(t, testRouterCountsOnSharedLists) }

func testRouterCountsOnSharedLists(t *testing.T) {
	a, b, c := Candidate{Key: WorkerKey{"p1", "a"}}, Candidate{Key: WorkerKey{"p2", "b"}}, Candidate{Key: WorkerKey{"p3", "c"}}
	var mu sync.Mutex
	shared := []Candidate{a, b, c}
	cfg := Config{WorkerSlots: 2, QueueTimeout: time.Minute}.WithDefaults()
	r := newRouter(cfg, slog.New(slog.DiscardHandler), func(target) []Candidate {
		mu.Lock()
		defer mu.Unlock()
		return shared
	}, newAffinity(cfg.AffinityTTL, 10), newRouteMetrics(prometheus.NewRegistry(), func() int { return 0 }), func() {})
	ctx := context.Background()
	got := map[WorkerKey]int{}
	var leases []lease
	for range 6 {
		l, err := r.acquire(ctx, routeReq{model: "m"})
		if err != nil {
			t.Fatal(err)
		}
		got[l.cand.Key]++
		leases = append(leases, l)
	}
	if want := map[WorkerKey]int{a.Key: 2, b.Key: 2, c.Key: 2}; !cmp.Equal(got, want) {
		t.Fatalf("6 requests over 3 workers of 2 slots went %v, want %v", got, want)
	}
	// c leaves: a new slice. a and b are still full.
	mu.Lock()
	shared = []Candidate{a, b}
	mu.Unlock()
	waiting := make(chan grant, 1)
	go func() {
		l, err := r.acquire(ctx, routeReq{model: "m"})
		waiting <- grant{l, err}
	}()
	synctest.Wait()
	if stats := r.queueStats(); len(stats) != 1 || stats[0].queued != 1 {
		t.Fatalf("queue %+v, want the request waiting: a and b are full", stats)
	}
	for _, l := range leases {
		if l.cand.Key == a.Key {
			r.release(l, false)
			break
		}
	}
	if g := <-waiting; g.err != nil || g.l.cand.Key != a.Key {
		t.Fatalf("after a slot of a was freed: %+v, %v; want a lease on a", g.l.cand.Key, g.err)
	}
	if n := r.inFlight(); !cmp.Equal(n, map[WorkerKey]int{a.Key: 2, b.Key: 2, c.Key: 2}) {
		t.Errorf("in flight %v", n)
	}

	// Workers come and go: the idle counters of those gone are dropped.
	for i := range 3000 {
		mu.Lock()
		shared = []Candidate{a, b, {Key: WorkerKey{"churn", strconv.Itoa(i)}}}
		mu.Unlock()
		r.mu.Lock()
		r.countersLocked(target{model: "m"}, shared)
		r.mu.Unlock()
	}
	r.mu.Lock()
	kept := len(r.inflight)
	r.mu.Unlock()
	if kept > 2*3+1024+1 {
		t.Errorf("%d counters kept for 3 live workers", kept)
	}
}

// BenchmarkRouterAcquire is one request's lease and release among 1,000
// workers of a model, each with a request of its own in flight.
func BenchmarkRouterAcquire(b *testing.B) {
	b.Run("same list", func(b *testing.B) { benchRouterAcquire(b, false) })
	b.Run("new list", func(b *testing.B) { benchRouterAcquire(b, true) })
}

func benchRouterAcquire(b *testing.B, fresh bool) {
	cands := make([]Candidate, 1000)
	for i := range cands {
		cands[i] = Candidate{Key: WorkerKey{Pool: fmt.Sprintf("pool-%05d", i), Worker: "w-1"}}
	}
	cfg := Config{WorkerSlots: 64}.WithDefaults()
	r := newRouter(cfg, slog.New(slog.DiscardHandler), func(target) []Candidate {
		if fresh {
			return slices.Clone(cands)
		}
		return cands
	},
		newAffinity(cfg.AffinityTTL, 10), newRouteMetrics(prometheus.NewRegistry(), func() int { return 0 }), func() {})
	ctx := context.Background()
	for range cands {
		if _, err := r.acquire(ctx, routeReq{model: "m"}); err != nil {
			b.Fatal(err)
		}
	}
	for b.Loop() {
		l, err := r.acquire(ctx, routeReq{model: "m"})
		if err != nil {
			b.Fatal(err)
		}
		r.release(l, false)
	}
}
