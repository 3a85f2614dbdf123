package store_test

import (
	"context"
	"database/sql"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/store"
)

// Regression: the one-queen lock was a session advisory lock on a pooled
// connection that nobody re-checked, so a dropped connection let a second
// queen in unnoticed. Now the store finds the loss within its check
// interval, closes LockLost, refuses to write, and a second store takes
// the lock.
func TestPostgresLockLossIsDetectedAndAnotherStoreTakesOver(t *testing.T) {
	const every = 300 * time.Millisecond
	u := newPG(t)
	db := admin(t, u)
	a := open(t, store.Config{URL: u, LeaseDuration: 3 * every, LeaseRenew: every})
	if _, err := store.Open(t.Context(), store.Config{URL: u}); !errors.Is(err, store.ErrLocked) {
		t.Fatalf("second open while the lock is held: got %v, want ErrLocked", err)
	}
	if _, err := appendEntry(t.Context(), a, "before"); err != nil {
		t.Fatal(err)
	}

	terminate(t, db, lockHolder(t, db))
	killed := time.Now()
	select {
	case <-a.LockLost():
	case <-time.After(waitLimit):
		t.Fatalf("lock loss not noticed within %s", waitLimit)
	}
	if took := time.Since(killed); took > every+2*time.Second {
		t.Errorf("lock loss noticed after %s; the renew interval is %s", took, every)
	}
	if err := a.LockErr(); !errors.Is(err, store.ErrLockLost) {
		t.Errorf("LockErr = %v, want ErrLockLost", err)
	}
	mustContain(t, a.LockErr(), "backend pid")
	if _, err := appendEntry(t.Context(), a, "after the loss"); !errors.Is(err, store.ErrLockLost) {
		t.Errorf("write after the loss: got %v, want ErrLockLost", err)
	}

	// The lock is free and the lease released: a second queen starts.
	b := open(t, store.Config{URL: u})
	select {
	case <-b.LockLost():
		t.Fatalf("the new owner's lock is lost: %v", b.LockErr())
	default:
	}
	if _, err := appendEntry(t.Context(), b, "new owner"); err != nil {
		t.Errorf("the new owner cannot write: %v", err)
	}
	if err := a.Close(); err != nil {
		t.Logf("close of the store that lost its lock: %v", err)
	}
}

// The lock fences writes: a queen whose lock session ended, and that has
// not noticed (it renews nothing and misjudges its own deadline here),
// cannot write one more row once another queen took the lease, even on
// its pooled connections that stayed open: every write transaction
// proves the fencing epoch the lease gave, and the second queen raised
// it.
func TestPostgresLostLockFencesWritesAtOnce(t *testing.T) {
	u := newPG(t)
	db := admin(t, u)
	a := open(t, shortLease(u))
	if _, err := appendEntry(t.Context(), a, "before"); err != nil {
		t.Fatal(err)
	}
	a.BlindToLease()
	terminate(t, db, lockHolder(t, db))
	b := takeOver(t, u)
	if _, err := appendEntry(t.Context(), a, "from the old queen"); !errors.Is(err, store.ErrLockLost) {
		t.Fatalf("a write of the queen that lost the lock: got %v, want ErrLockLost", err)
	}
	select {
	case <-a.LockLost():
	default:
		t.Error("the fenced store did not mark its lock lost")
	}
	mustContain(t, a.LockErr(), "another queen took the database")
	if _, err := appendEntry(t.Context(), b, "from the new queen"); err != nil {
		t.Errorf("the new owner cannot write: %v", err)
	}
	var n int
	if err := db.QueryRowContext(t.Context(), "SELECT count(*) FROM audit_log WHERE target = 'from the old queen'").Scan(&n); err != nil || n != 0 {
		t.Errorf("rows of the fenced queen in the table: %d, %v", n, err)
	}
}

// Audit ids come from the database: two stores on one database never hand
// out the same id (one that has not yet noticed it lost the lock writes
// nothing at all).
func TestPostgresAuditIDsUniqueAcrossStores(t *testing.T) {
	u := newPG(t)
	db := admin(t, u)
	a := open(t, shortLease(u))
	a.BlindToLease() // never notices in this test
	ids := map[int64]string{}
	add := func(s *store.Store, who string) {
		t.Helper()
		e, err := appendEntry(t.Context(), s, who)
		if err != nil {
			t.Fatal(err)
		}
		if prev, dup := ids[e.ID]; dup {
			t.Errorf("audit id %d given to %s and to %s", e.ID, prev, who)
		}
		ids[e.ID] = who
	}
	add(a, "a")
	add(a, "a")
	terminate(t, db, lockHolder(t, db))
	b := takeOver(t, u)
	add(b, "b")
	// The store that has not noticed is fenced (TestPostgresLostLockFencesWritesAtOnce).
	if _, err := appendEntry(t.Context(), a, "a, not yet aware"); !errors.Is(err, store.ErrLockLost) {
		t.Errorf("a write of the store that lost the lock: %v, want ErrLockLost", err)
	}
	add(b, "b")
	if len(ids) != 4 {
		t.Errorf("ids %v, want 4 distinct", ids)
	}
}

// Ids are never reused by a later store on the same database, not even
// when every entry was pruned (the seed derived the next id from the
// largest one left).
func TestAuditIDsNotReusedAfterPruneAndReopen(t *testing.T) {
	eachBackend(t, func(t *testing.T, cfg store.Config) {
		ctx := t.Context()
		s, err := store.Open(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		var last int64
		for range 3 {
			e, err := appendEntry(ctx, s, "first")
			if err != nil {
				t.Fatal(err)
			}
			last = e.ID
		}
		if p, err := s.Prune(ctx, time.Now().Add(time.Hour), time.Time{}); err != nil || p.Audit != 3 {
			t.Fatalf("prune everything: %+v %v", p, err)
		}
		s.Close()
		s = open(t, cfg)
		e, err := appendEntry(ctx, s, "second")
		if err != nil {
			t.Fatal(err)
		}
		if e.ID <= last {
			t.Errorf("id after prune and reopen = %d, want more than %d", e.ID, last)
		}
	})
}

// SQLite's guard is a file lock that lasts as long as the process: it is
// never reported lost.
func TestSQLiteLockIsNeverLost(t *testing.T) {
	s := open(t, store.Config{Path: filepath.Join(t.TempDir(), store.SQLiteFile), LeaseRenew: time.Millisecond})
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	select {
	case <-s.LockLost():
		t.Fatalf("SQLite lock reported lost: %v", s.LockErr())
	case <-ctx.Done():
	}
	if err := s.LockErr(); err != nil {
		t.Errorf("LockErr = %v", err)
	}
}

// A database of schema version 1 (audit ids handed out by the queen)
// keeps its entries when it is upgraded, and the database's ids continue
// after the largest.
func TestUpgradeKeepsAuditIDsAndContinuesAfterThem(t *testing.T) {
	eachBackend(t, func(t *testing.T, cfg store.Config) {
		driver, dsn := "pgx", cfg.URL
		if cfg.URL == "" {
			driver, dsn = "sqlite", cfg.Path
		}
		db, err := sql.Open(driver, dsn)
		if err != nil {
			t.Fatal(err)
		}
		v1, err := os.ReadFile("migrations/0001_init.sql")
		if err != nil {
			t.Fatal(err)
		}
		stmts := append(strings.Split(string(v1), ";\n"),
			"CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at BIGINT NOT NULL)",
			"INSERT INTO schema_migrations VALUES (1, 'init', 0)",
			"INSERT INTO audit_log (id, ts, actor, action, target) VALUES (41, 1, 'queen', 'old', 'x'), (42, 2, 'queen', 'old', 'y')")
		for _, st := range stmts {
			if strings.TrimSpace(st) == "" {
				continue
			}
			if _, err := db.ExecContext(t.Context(), st); err != nil {
				t.Fatalf("%v in %q", err, st)
			}
		}
		db.Close()

		s := open(t, cfg)
		e, err := appendEntry(t.Context(), s, "z")
		if err != nil {
			t.Fatal(err)
		}
		if e.ID != 43 {
			t.Errorf("first id after the upgrade = %d, want 43", e.ID)
		}
		_, audit := left(t, s)
		if diff := cmp.Diff([]string{"z", "y", "x"}, audit); diff != "" {
			t.Errorf("audit after the upgrade (-want +got):\n%s", diff)
		}
	})
}

// A database that goes away (its connections cut, new ones refused) while
// the queen holds the lock: a write fails as ErrUnavailable, which the
// daemons answer 503 with Retry-After, not 500; when the database takes
// connections again, writes succeed.
func TestPostgresOutageIsAnsweredAsUnavailable(t *testing.T) {
	u := newPG(t)
	db := admin(t, u)
	s := open(t, store.Config{URL: u})
	if _, err := appendEntry(t.Context(), s, "before"); err != nil {
		t.Fatal(err)
	}
	lock := lockHolder(t, db)
	var name string
	if err := db.QueryRowContext(t.Context(), "SELECT current_database()").Scan(&name); err != nil {
		t.Fatal(err)
	}
	// From the cluster's postgres database: a database's own connections
	// cannot refuse connections to it.
	pu, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	pu.Path = "/postgres"
	other := admin(t, pu.String())
	if _, err := other.ExecContext(t.Context(), `ALTER DATABASE "`+name+`" WITH ALLOW_CONNECTIONS false`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(t.Context(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid() AND pid <> $1`, lock); err != nil {
		t.Fatal(err)
	}
	_, err = appendEntry(t.Context(), s, "during the outage")
	if !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("a write during the outage: %v, want ErrUnavailable", err)
	}
	rec := httptest.NewRecorder()
	api.Fail(rec, err, "queen")
	if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") == "" || !strings.Contains(rec.Body.String(), "database_unavailable") {
		t.Errorf("answered %d, Retry-After %q: %s", rec.Code, rec.Header().Get("Retry-After"), rec.Body.String())
	}
	if _, err := other.ExecContext(t.Context(), `ALTER DATABASE "`+name+`" WITH ALLOW_CONNECTIONS true`); err != nil {
		t.Fatal(err)
	}
	if _, err := appendEntry(t.Context(), s, "after the outage"); err != nil {
		t.Errorf("a write after the outage: %v", err)
	}
}

// shortLease is a store of u whose lease lapses 900 ms after its last
// renewal: a standby takes it soon after the holder stops renewing.
func shortLease(u string) store.Config {
	return store.Config{URL: u, LeaseDuration: 900 * time.Millisecond, LeaseRenew: 300 * time.Millisecond}
}

// takeOver opens a store of u as a standby does, trying until the lease
// is free (released, or lapsed): the second queen.
func takeOver(t *testing.T, u string) *store.Store {
	t.Helper()
	for deadline := time.Now().Add(waitLimit); ; time.Sleep(20 * time.Millisecond) {
		s, err := store.Open(t.Context(), store.Config{URL: u})
		if err == nil {
			t.Cleanup(func() { s.Close() })
			return s
		}
		if !errors.Is(err, store.ErrLocked) || time.Now().After(deadline) {
			t.Fatalf("the second store cannot take the lease: %v", err)
		}
	}
}
