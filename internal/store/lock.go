package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/apiary-llm/apiary/internal/rpc"
	"github.com/apiary-llm/apiary/internal/secret"
)

// connectError is a failed connection to PostgreSQL told in one line:
// pgx's own message lists every address it tried on lines of their own.
// The cause stays wrapped for errors.Is and errors.As.
type connectError struct {
	msg string
	err error
}

func (e *connectError) Error() string { return e.msg }
func (e *connectError) Unwrap() error { return e.err }

// connectFailed says which server did not take the connection and why,
// in the network's words when the cause is one (connection refused, no
// such host), and what to check.
func connectFailed(cfg *pgx.ConnConfig, err error) error {
	why, ok := rpc.NetReason(err)
	if !ok {
		return fmt.Errorf("cannot connect to PostgreSQL: %w", err)
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() && cfg.ConnectTimeout > 0 {
		why = fmt.Sprintf("no answer within %s (connect_timeout)", cfg.ConnectTimeout)
	}
	return &connectError{err: err, msg: fmt.Sprintf("cannot connect to PostgreSQL at %s:%d (user %s, database %s): %s; check that the server runs and that the database URL names it",
		cfg.Host, cfg.Port, cfg.User, cfg.Database, why)}
}

// pgLockKey is the advisory lock id of a queen on PostgreSQL ("apiary" in
// ASCII).
const pgLockKey = 0x617069617279

// pgLock is the one-queen lock on PostgreSQL: a session advisory lock held
// by a connection of its own, outside the pool, so that nothing else ever
// runs on it or closes it. Only the store's lock watcher uses conn after
// Open, and release only after the watcher has stopped.
type pgLock struct {
	conn *pgx.Conn
	pid  uint32 // the backend holding the lock
}

// lockWait bounds the wait for the advisory lock once the sessions of a
// holder whose lease lapsed were ended (their backends exit at once).
const lockWait = 2 * time.Second

// acquirePGLock connects and takes the lock, or answers ErrLocked when
// another session holds it and its lease is live. A holder whose lease
// lapsed is ended (endLapsed) and the lock waited for.
func (s *Store) acquirePGLock(ctx context.Context, cfg *pgx.ConnConfig) (*pgLock, error) {
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, connectFailed(cfg, err)
	}
	fail := func(err error) (*pgLock, error) {
		conn.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	got, err := tryLock(ctx, conn)
	if err == nil && !got {
		var ended bool
		if ended, err = s.endLapsed(ctx, conn); ended {
			for deadline := time.Now().Add(lockWait); err == nil && !got && time.Now().Before(deadline); {
				select {
				case <-ctx.Done():
					return fail(ctx.Err())
				case <-time.After(20 * time.Millisecond):
				}
				got, err = tryLock(ctx, conn)
			}
		}
	}
	if err != nil {
		return fail(err)
	}
	if !got {
		return fail(fmt.Errorf("%w (PostgreSQL advisory lock %d is held)", ErrLocked, pgLockKey))
	}
	return &pgLock{conn: conn, pid: conn.PgConn().PID()}, nil
}

// tryLock tries the advisory lock on conn.
func tryLock(ctx context.Context, conn *pgx.Conn) (bool, error) {
	var got bool
	if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", int64(pgLockKey)).Scan(&got); err != nil {
		return false, fmt.Errorf("PostgreSQL advisory lock: %w", classifyPG(err))
	}
	return got, nil
}

// check confirms that the lock's session is alive and still holds the
// lock (pg_locks of its own backend).
func (l *pgLock) check(ctx context.Context) error {
	var held bool
	err := l.conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory'
		AND pid = pg_backend_pid() AND granted AND objsubid = 1
		AND ((classid::int8 << 32) | objid::int8) = $1::int8)`, int64(pgLockKey)).Scan(&held)
	switch {
	case err != nil:
		return fmt.Errorf("the lock's connection (backend pid %d) failed: %w", l.pid, err)
	case !held:
		return fmt.Errorf("backend pid %d no longer holds advisory lock %d", l.pid, pgLockKey)
	}
	return nil
}

// release gives the lock up and closes its connection.
func (l *pgLock) release() error {
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	var err error
	if !l.conn.IsClosed() {
		_, err = l.conn.Exec(ctx, "SELECT pg_advisory_unlock($1)", int64(pgLockKey))
	}
	return errors.Join(err, l.conn.Close(ctx))
}

// markLost records why the lock is gone and closes LockLost.
func (s *Store) markLost(cause error) {
	s.lostOnce.Do(func() {
		s.lostErr = fmt.Errorf("%w on PostgreSQL: %w", ErrLockLost, cause)
		s.log.Error("lost the one-queen lock: another queen may take the database; this store writes nothing more", "err", cause)
		close(s.lost)
	})
}

// LockLost is closed when the one-queen lock is gone (PostgreSQL: its
// connection dropped or no longer holds it, the lease was taken, or no
// renewal succeeded before the holder's deadline; found within the renew
// interval, or at the first Fence after it). From then on Update answers
// LockErr. On SQLite (a file lock
// that ends only with the process) it is never closed.
func (s *Store) LockLost() <-chan struct{} { return s.lost }

// LockErr says why the lock was lost (wrapping ErrLockLost); nil while it
// is held.
func (s *Store) LockErr() error {
	select {
	case <-s.lost:
		return s.lostErr
	default:
		return nil
	}
}

// proveEpoch is the first statement of every write transaction on
// PostgreSQL: the lease row read FOR KEY SHARE must hold this store's
// epoch and be live on the database's clock. The row lock keeps another
// queen from taking the lease (takeLease locks the row FOR UPDATE) until
// the transaction ends, so no write of this store lands after another
// queen took over; the renewal (an UPDATE of no key) does not wait for
// it. A newer epoch or a lapsed lease means the lock is lost: the store
// is marked so and writes nothing more.
func (s *Store) proveEpoch(ctx context.Context, tx *sql.Tx) error {
	var epoch int64
	var live bool
	err := tx.QueryRowContext(ctx, "SELECT epoch, expires_at > "+dbNow+" FROM queen_lease WHERE id = 1 FOR KEY SHARE").Scan(&epoch, &live)
	if err != nil {
		return fmt.Errorf("prove the fencing epoch: %w", classifyPG(err))
	}
	switch {
	case epoch != s.epoch:
		s.markLost(fmt.Errorf("another queen took the database (fencing epoch %d, this queen's %d)", epoch, s.epoch))
		return s.lostErr
	case !live:
		s.markLost(fmt.Errorf("the lease of fencing epoch %d lapsed on the database's clock", epoch))
		return s.lostErr
	}
	return nil
}

// Epoch is the fencing epoch this store took (0 on SQLite).
func (s *Store) Epoch() int64 { return s.epoch }

// ActiveHolder reads who holds the PostgreSQL database at url: the
// Holder the active queen gave, and its epoch; "" when no queen has held
// it yet. It takes no lock: a standby asks it while it waits.
func ActiveHolder(ctx context.Context, url string) (holder string, epoch int64, err error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return "", 0, secret.RedactError(fmt.Errorf("PostgreSQL URL: %w", err), url)
	}
	withPGDefaults(cfg)
	withNetDefaults(cfg, DefaultLeaseDuration, "")
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return "", 0, secret.RedactError(fmt.Errorf("connect to PostgreSQL: %w", err), url)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	err = conn.QueryRow(ctx, "SELECT holder, epoch FROM queen_lease WHERE id = 1").Scan(&holder, &epoch)
	var pe *pgconn.PgError
	switch {
	case errors.Is(err, pgx.ErrNoRows), errors.As(err, &pe) && pe.Code == "42P01": // no row, no table yet
		return "", 0, nil
	case err != nil:
		return "", 0, secret.RedactError(fmt.Errorf("read the queen lease: %w", err), url)
	}
	return holder, epoch, nil
}
