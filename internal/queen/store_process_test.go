//go:build !race

package queen

import (
	"context"
	"database/sql"
	"errors"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/lifecycle"
	"github.com/apiary-llm/apiary/internal/store"
)

// killQueenLock terminates the PostgreSQL backend holding the one-queen
// advisory lock ("apiary" in ASCII) of u's database.
func killQueenLock(t *testing.T, u string) {
	t.Helper()
	db, err := sql.Open("pgx", u)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var pid int
	if err := db.QueryRowContext(t.Context(), `SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
		AND objsubid = 1 AND ((classid::int8 << 32) | objid::int8) = $1`, int64(0x617069617279)).Scan(&pid); err != nil {
		t.Fatalf("find the queen's lock: %v", err)
	}
	var ok bool
	if err := db.QueryRowContext(t.Context(), "SELECT pg_terminate_backend($1)", pid).Scan(&ok); err != nil || !ok {
		t.Fatalf("pg_terminate_backend(%d): %v %v", pid, ok, err)
	}
}

// Regression: a queen on PostgreSQL whose lock connection dropped went on
// serving while a second queen could take the database. Now it steps
// down: the loss is found within the check interval (5s by default), the
// queen stops serving and exits non-zero saying why, and a second queen
// starts on the database.
func TestProcessQueenStepsDownWhenItsPostgresLockIsLost(t *testing.T) {
	u, err := pg.NewDatabase(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	q1, qURL := startQueenProc(t, "", u)
	killQueenLock(t, u)
	killed := time.Now()
	rec, _ := q1.logs.wait(t, 0, "queen stepping down", nil)
	if took := logTime(t, rec).Sub(killed); took > store.DefaultLeaseRenew+2*time.Second {
		t.Errorf("stepped down %s after the lock was lost; the renew interval is %s", took, store.DefaultLeaseRenew)
	}
	if !strings.Contains(rec.Attrs["err"], "lost the one-queen lock") {
		t.Errorf("step-down line does not say why: %v", rec.Attrs)
	}
	select {
	case <-q1.done:
	case <-time.After(waitLimit):
		t.Fatalf("queen still runs %s after stepping down; logs:\n%s", waitLimit, q1.logs.String())
	}
	var exit interface{ ExitCode() int }
	if err := q1.Err(); !errors.As(err, &exit) || exit.ExitCode() == 0 {
		t.Errorf("queen exit after losing its lock: %v, want a non-zero exit code", err)
	}
	if resp, err := http.Get(qURL + "/v2/pools"); err == nil {
		resp.Body.Close()
		t.Errorf("the queen that stepped down still answers: %s", resp.Status)
	}
	q2, _ := startQueenProc(t, "", u) // the database is free for another queen
	q2.stop(t, syscall.SIGTERM)
}

// `apiary queen --audit-retention 0 --rows-retention 1h` prunes the old
// ended row at start and keeps the old audit entry (0 keeps for ever);
// the live row stays.
func TestProcessQueenRetentionFlags(t *testing.T) {
	dir := sqliteDir(t)
	s, err := store.Open(t.Context(), store.Config{Path: filepath.Join(dir, store.SQLiteFile)})
	if err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-2 * time.Hour)
	err = s.Update(t.Context(), func(tx *store.Tx) error {
		for _, r := range []store.Row{
			{ID: "wk-00000000000000e1", Status: lifecycle.StatusFailed, CreatedAt: old, StoppedAt: &old},
			{ID: "wk-00000000000000a1", Status: lifecycle.StatusRunning, CreatedAt: old},
		} {
			r.PoolID, r.ModelRef, r.Owner = "gone", "tiny", OwnerQueen
			if err := tx.InsertRow(r); err != nil {
				return err
			}
		}
		_, err := tx.Append(store.AuditEntry{TS: old.Add(-24 * time.Hour), Actor: "queen", Action: "test", Target: "old"})
		return err
	})
	s.Close()
	if err != nil {
		t.Fatal(err)
	}
	q, _ := startQueenProc(t, dir, "", "--audit-retention", "0", "--rows-retention", "1h")
	q.logs.wait(t, 0, "pruned", map[string]string{"rows_removed": "1", "audit_removed": "0"})
	if err := q.stop(t, syscall.SIGTERM); err != nil {
		t.Fatalf("queen exit after SIGTERM: %v", err)
	}
	s, err = store.Open(context.Background(), store.Config{Path: filepath.Join(dir, store.SQLiteFile)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var rows []store.Row
	var audit []store.AuditEntry
	if err := s.View(t.Context(), func(tx *store.Tx) (err error) {
		if rows, err = tx.Rows(store.RowFilter{}); err != nil {
			return err
		}
		audit, err = tx.Audit(store.AuditFilter{Target: "old"})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, r := range rows {
		ids = append(ids, r.ID)
	}
	if len(ids) != 1 || ids[0] != "wk-00000000000000a1" || len(audit) != 1 {
		t.Errorf("after the prune: rows %v (want only the live one), %d old audit entries (want 1)", ids, len(audit))
	}
}

func TestRetentionConfig(t *testing.T) {
	for _, tc := range []struct {
		audit, rows time.Duration
		ok          bool
		wantAudit   time.Duration
	}{
		{0, 0, true, DefaultRetention},
		{KeepForever, time.Hour, true, KeepForever},
		{30 * time.Second, 0, false, 0},
		{0, time.Second, false, 0},
	} {
		cfg := Config{DataDir: t.TempDir(), AuditRetention: tc.audit, RowsRetention: tc.rows}.withDefaults()
		err := cfg.Validate()
		if (err == nil) != tc.ok {
			t.Errorf("retention audit=%s rows=%s: %v, want ok=%v", tc.audit, tc.rows, err, tc.ok)
		}
		if tc.ok && cfg.AuditRetention != tc.wantAudit {
			t.Errorf("audit retention %s after defaults = %s, want %s", tc.audit, cfg.AuditRetention, tc.wantAudit)
		}
		if err != nil && !strings.Contains(err.Error(), "Retention ") {
			t.Errorf("error does not name the field: %v", err)
		}
	}
}
