package routing

import (
	"errors"
	"testing"
	"testing/synctest"
	"time"
)

func TestDecideStrike(t *testing.T) {
	const limit = 3
	for _, tc := range []struct {
		name     string
		st       strikeState
		ev       strikeEvent
		want     strikeState
		wantStep strikeStep
	}{
		{name: "a first failure counts", ev: strikeFailed, want: strikeState{Count: 1}},
		{name: "below the limit nothing happens", st: strikeState{Count: 1}, ev: strikeFailed, want: strikeState{Count: 2}},
		{name: "the limit degrades, audited", st: strikeState{Count: 2}, ev: strikeFailed,
			want: strikeState{Count: 3, Degraded: true}, wantStep: stepDegrade},
		{name: "a degraded worker's failure (a request in flight) keeps it degraded", st: strikeState{Count: 3, Degraded: true}, ev: strikeFailed,
			want: strikeState{Count: 4, Degraded: true}},
		{name: "a readmitted worker's failure degrades it again, not audited again", st: strikeState{Count: 3}, ev: strikeFailed,
			want: strikeState{Count: 4, Degraded: true}, wantStep: stepRedegrade},
		{name: "3 × limit stops", st: strikeState{Count: 8}, ev: strikeFailed,
			want: strikeState{Count: 9, Degraded: true}, wantStep: stepStop},
		{name: "3 × limit while degraded stops", st: strikeState{Count: 8, Degraded: true}, ev: strikeFailed,
			want: strikeState{Count: 9, Degraded: true}, wantStep: stepStop},
		{name: "past 3 × limit asks again (a stop that did not take)", st: strikeState{Count: 9}, ev: strikeFailed,
			want: strikeState{Count: 10, Degraded: true}, wantStep: stepStop},
		{name: "a success clears", st: strikeState{Count: 2}, ev: strikeServed, wantStep: stepCleared},
		{name: "a success of a degraded worker recovers it, audited", st: strikeState{Count: 5, Degraded: true}, ev: strikeServed, wantStep: stepRecovered},
		{name: "a success of a readmitted worker recovers it", st: strikeState{Count: 4}, ev: strikeServed, wantStep: stepRecovered},
		{name: "a success without strikes is nothing", ev: strikeServed},
		{name: "a health check readmits, the count kept", st: strikeState{Count: 3, Degraded: true}, ev: strikeHealthy,
			want: strikeState{Count: 3}, wantStep: stepReadmit},
		{name: "a health check of a worker not degraded is nothing", st: strikeState{Count: 2}, ev: strikeHealthy,
			want: strikeState{Count: 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, step := decideStrike(tc.st, tc.ev, limit)
			if got != tc.want || step != tc.wantStep {
				t.Errorf("decideStrike(%+v, %d) = %+v, %d; want %+v, %d", tc.st, tc.ev, got, step, tc.want, tc.wantStep)
			}
		})
	}
	// With a limit of 1 the first failure degrades.
	if got, step := decideStrike(strikeState{}, strikeFailed, 1); got != (strikeState{Count: 1, Degraded: true}) || step != stepDegrade {
		t.Errorf("limit 1: %+v %d", got, step)
	}
}

// A worker that fails StrikeLimit requests in a row gets no new ones; a
// health check that answers readmits it; a request it serves clears its
// strikes; a client error or a 503 is no strike; its entry and metric
// series go with its row.
func TestRouterStrikes(t *testing.T) {
	a := Candidate{Key: WorkerKey{"p", "a"}, LifecycleID: "wk-a", URI: "http://a"}
	b := Candidate{Key: WorkerKey{"p", "b"}, LifecycleID: "wk-b", URI: "http://b"}
	fail := errors.New("worker answered 500")
	synctest.Test(t, func(t *testing.T) {
		tr := newTestRouter(Config{StrikeLimit: 2, QueueTimeout: time.Minute}, a, b)
		ctx := t.Context()
		// acquire takes a (the smaller key, both idle) and settles it.
		attempt := func(v verdict) (WorkerKey, strikeStep) {
			t.Helper()
			l, err := tr.acquire(ctx, routeReq{model: "m"})
			if err != nil {
				t.Fatal(err)
			}
			return l.cand.Key, tr.settle(l, v, fail)
		}
		if k, step := attempt(verdictFailed); k != a.Key || step != stepNone {
			t.Fatalf("first failure: %v %d", k, step)
		}
		// Neither a client error nor a 503 (verdictNone) counts.
		if _, step := attempt(verdictNone); step != stepNone || tr.strikes["wk-a"].state.Count != 1 {
			t.Fatalf("no verdict: %d, strikes %+v", step, tr.strikes["wk-a"].state)
		}
		if k, step := attempt(verdictBroken); k != a.Key || step != stepDegrade {
			t.Fatalf("second failure: %v %d, want the degrade", k, step)
		}
		if got := tr.degradedGauge(); got != 1 {
			t.Errorf("degraded gauge %v", got)
		}
		if got := tr.counter("apiary_queen_worker_strikes_total", "wk-a"); got != 2 {
			t.Errorf("strikes of wk-a: %v", got)
		}
		// Degraded: every request goes to b, even while b is busy.
		time.Sleep(brokenFor) // the broken connection's own exclusion ends
		lb, err := tr.acquire(ctx, routeReq{model: "m"})
		if err != nil || lb.cand.Key != b.Key {
			t.Fatalf("while a is degraded: %+v %v", lb, err)
		}
		w := tr.acquireAsync(ctx, routeReq{model: "m"})
		synctest.Wait()
		select {
		case g := <-w:
			t.Fatalf("a degraded worker got a request: %+v", g)
		default:
		}
		// Its health check answers: readmitted, and the waiter gets it.
		tr.mu.Lock()
		step := tr.strikeLocked(a, strikeHealthy, nil, time.Now())
		tr.mu.Unlock()
		tr.poke()
		g := <-w
		if step != stepReadmit || g.err != nil || g.l.cand.Key != a.Key {
			t.Fatalf("readmitted: step %d, waiter %+v", step, g)
		}
		if got := tr.degradedGauge(); got != 0 {
			t.Errorf("degraded gauge after the readmission %v", got)
		}
		// Its next failure degrades it again (not audited again).
		if step := tr.settle(g.l, verdictFailed, fail); step != stepRedegrade {
			t.Fatalf("failure after the readmission: %d", step)
		}
		tr.release(lb, false)
		// A request in flight that it serves clears its strikes.
		tr.mu.Lock()
		tr.strikeLocked(a, strikeHealthy, nil, time.Now())
		tr.mu.Unlock()
		if k, step := attempt(verdictServed); k != a.Key || step != stepRecovered {
			t.Fatalf("served: %v %d", k, step)
		}
		if e := tr.strikes["wk-a"]; e.state != (strikeState{}) || len(e.errs) != 0 {
			t.Errorf("after the success: %+v", e)
		}
		if _, step := attempt(verdictFailed); step != stepNone {
			t.Errorf("a failure after the success: %d, want a fresh count", step)
		}

		// 3 × limit failures in a row: the stop, with why.
		for range 5 {
			tr.mu.Lock()
			step = tr.strikeLocked(a, strikeFailed, fail, time.Now())
			tr.mu.Unlock()
		}
		if e := tr.strikes["wk-a"]; step != stepStop || e.state.Count != 6 ||
			e.stop != "stopped by the queen: 6 failures in a row (3 × --strike-limit 2); last: worker answered 500" {
			t.Errorf("at 3 × limit: step %d, %+v", step, e)
		}
		work, _ := tr.takeStrikeWork(time.Now())
		stops := 0
		for _, w := range work {
			if w.stop != "" {
				stops++
			}
		}
		if stops != 1 || tr.strikes["wk-a"].stop != "" {
			t.Errorf("the stop is taken once: %d", stops)
		}
		// The row ends: the entry and its series go.
		tr.mu.Lock()
		tr.removeStrikesLocked("wk-a")
		tr.mu.Unlock()
		if len(tr.strikes) != 0 || tr.metric("apiary_queen_worker_strikes_total", "wk-a") != nil {
			t.Errorf("after the row ended: %d entries, series %v", len(tr.strikes), tr.metric("apiary_queen_worker_strikes_total", "wk-a"))
		}
		if got := tr.degradedGauge(); got != 0 {
			t.Errorf("degraded gauge after the row ended %v", got)
		}
	})
}

// degradedGauge reads apiary_queen_workers_degraded.
func (tr *testRouter) degradedGauge() float64 {
	families, err := tr.reg.Gather()
	if err != nil {
		panic(err)
	}
	for _, f := range families {
		if f.GetName() == "apiary_queen_workers_degraded" {
			return f.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return -1
}
