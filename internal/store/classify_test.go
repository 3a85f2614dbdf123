package store

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net/http"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/apiary-llm/apiary/internal/api"
)

// The errors that say the database is away or busy are answered 503 with
// Retry-After; the others keep their meaning.
func TestClassifyMarksADatabaseAwayOrBusy(t *testing.T) {
	for _, c := range []struct {
		err  error
		code string // "": left as it is
	}{
		{&pgconn.PgError{Code: "57P01", Message: "terminating connection due to administrator command"}, "database_unavailable"},
		{&pgconn.PgError{Code: "08006", Message: "connection failure"}, "database_unavailable"},
		{&pgconn.PgError{Code: "53300", Message: "too many connections"}, "database_unavailable"},
		{&pgconn.PgError{Code: "40001", Message: "could not serialize access"}, "database_unavailable"},
		{&pgconn.PgError{Code: "57014", Message: "canceling statement due to statement timeout"}, "database_timeout"},
		{fmt.Errorf("store: begin: %w", driver.ErrBadConn), "database_unavailable"},
		{fmt.Errorf("store: commit: %w", io.ErrUnexpectedEOF), "database_unavailable"},
		{errors.New("database is locked (5) (SQLITE_BUSY)"), "database_unavailable"},
		{fmt.Errorf("%w on PostgreSQL: gone", ErrLockLost), "not_active_queen"},
		{&pgconn.PgError{Code: "23505", Message: "duplicate key"}, ""},
		{ErrNotFound, ""},
		{context.Canceled, ""},
		{context.DeadlineExceeded, ""},
	} {
		got := classify(c.err)
		status, code := api.StatusOf(got)
		switch {
		case c.code == "" && got != c.err:
			t.Errorf("classify(%v) = %v, want it as it was", c.err, got)
		case c.code != "" && (status != http.StatusServiceUnavailable || code != c.code):
			t.Errorf("classify(%v): %d %s, want 503 %s", c.err, status, code, c.code)
		}
	}
}
