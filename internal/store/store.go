// Package store persists the queen's state: pools, worker lifecycle rows,
// the audit log and SSH nodes. It runs on SQLite (a file in the queen's data
// dir, through the pure-Go modernc.org/sqlite) or on PostgreSQL (through
// pgx), with one set of embedded, versioned migrations for both.
//
// Every change goes through Update, one transaction: a caller that writes a
// row and its audit entry in the same Update never leaves one without the
// other. One queen owns a database at a time; Open takes a lock (a file lock
// beside the SQLite file, an advisory lock on PostgreSQL) and refuses a
// second owner with ErrLocked.
package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	_ "modernc.org/sqlite"             // database/sql driver "sqlite"

	"github.com/apiary-llm/apiary/internal/secret"
)

// Sentinel errors.
var (
	ErrNotFound = errors.New("store: not found")
	ErrExists   = errors.New("store: already exists")
	ErrLocked   = errors.New("store: database is in use by another queen")
)

// Dialect is the database behind a Store.
type Dialect string

// The supported databases.
const (
	SQLite   Dialect = "sqlite"
	Postgres Dialect = "postgres"
)

// Config says which database to open. URL wins when set: postgres:// or
// postgresql:// selects PostgreSQL. Otherwise the SQLite file Path is used
// (created with its directory when missing).
type Config struct {
	URL    string
	Path   string
	Logger *slog.Logger
}

// SQLiteFile is the name of the queen's SQLite database in its data dir.
const SQLiteFile = "queen.db"

// busyTimeout is how long SQLite waits for a lock held by another
// connection before it answers SQLITE_BUSY.
const busyTimeout = 5 * time.Second

// Store is an open database. It is safe for concurrent use.
type Store struct {
	db      *sql.DB
	dialect Dialect
	log     *slog.Logger
	// auditSeq is the last audit id handed out; ids are assigned here so
	// that one schema serves both databases.
	auditSeq atomic.Int64

	unlock func() error // releases the owner lock
	closed atomic.Bool
}

// IsPostgresURL reports whether u names a PostgreSQL database.
func IsPostgresURL(u string) bool {
	return strings.HasPrefix(u, "postgres://") || strings.HasPrefix(u, "postgresql://")
}

// Open opens (creating when needed) and migrates the database of cfg, and
// takes the owner lock. Its errors never show the URL's password.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	s, err := open(ctx, cfg)
	return s, secret.RedactError(err, cfg.URL)
}

func open(ctx context.Context, cfg Config) (*Store, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	s := &Store{log: log.With("component", "store")}
	var err error
	switch {
	case cfg.URL != "" && IsPostgresURL(cfg.URL):
		s.dialect = Postgres
		err = s.openPostgres(ctx, cfg.URL)
	case cfg.URL != "":
		return nil, fmt.Errorf("store: --database-url must start with postgres:// or postgresql://")
	case cfg.Path != "":
		s.dialect = SQLite
		err = s.openSQLite(ctx, cfg.Path)
	default:
		return nil, errors.New("store: no database: give a SQLite path or a PostgreSQL URL")
	}
	if err != nil {
		return nil, err
	}
	if err := s.migrate(ctx); err != nil {
		s.Close()
		return nil, err
	}
	var maxID sql.NullInt64
	if err := s.db.QueryRowContext(ctx, "SELECT MAX(id) FROM audit_log").Scan(&maxID); err != nil {
		s.Close()
		return nil, fmt.Errorf("store: read audit sequence: %w", err)
	}
	s.auditSeq.Store(maxID.Int64)
	return s, nil
}

func (s *Store) openSQLite(ctx context.Context, path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("store: create data dir: %w", err)
	}
	unlock, err := lockFile(path + ".lock")
	if err != nil {
		return err
	}
	// WAL lets readers run beside the writer; NORMAL sync is durable
	// across process crashes (not power loss of the last commits), the
	// usual choice with WAL; IMMEDIATE transactions take the write lock
	// up front so two writers wait (busy timeout) instead of deadlocking.
	dsn := "file:" + path + "?_pragma=" + fmt.Sprintf("busy_timeout(%d)", busyTimeout.Milliseconds()) +
		"&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_pragma=foreign_keys(1)&_txlock=immediate"
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		_ = unlock()
		return fmt.Errorf("store: open %s: %w", path, err)
	}
	// One writer at a time is all SQLite allows; a small pool lets reads
	// (the admin API) run beside a write under WAL.
	db.SetMaxOpenConns(4)
	db.SetConnMaxIdleTime(0)
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		_ = unlock()
		return fmt.Errorf("store: open %s: %w", path, err)
	}
	s.db, s.unlock = db, unlock
	return nil
}

// lockFile takes an exclusive, non-blocking flock on path. The lock ends
// with the process, so a killed queen never leaves it behind.
func lockFile(path string) (func() error, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("store: lock file: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w (lock %s is held)", ErrLocked, path)
		}
		return nil, fmt.Errorf("store: lock %s: %w", path, err)
	}
	return f.Close, nil
}

// pgLockKey is the advisory lock id of a queen on PostgreSQL ("apiary" in
// ASCII).
const pgLockKey = 0x617069617279

func (s *Store) openPostgres(ctx context.Context, url string) error {
	db, err := sql.Open("pgx", url)
	if err != nil {
		return fmt.Errorf("store: open PostgreSQL: %w", err)
	}
	db.SetMaxOpenConns(8)
	// The advisory lock lives as long as this session: keep one connection
	// out of the pool for it.
	conn, err := db.Conn(ctx)
	if err != nil {
		db.Close()
		return fmt.Errorf("store: connect to PostgreSQL: %w", err)
	}
	var got bool
	if err := conn.QueryRowContext(ctx, "SELECT pg_try_advisory_lock($1)", int64(pgLockKey)).Scan(&got); err != nil {
		conn.Close()
		db.Close()
		return fmt.Errorf("store: PostgreSQL advisory lock: %w", err)
	}
	if !got {
		conn.Close()
		db.Close()
		return fmt.Errorf("%w (PostgreSQL advisory lock %d is held)", ErrLocked, pgLockKey)
	}
	s.db = db
	s.unlock = func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := conn.ExecContext(ctx, "SELECT pg_advisory_unlock($1)", int64(pgLockKey))
		return errors.Join(err, conn.Close())
	}
	return nil
}

// Dialect says which database this is.
func (s *Store) Dialect() Dialect { return s.dialect }

// Close releases the owner lock and closes the database. It is idempotent.
//
// Order:
//  1. release the owner lock (PostgreSQL: on its own connection),
//  2. close the connection pool.
func (s *Store) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	var errs []error
	if s.unlock != nil {
		errs = append(errs, s.unlock())
	}
	errs = append(errs, s.db.Close())
	return errors.Join(errs...)
}

// Ping checks that the database answers.
func (s *Store) Ping(ctx context.Context) error { return s.db.PingContext(ctx) }

// Tx is one transaction of Update or View. Its methods use the context the
// transaction was begun with.
type Tx struct {
	ctx context.Context
	tx  *sql.Tx
	s   *Store
}

// Update runs fn in a read-write transaction: committed when fn returns
// nil, rolled back (nothing written) when it returns an error.
func (s *Store) Update(ctx context.Context, fn func(*Tx) error) error {
	return s.run(ctx, false, fn)
}

// View runs fn in a read-only transaction.
func (s *Store) View(ctx context.Context, fn func(*Tx) error) error {
	return s.run(ctx, true, fn)
}

func (s *Store) run(ctx context.Context, readOnly bool, fn func(*Tx) error) (err error) {
	var opts *sql.TxOptions
	if readOnly && s.dialect == Postgres {
		// SQLite's driver would still BEGIN IMMEDIATE; read-only is a
		// PostgreSQL nicety only.
		opts = &sql.TxOptions{ReadOnly: true}
	}
	tx, err := s.db.BeginTx(ctx, opts)
	if err != nil {
		return fmt.Errorf("store: begin: %w", err)
	}
	defer func() {
		if p := recover(); p != nil {
			_ = tx.Rollback()
			panic(p)
		}
	}()
	if err := fn(&Tx{ctx: ctx, tx: tx, s: s}); err != nil {
		_ = tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("store: commit: %w", err)
	}
	return nil
}

// q rewrites a query written with ? placeholders for the dialect
// (PostgreSQL wants $1, $2, …). The queries are this package's own, with
// no ? inside literals.
func (s *Store) q(query string) string {
	if s.dialect != Postgres {
		return query
	}
	var b strings.Builder
	n := 0
	for _, r := range query {
		if r == '?' {
			n++
			b.WriteByte('$')
			b.WriteString(strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

func (t *Tx) exec(query string, args ...any) (sql.Result, error) {
	return t.tx.ExecContext(t.ctx, t.s.q(query), args...)
}

func (t *Tx) query(query string, args ...any) (*sql.Rows, error) {
	return t.tx.QueryContext(t.ctx, t.s.q(query), args...)
}

func (t *Tx) queryRow(query string, args ...any) *sql.Row {
	return t.tx.QueryRowContext(t.ctx, t.s.q(query), args...)
}

// Times are stored as Unix microseconds, UTC.

func micros(t time.Time) int64 { return t.UnixMicro() }

func fromMicros(us int64) time.Time { return time.UnixMicro(us).UTC() }

func nullMicros(t *time.Time) sql.NullInt64 {
	if t == nil || t.IsZero() {
		return sql.NullInt64{}
	}
	return sql.NullInt64{Int64: t.UnixMicro(), Valid: true}
}

func timePtr(n sql.NullInt64) *time.Time {
	if !n.Valid {
		return nil
	}
	t := fromMicros(n.Int64)
	return &t
}

func nullInt(p *int) sql.NullInt64 {
	if p == nil {
		return sql.NullInt64{}
	}
	return sql.NullInt64{Int64: int64(*p), Valid: true}
}

func intPtr(n sql.NullInt64) *int {
	if !n.Valid {
		return nil
	}
	v := int(n.Int64)
	return &v
}
