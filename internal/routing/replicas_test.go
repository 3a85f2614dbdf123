package routing

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestDecideReplicas(t *testing.T) {
	now := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name string
		in   replicaNeed
		want replicaDecision
	}{
		{name: "none live: place one with no request",
			in:   replicaNeed{Model: "m", Min: 1},
			want: replicaDecision{Place: []placeOrder{{Model: "m", Kind: "replica", Reason: "replicas: 0 of min_workers 1 of m live"}}}},
		{name: "enough live", in: replicaNeed{Model: "m", Min: 2, Live: 2}},
		{name: "more live than min (demand placed them)", in: replicaNeed{Model: "m", Min: 1, Live: 3}},
		{name: "one placement at a time", in: replicaNeed{Model: "m", Min: 3, Live: 1, Starting: 1}},
		{name: "no pool can take it: nothing, a pool that registers wakes the controller",
			in: replicaNeed{Model: "m", Min: 1, NoPlace: "no pool can run m (a: does not have model m)"}},
		{name: "backoff after a failure", in: replicaNeed{Model: "m", Min: 1, RetryAt: now.Add(4 * time.Second)},
			want: replicaDecision{Recheck: 4 * time.Second}},
		{name: "the backoff passed", in: replicaNeed{Model: "m", Min: 2, Live: 1, RetryAt: now},
			want: replicaDecision{Place: []placeOrder{{Model: "m", Kind: "replica", Reason: "replicas: 1 of min_workers 2 of m live"}}}},
		{name: "crash loop: placed at the slow pace, and says so", in: replicaNeed{Model: "m", Min: 1, CrashLoop: true, RetryAt: now.Add(-time.Second)},
			want: replicaDecision{Place: []placeOrder{{Model: "m", Kind: "replica",
				Reason: "replicas: 0 of min_workers 1 of m live; the model is in a crash loop (replaced at the slow pace)"}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, decideReplicas(now, []replicaNeed{tc.in})); diff != "" {
				t.Errorf("decideReplicas (-want +got):\n%s", diff)
			}
		})
	}
	// Several models: the soonest recheck wins, each model is decided.
	got := decideReplicas(now, []replicaNeed{{Model: "a", Min: 1, RetryAt: now.Add(9 * time.Second)},
		{Model: "b", Min: 1, RetryAt: now.Add(3 * time.Second)}, {Model: "c", Min: 1}})
	if len(got.Place) != 1 || got.Place[0].Model != "c" || got.Recheck != 3*time.Second {
		t.Errorf("three models: %+v", got)
	}
}

// The replacement backoff grows 1s, 2s, 4s … 30s; the Failures-th
// failure within the window starts a crash loop (once), whose retries
// wait the slow Backoff; failures further apart than the window never
// make one; a worker that served ends it all.
func TestReplicaFailuresAndCrashLoop(t *testing.T) {
	pol := crashLoopPolicy{Failures: 3, Window: time.Minute, Backoff: 10 * time.Minute}
	t0 := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	exit := 1
	type step struct {
		after       time.Duration // since t0
		wantStarted bool
		wantRetry   time.Duration // after the failure
		wantLoop    bool
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{name: "three quick failures make a crash loop",
			steps: []step{{0, false, time.Second, false}, {time.Second, false, 2 * time.Second, false},
				{3 * time.Second, true, 10 * time.Minute, true}, {11 * time.Minute, false, 10 * time.Minute, true}}},
		{name: "failures spread wider than the window do not",
			steps: []step{{0, false, time.Second, false}, {40 * time.Second, false, 2 * time.Second, false},
				{90 * time.Second, false, 4 * time.Second, false}, {140 * time.Second, false, 8 * time.Second, false}}},
		{name: "the backoff is capped at 30s",
			steps: []step{{0, false, time.Second, false}, {2 * time.Minute, false, 2 * time.Second, false}, {4 * time.Minute, false, 4 * time.Second, false},
				{6 * time.Minute, false, 8 * time.Second, false}, {8 * time.Minute, false, 16 * time.Second, false},
				{10 * time.Minute, false, 30 * time.Second, false}, {12 * time.Minute, false, 30 * time.Second, false}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var rs replicaState
			for i, s := range tc.steps {
				at := t0.Add(s.after)
				started := rs.failed(failure{At: at, LifecycleID: "wk-1", Reason: "exit status 1", ExitCode: &exit}, pol)
				if started != s.wantStarted || rs.retry.Sub(at) != s.wantRetry || (rs.loop != nil) != s.wantLoop {
					t.Fatalf("failure %d: started %v, retry in %s, loop %+v; want %v, %s, %v", i, started, rs.retry.Sub(at), rs.loop, s.wantStarted, s.wantRetry, s.wantLoop)
				}
				if len(rs.recent) > pol.Failures {
					t.Fatalf("failure %d: %d recent failures kept, at most %d", i, len(rs.recent), pol.Failures)
				}
			}
		})
	}
	var rs replicaState
	for i := range 3 {
		rs.failed(failure{At: t0.Add(time.Duration(i) * time.Second), Reason: "boom", ExitCode: &exit}, pol)
	}
	want := CrashLoop{Since: t0.Add(2 * time.Second), Failures: 3, LastFailure: "boom", LastExit: &exit, NextTry: t0.Add(2*time.Second + pol.Backoff)}
	if diff := cmp.Diff(&want, rs.loop); diff != "" {
		t.Errorf("crash loop (-want +got):\n%s", diff)
	}
	if ended := rs.stable(); ended == nil || rs.loop != nil || rs.tries != 0 || len(rs.recent) != 0 || !rs.retry.IsZero() {
		t.Errorf("after a worker served: ended %v, state %+v", ended, rs)
	}
	if started := rs.failed(failure{At: t0.Add(time.Hour)}, pol); started || rs.retry.Sub(t0.Add(time.Hour)) != time.Second {
		t.Errorf("first failure after the loop ended: started %v, retry in %s, want a fresh 1s backoff", started, rs.retry.Sub(t0.Add(time.Hour)))
	}
}

func TestMaxWorkersWithReplicas(t *testing.T) {
	c := Config{MaxWorkers: 1, ModelMaxWorkers: map[string]int{"pinned": 0, "two": 2}}
	three := 3
	for _, tc := range []struct {
		model string
		r     Replica
		want  int
	}{
		{"m", Replica{}, 1},
		{"two", Replica{}, 2},
		{"pinned", Replica{}, 0},
		{"m", Replica{Max: &three}, 3},
		{"two", Replica{Min: 1, Max: &three}, 3},
		{"m", Replica{Min: 2}, 2},      // min above the queen's max raises it
		{"pinned", Replica{Min: 1}, 1}, // a model never placed on demand is kept at its min
	} {
		if got := c.maxWorkers(tc.model, tc.r); got != tc.want {
			t.Errorf("maxWorkers(%s, %+v) = %d, want %d", tc.model, tc.r, got, tc.want)
		}
	}
}
