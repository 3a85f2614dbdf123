package hive

import (
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/lifecycle"
)

// The first ownership rule (docs/ownership.md) from the hive's side: a hive that a
// queen (or a keeper) started must not outlive it; an operator's hive must
// not care.

func withOwner(owner string) hiveOpt { return func(c *Config) { c.Owner = owner } }

// awaitExit waits for the hive's Run to end by itself and returns its error.
func (th *testHive) awaitExit(t *testing.T, within time.Duration) error {
	t.Helper()
	select {
	case err := <-th.runErr:
		th.runErr <- err // for the cleanup
		return err
	case <-time.After(within):
		t.Fatalf("hive still running %s later; log:\n%s", within, th.logs.String())
		return nil
	}
}

// The parent's pipe on the hive's stdin (over SSH: the session) ends → the
// hive stops its workers gracefully and exits.
func TestLifeline_ParentGone_HiveStopsWorkersThenExits(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	th := startHive(t, withOwner(OwnerQueen), func(c *Config) { c.Lifeline = r })
	id := th.start()
	ready := th.rec.wait(t, id, lifecycle.Ready)
	w.Close() // the parent is gone
	if err := th.awaitExit(t, waitLimit); err != nil {
		t.Fatalf("hive Run: %v", err)
	}
	states := th.rec.states(id)
	if got := strings.Join(states, ","); got != "starting,ready,draining,stopped" {
		t.Errorf("worker went %s, want a graceful stop", got)
	}
	assertNoProcess(t, ready.Worker.PID)
	if !strings.Contains(th.logs.String(), "lifeline to the parent ended") {
		t.Errorf("no word of the lifeline in the log:\n%s", th.logs.String())
	}
}

// A hive the queen started and that no longer reaches the queen (it died
// behind a network that says nothing, or the node was cut off) stops its
// workers once its lease ends: within the lease timeout (the queen's
// --heartbeat-timeout) plus the one heartbeat interval by which its last
// answered beat may predate the silence.
func TestLease_QueenStopsAnswering_HiveStopsWorkersWithinTimeout(t *testing.T) {
	const lease, interval = 800 * time.Millisecond, 100 * time.Millisecond
	q := newFakeQueen(t, "tok")
	th := startHive(t, withQueen(q), withOwner(OwnerQueen), func(c *Config) { c.LeaseTimeout = lease; c.HeartbeatInterval = interval })
	id := th.startAuthed("tok")
	q.waitEvent(t, id, lifecycle.Ready)
	q.until(t, "heartbeats", func() bool { return len(q.heartbeats) > 2 })
	silent := time.Now()
	q.set(func() { q.down = true })
	if err := th.awaitExit(t, waitLimit); err != nil {
		t.Fatalf("hive Run: %v", err)
	}
	took := time.Since(silent)
	t.Logf("hive gone %s after the queen fell silent (lease %s)", took.Round(time.Millisecond), lease)
	if took < lease-interval {
		t.Errorf("hive stopped after %s, before its lease of %s could end", took, lease)
	}
	if took > lease+interval+2*time.Second {
		t.Errorf("hive stopped after %s, want about the lease of %s", took, lease)
	}
	if got := strings.Join(th.rec.states(id), ","); !strings.HasSuffix(got, "draining,stopped") {
		t.Errorf("worker went %s, want a graceful stop", got)
	}
	if !strings.Contains(th.logs.String(), "lease on the queen ended") {
		t.Errorf("no word of the lease in the log:\n%s", th.logs.String())
	}
}

// An operator's hive keeps serving while the queen is away, however long
// (TestQueenAwayThenBackReregisters shows it registering again); it may
// have neither lifeline nor lease.
func TestOperatorHive_HasNoLifelineOrLease(t *testing.T) {
	r, w, _ := os.Pipe()
	defer w.Close()
	defer r.Close()
	for _, cfg := range []Config{
		{Owner: OwnerOperator, Lifeline: r},
		{Owner: OwnerOperator, QueenURL: "http://127.0.0.1:1", LeaseTimeout: time.Minute},
		{Owner: "someone"},
		{Owner: OwnerQueen, LeaseTimeout: time.Minute}, // a lease needs a queen
	} {
		cfg.DataDir = t.TempDir()
		if _, err := New(cfg); err == nil {
			t.Errorf("New(%+v) accepted", cfg)
		}
	}
	// A queen that never answers: the hive's calls are counted.
	calls := make(chan struct{}, 100)
	away := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		select {
		case calls <- struct{}{}:
		default:
		}
		http.Error(w, "away", http.StatusServiceUnavailable)
	}))
	defer away.Close()
	th := startHive(t, func(c *Config) { c.QueenURL = away.URL; c.HeartbeatInterval = 20 * time.Millisecond })
	id := th.start()
	th.rec.wait(t, id, lifecycle.Ready)
	for range 10 { // ten registrations unanswered
		select {
		case <-calls:
		case <-time.After(waitLimit):
			t.Fatal("the hive stopped calling the queen")
		}
	}
	select {
	case <-th.Done():
		t.Fatal("an operator's hive stopped while the queen was away")
	default:
	}
	if w := th.worker(id); !lifecycle.State(w.Status).Serving() {
		t.Errorf("worker %s while the queen is away", w.Status)
	}
}
