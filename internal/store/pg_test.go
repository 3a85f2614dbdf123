package store_test

import (
	"context"
	"database/sql"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/store"
	"github.com/apiary-llm/apiary/internal/store/pgtest"
)

// waitLimit bounds every wait of these tests: reaching it is a failure.
const waitLimit = 20 * time.Second

// pgLockKey is the one-queen advisory lock ("apiary" in ASCII).
const pgLockKey = 0x617069617279

// newPG is a fresh PostgreSQL database of the test cluster.
func newPG(t *testing.T) string {
	t.Helper()
	u, err := pg.NewDatabase(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// admin is a plain connection pool to the database of u, beside the store.
func admin(t *testing.T, u string) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// lockHolder is the backend pid holding the one-queen lock of db's
// database.
func lockHolder(t *testing.T, db *sql.DB) int {
	t.Helper()
	var pid int
	err := db.QueryRowContext(t.Context(), `SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
		AND objsubid = 1 AND ((classid::int8 << 32) | objid::int8) = $1`, int64(pgLockKey)).Scan(&pid)
	if err != nil {
		t.Fatalf("find the backend holding the one-queen lock: %v", err)
	}
	return pid
}

func terminate(t *testing.T, db *sql.DB, pid int) {
	t.Helper()
	var ok bool
	if err := db.QueryRowContext(t.Context(), "SELECT pg_terminate_backend($1, 10000)", pid).Scan(&ok); err != nil || !ok {
		t.Fatalf("pg_terminate_backend(%d): %v %v", pid, ok, err)
	}
}

func appendEntry(ctx context.Context, s *store.Store, target string) (store.AuditEntry, error) {
	var e store.AuditEntry
	err := s.Update(ctx, func(tx *store.Tx) (err error) {
		e, err = tx.Append(store.AuditEntry{Actor: "queen", Action: "test", Target: target})
		return err
	})
	return e, err
}

// withParams adds query parameters to a database URL.
func withParams(t *testing.T, u string, kv ...string) string {
	t.Helper()
	p, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	q := p.Query()
	for i := 0; i < len(kv); i += 2 {
		q.Set(kv[i], kv[i+1])
	}
	p.RawQuery = q.Encode()
	return p.String()
}

// newRelay is a pgtest.Relay to the test cluster, closed at the end of
// the test; url is the database of clusterURL through it.
func newRelay(t *testing.T, clusterURL string) (r *pgtest.Relay, url string) {
	t.Helper()
	r, err := pgtest.NewRelay(clusterURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	if url, err = r.URL(clusterURL); err != nil {
		t.Fatal(err)
	}
	return r, url
}

// mustContain fails unless err's text holds every part.
func mustContain(t *testing.T, err error, parts ...string) {
	t.Helper()
	for _, p := range parts {
		if err == nil || !strings.Contains(err.Error(), p) {
			t.Errorf("error %v lacks %q", err, p)
		}
	}
}
