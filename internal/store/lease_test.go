package store_test

import (
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/store"
)

// Regression (issue 40): a queen cut off from PostgreSQL by a network
// that passes nothing kept its session, and with it the advisory lock,
// until TCP keepalive gave up (hours): no standby took over. Now the
// holder stops acting when it cannot renew its lease in time, the lease
// lapses on the database's clock, and a standby ends the lingering
// sessions and takes the database; the old holder's renewal is refused
// once the network is back.
func TestPostgresPartitionedHolderLosesTheLease(t *testing.T) {
	u := newPG(t)
	db := admin(t, u)
	relay, ru := newRelay(t, u)
	cfg := shortLease(ru)
	a := open(t, cfg)
	if _, err := appendEntry(t.Context(), a, "before"); err != nil {
		t.Fatal(err)
	}
	relay.Freeze()
	cut := time.Now()
	select {
	case <-a.LockLost():
	case <-time.After(waitLimit):
		relay.Thaw()
		t.Fatalf("the partitioned holder did not stop acting within %s", waitLimit)
	}
	stopped := time.Since(cut)
	// It stops on its own clock, before the lease's 900 ms could lapse
	// after the last renewal: at most the renew deadline (675 ms) after
	// the cut, with room for a loaded machine.
	if stopped > cfg.LeaseDuration+2*time.Second {
		t.Errorf("the holder stopped acting %s after the cut; its renew deadline is 3/4 of %s", stopped, cfg.LeaseDuration)
	}
	mustContain(t, a.LockErr(), "no renewal of the lease succeeded within 675ms")
	if _, err := appendEntry(t.Context(), a, "while cut off"); !errors.Is(err, store.ErrLockLost) {
		t.Errorf("a write of the holder past its deadline: %v, want ErrLockLost", err)
	}
	if err := a.Fence(); !errors.Is(err, store.ErrLockLost) {
		t.Errorf("Fence past the deadline: %v, want ErrLockLost", err)
	}

	// Its sessions linger in the server (the relay keeps them open): the
	// standby ends them and takes the lease.
	before := sessions(t, db, a.LeaseSession())
	if before == 0 {
		t.Fatalf("no session of the cut-off holder (%s) in pg_stat_activity", a.LeaseSession())
	}
	b := takeOver(t, u)
	if n := sessions(t, db, a.LeaseSession()); n != 0 {
		t.Errorf("%d sessions of the cut-off holder left after the takeover (%d before)", n, before)
	}
	if b.Epoch() != a.Epoch()+1 {
		t.Errorf("epoch after the takeover %d, want %d", b.Epoch(), a.Epoch()+1)
	}
	relay.Thaw()
	if _, err := appendEntry(t.Context(), a, "after the partition"); !errors.Is(err, store.ErrLockLost) {
		t.Errorf("a write of the old holder once the network is back: %v, want ErrLockLost", err)
	}
	if _, err := appendEntry(t.Context(), b, "new holder"); err != nil {
		t.Errorf("the new holder cannot write: %v", err)
	}
}

// A lease that has not lapsed binds a standby even when the advisory
// lock is free (the holder's lock session ended, its process may still
// act until its deadline); a lapsed one is taken; a released one (a clean
// Close) is taken at once.
func TestPostgresLeaseIsTakenOnlyWhenLapsedOrReleased(t *testing.T) {
	u := newPG(t)
	db := admin(t, u)
	a := open(t, store.Config{URL: u, LeaseDuration: time.Hour, LeaseRenew: time.Minute})
	a.BlindToLease()
	terminate(t, db, lockHolder(t, db))
	_, err := store.Open(t.Context(), store.Config{URL: u})
	if !errors.Is(err, store.ErrLocked) {
		t.Fatalf("open while the lease runs: %v, want ErrLocked", err)
	}
	mustContain(t, err, "holds the lease for")
	if _, err := db.ExecContext(t.Context(), "UPDATE queen_lease SET expires_at = 0"); err != nil { // it lapses
		t.Fatal(err)
	}
	b := open(t, store.Config{URL: u})
	if _, err := appendEntry(t.Context(), a, "a"); !errors.Is(err, store.ErrLockLost) {
		t.Errorf("a write of the holder whose lease was taken: %v, want ErrLockLost", err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	var session string
	var expires int64
	if err := db.QueryRowContext(t.Context(), "SELECT session, expires_at FROM queen_lease").Scan(&session, &expires); err != nil || session != "" || expires != 0 {
		t.Errorf("lease after a clean close: session %q, expires_at %d, %v; want released", session, expires, err)
	}
	c := open(t, store.Config{URL: u, LeaseDuration: time.Hour, LeaseRenew: time.Minute}) // at once
	if c.Epoch() != b.Epoch()+1 {
		t.Errorf("epoch %d after %d", c.Epoch(), b.Epoch())
	}
}

// A holder whose lease was taken is refused its next renewal and stops:
// its deposition comes from the database too, not only from its own
// clock.
func TestPostgresRenewalRefusedAfterTakeover(t *testing.T) {
	u := newPG(t)
	db := admin(t, u)
	// A lease long enough that its renewals succeed on a loaded machine
	// (900 ms, whose renewals must land within 675 ms, once lapsed on
	// the holder's own clock first under make test's two runs).
	a := open(t, store.Config{URL: u, LeaseDuration: 3 * time.Second, LeaseRenew: time.Second})
	// Another queen takes the lease as though it had lapsed, without
	// ending a's session (as a takeover whose termination a's backend
	// outlived).
	if _, err := db.ExecContext(t.Context(), "UPDATE queen_lease SET epoch = epoch + 1, holder = 'other', session = 'other'"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-a.LockLost():
	case <-time.After(waitLimit):
		t.Fatalf("the holder whose lease was taken did not notice within %s", waitLimit)
	}
	mustContain(t, a.LockErr(), "the lease is no longer this queen's")
	if _, err := appendEntry(t.Context(), a, "after"); !errors.Is(err, store.ErrLockLost) {
		t.Errorf("a write after the takeover: %v, want ErrLockLost", err)
	}
}

// Lease settings the store refuses: a renew interval longer than a third
// of the lease leaves no room for a failed renewal.
func TestLeaseSettingsValidated(t *testing.T) {
	_, err := store.Open(t.Context(), store.Config{URL: newPG(t), LeaseDuration: 2 * time.Second, LeaseRenew: time.Second})
	if err == nil || !strings.Contains(err.Error(), "lease renew interval 1s must be at most a third of the lease duration 2s") {
		t.Errorf("open with renew 1s, lease 2s: %v", err)
	}
}

// sessions counts the server's sessions named name.
func sessions(t *testing.T, db *sql.DB, name string) int {
	t.Helper()
	var n int
	if err := db.QueryRowContext(t.Context(), "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", name).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
