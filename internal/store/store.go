// Package store persists the queen's state: pools, worker lifecycle rows,
// the audit log and SSH nodes. It runs on SQLite (a file in the queen's data
// dir, through the pure-Go modernc.org/sqlite) or on PostgreSQL (through
// pgx), with one set of embedded, versioned migrations for both.
//
// Every change goes through Update, one transaction: a caller that writes a
// row and its audit entry in the same Update never leaves one without the
// other. One queen owns a database at a time; Open takes a lock (a file lock
// beside the SQLite file, an advisory lock on PostgreSQL) and refuses a
// second owner with ErrLocked. On PostgreSQL the lock lives on a connection
// of its own that the store re-checks (lock.go); LockLost is closed when it
// is gone, and from then on Update refuses to write.
//
// PostgreSQL statements have server-side timeouts (statement_timeout,
// lock_timeout) and connecting has a deadline (connect_timeout), so a hung
// database fails a call with ErrTimeout instead of holding it forever.
// Audit ids come from the database (an identity column, SQLite
// AUTOINCREMENT), never reused, not even after a restart or a prune.
package store

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
	_ "modernc.org/sqlite" // database/sql driver "sqlite"

	"github.com/apiary-llm/apiary/internal/datadir"
	"github.com/apiary-llm/apiary/internal/openai"
	"github.com/apiary-llm/apiary/internal/secret"
)

// Sentinel errors.
var (
	ErrNotFound = errors.New("not found")
	ErrExists   = errors.New("already exists")
	ErrLocked   = openai.Sentinel(http.StatusServiceUnavailable, "store_locked", "database is in use by another queen")
	// ErrLockLost: the one-queen lock is gone (its connection dropped or
	// it was released); the queen must step down. A write refused for it
	// is answered 503: another queen serves.
	ErrLockLost = &openai.CodedError{Status: http.StatusServiceUnavailable, Code: "not_active_queen",
		Message: "lost the one-queen lock", Retry: time.Second}
	// ErrTimeout: PostgreSQL cancelled a statement that ran past
	// statement_timeout or waited past lock_timeout, or the transaction
	// ran past its client-side limit. Answered 503 with Retry-After.
	ErrTimeout = &openai.CodedError{Status: http.StatusServiceUnavailable, Code: "database_timeout",
		Message: "the database did not answer in time", Retry: 2 * time.Second}
	// ErrUnavailable: the database cannot be reached, dropped the
	// connection, is shutting down, has no connection left, or is busy
	// (SQLite's write lock held past its busy timeout; a serialization
	// failure). Nothing was written; answered 503 with Retry-After.
	ErrUnavailable = &openai.CodedError{Status: http.StatusServiceUnavailable, Code: "database_unavailable",
		Message: "the database is unavailable or busy; nothing was written, try again", Retry: 2 * time.Second}
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

	// LeaseDuration is how long a renewal of the PostgreSQL lease keeps
	// it (lease.go); default DefaultLeaseDuration.
	LeaseDuration time.Duration
	// LeaseRenew is how often the holder renews the lease and checks its
	// lock, at most a third of LeaseDuration; default DefaultLeaseRenew.
	LeaseRenew time.Duration
	// Retention is what the store prunes in the background; the zero
	// value prunes nothing.
	Retention Retention
	// Holder names the queen that holds the database (its advertised
	// URL), kept with the fencing epoch for standbys to point at
	// (ActiveHolder); PostgreSQL only.
	Holder string
}

// PostgreSQL timeouts, each overridden by the parameter of the same name
// in the URL (connect_timeout in seconds, the others as PostgreSQL reads
// them, e.g. statement_timeout=60s).
const (
	// DefaultConnectTimeout bounds opening one connection.
	DefaultConnectTimeout = 5 * time.Second
	// DefaultStatementTimeout is the server's limit on one statement.
	DefaultStatementTimeout = 30 * time.Second
	// DefaultLockTimeout is the server's limit on waiting for a row or
	// table lock.
	DefaultLockTimeout = 5 * time.Second
)

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
	// txTimeout bounds one transaction on the client side (PostgreSQL:
	// twice the statement timeout, against a network that stops
	// answering); 0: none.
	txTimeout time.Duration

	// gate serializes the transactions of a SQLite store in this
	// process, first come, first served (a channel's waiting senders are
	// served in order); nil on PostgreSQL. SQLite takes one writer at a
	// time (and every transaction here begins IMMEDIATE), and its busy
	// handler polls with sleeps that grow to 100 ms: a transaction
	// waiting there missed every short gap between another's
	// back-to-back transactions (a batch's jobs written a chunk at a
	// time) until its busy timeout. In the gate it waits its turn.
	gate chan struct{}

	unlock func() error // releases the owner lock
	lock   *pgLock      // PostgreSQL's lock connection; nil on SQLite
	lease  *lease       // PostgreSQL's lease; nil on SQLite
	// epoch is the fencing epoch this store took with the lock
	// (PostgreSQL; 0 on SQLite): every write transaction proves it.
	epoch int64
	// lost is closed when the owner lock is gone; lostErr says why.
	lost     chan struct{}
	lostOnce sync.Once
	lostErr  error // written once before lost is closed

	bgCancel context.CancelFunc // ends the lock check and the pruning
	bg       sync.WaitGroup
	closed   atomic.Bool
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
	s := &Store{log: log.With("component", "store"), lost: make(chan struct{})}
	var err error
	switch {
	case cfg.URL != "" && IsPostgresURL(cfg.URL):
		s.dialect = Postgres
		if s.lease, err = newLease(cfg.LeaseDuration, cfg.LeaseRenew); err == nil {
			err = s.openPostgres(ctx, cfg.URL)
		}
	case cfg.URL != "":
		return nil, fmt.Errorf("--database-url must start with postgres:// or postgresql://")
	case cfg.Path != "":
		s.dialect = SQLite
		err = s.openSQLite(ctx, cfg.Path)
	default:
		return nil, errors.New("no database: give a SQLite path or a PostgreSQL URL")
	}
	if err != nil {
		return nil, err
	}
	if err := s.migrate(ctx); err != nil {
		s.Close()
		return nil, err
	}
	if s.lock != nil {
		if err := s.takeLease(ctx, cfg.Holder); err != nil {
			s.Close()
			return nil, err
		}
	}
	bg, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s.bgCancel = cancel
	if s.lock != nil {
		s.bg.Go(func() { s.keepLease(bg) })
	}
	if cfg.Retention.enabled() {
		s.bg.Go(func() { s.runRetention(bg, cfg.Retention) })
	}
	return s, nil
}

func (s *Store) openSQLite(ctx context.Context, path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("%w %s: %w", datadir.ErrUnusable, filepath.Dir(path), err)
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
		return fmt.Errorf("open %s: %w", path, err)
	}
	// One writer at a time is all SQLite allows; a small pool lets reads
	// (the admin API) run beside a write under WAL.
	db.SetMaxOpenConns(4)
	db.SetConnMaxIdleTime(0)
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		_ = unlock()
		return fmt.Errorf("open %s: %w", path, err)
	}
	s.db, s.unlock, s.gate = db, unlock, make(chan struct{}, 1)
	return nil
}

// lockFile takes an exclusive, non-blocking flock on path. The lock ends
// with the process, so a killed queen never leaves it behind.
func lockFile(path string) (func() error, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("%w: lock file: %w", datadir.ErrUnusable, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w (lock %s is held)", ErrLocked, path)
		}
		return nil, fmt.Errorf("%w: lock %s: %w", datadir.ErrUnusable, path, err)
	}
	return f.Close, nil
}

func (s *Store) openPostgres(ctx context.Context, url string) error {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return fmt.Errorf("PostgreSQL URL: %w", err)
	}
	stmt := withPGDefaults(cfg)
	if stmt > 0 {
		s.txTimeout = 2 * stmt
	}
	withNetDefaults(cfg, s.lease.dur, s.lease.session)
	// The lock first, on a connection of its own: the pool's connections
	// come and go, the lock lives as long as its session.
	lock, err := s.acquirePGLock(ctx, cfg)
	if err != nil {
		return err
	}
	db := stdlib.OpenDB(*cfg)
	db.SetMaxOpenConns(8)
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		lock.release()
		return connectFailed(cfg, err)
	}
	s.db, s.lock, s.unlock = db, lock, lock.release
	s.log.Info("holding the one-queen lock", "lock_backend_pid", lock.pid, "connect_timeout", cfg.ConnectTimeout,
		"statement_timeout", cfg.RuntimeParams["statement_timeout"], "lock_timeout", cfg.RuntimeParams["lock_timeout"])
	return nil
}

// withPGDefaults sets the timeouts the URL leaves out and returns the
// statement timeout (0 when the URL disables it or gives it in a form this
// does not read).
func withPGDefaults(cfg *pgx.ConnConfig) time.Duration {
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = DefaultConnectTimeout
	}
	for name, d := range map[string]time.Duration{"statement_timeout": DefaultStatementTimeout, "lock_timeout": DefaultLockTimeout} {
		if _, ok := cfg.RuntimeParams[name]; !ok {
			cfg.RuntimeParams[name] = pgSetting(d)
		}
	}
	return pgDuration(cfg.RuntimeParams["statement_timeout"])
}

// pgSetting writes d as a PostgreSQL time setting: "30s", or "250ms".
func pgSetting(d time.Duration) string {
	if d%time.Second == 0 {
		return strconv.FormatInt(int64(d/time.Second), 10) + "s"
	}
	return strconv.FormatInt(d.Milliseconds(), 10) + "ms"
}

// pgDuration reads a PostgreSQL time setting: a number of milliseconds or
// one with a unit ("30s", "2min", "500ms"); 0 when it reads neither.
func pgDuration(v string) time.Duration {
	if ms, err := strconv.ParseInt(v, 10, 64); err == nil {
		return time.Duration(ms) * time.Millisecond
	}
	d, _ := time.ParseDuration(strings.ReplaceAll(strings.ReplaceAll(v, " ", ""), "min", "m"))
	return d
}

// Dialect says which database this is.
func (s *Store) Dialect() Dialect { return s.dialect }

// Close releases the owner lock and closes the database. It is idempotent.
//
// Order:
//  1. stop the lease's renewal and the pruning, and wait for them,
//  2. release the lease (PostgreSQL; a standby takes it at once),
//  3. release the owner lock (PostgreSQL: on its own connection),
//  4. close the connection pool.
func (s *Store) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	if s.bgCancel != nil {
		s.bgCancel()
	}
	s.bg.Wait()
	if s.lease != nil && s.epoch != 0 {
		s.lease.until.Store(0) // nothing more is done under it
		s.releaseLease()
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

func (s *Store) run(ctx context.Context, readOnly bool, fn func(*Tx) error) error {
	if !readOnly {
		if err := s.Fence(); err != nil {
			return err
		}
	}
	if s.gate != nil {
		wait := time.NewTimer(busyTimeout)
		select {
		case s.gate <- struct{}{}:
			wait.Stop()
		case <-ctx.Done():
			wait.Stop()
			return ctx.Err()
		case <-wait.C:
			return fmt.Errorf("%w: other transactions held the database for %s", ErrUnavailable, busyTimeout)
		}
		defer func() { <-s.gate }()
	}
	if s.txTimeout == 0 {
		return classify(s.runTx(ctx, readOnly, fn))
	}
	tctx, cancel := context.WithTimeoutCause(ctx, s.txTimeout, errTxTimeout)
	defer cancel()
	err := s.runTx(tctx, readOnly, fn)
	if err != nil && ctx.Err() == nil && context.Cause(tctx) == errTxTimeout {
		return fmt.Errorf("%w (a transaction ran past %s): %w", ErrTimeout, s.txTimeout, err)
	}
	return classify(err)
}

// classify marks the errors that say the database is away or busy, not
// that the write was wrong: timeouts (ErrTimeout), a connection that
// cannot be made or broke, a server shutting down or out of connections,
// a serialization failure or deadlock, SQLite's busy lock
// (ErrUnavailable). Clients are answered 503 with Retry-After for them.
func classify(err error) error {
	err = classifyPG(err)
	if err == nil || errors.Is(err, ErrTimeout) || errors.Is(err, ErrLockLost) || errors.Is(err, ErrLocked) ||
		errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err // the caller's own deadline or cancel is not the database's
	}
	var pe *pgconn.PgError
	var ce *pgconn.ConnectError
	var ne net.Error
	switch {
	case errors.As(err, &pe):
		switch {
		case strings.HasPrefix(pe.Code, "08"), // connection exception
			pe.Code == "57P01", pe.Code == "57P02", pe.Code == "57P03", // admin shutdown, crash shutdown, cannot connect now
			pe.Code == "53300",                     // too many connections
			pe.Code == "40001", pe.Code == "40P01": // serialization failure, deadlock
			return fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		return err
	case errors.As(err, &ce), errors.As(err, &ne), errors.Is(err, driver.ErrBadConn), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	case strings.Contains(err.Error(), "SQLITE_BUSY"), strings.Contains(err.Error(), "database is locked"),
		strings.Contains(err.Error(), "conn closed"), strings.Contains(err.Error(), "connection reset"):
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return err
}

var errTxTimeout = errors.New("transaction timeout")

// classifyPG marks PostgreSQL's statement and lock timeouts as ErrTimeout.
func classifyPG(err error) error {
	var pe *pgconn.PgError
	if err == nil || !errors.As(err, &pe) {
		return err
	}
	switch pe.Code {
	case "57014": // query_canceled: statement_timeout (or an operator's pg_cancel_backend)
		return fmt.Errorf("%w (statement_timeout): %w", ErrTimeout, err)
	case "55P03": // lock_not_available: lock_timeout
		return fmt.Errorf("%w (lock_timeout): %w", ErrTimeout, err)
	}
	return err
}

func (s *Store) runTx(ctx context.Context, readOnly bool, fn func(*Tx) error) (err error) {
	var opts *sql.TxOptions
	if readOnly && s.dialect == Postgres {
		// SQLite's driver would still BEGIN IMMEDIATE; read-only is a
		// PostgreSQL nicety only.
		opts = &sql.TxOptions{ReadOnly: true}
	}
	tx, err := s.db.BeginTx(ctx, opts)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer func() {
		if p := recover(); p != nil {
			_ = tx.Rollback()
			panic(p)
		}
	}()
	if !readOnly && s.epoch != 0 {
		if err := s.proveEpoch(ctx, tx); err != nil {
			_ = tx.Rollback()
			return err
		}
	}
	if err := fn(&Tx{ctx: ctx, tx: tx, s: s}); err != nil {
		_ = tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
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

// prepare prepares query on the transaction, for a statement run for
// each item of a batch: parsed once rather than once an item.
func (t *Tx) prepare(query string) (*sql.Stmt, error) {
	return t.tx.PrepareContext(t.ctx, t.s.q(query))
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
