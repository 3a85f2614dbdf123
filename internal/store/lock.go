package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// pgLockKey is the advisory lock id of a queen on PostgreSQL ("apiary" in
// ASCII).
const pgLockKey = 0x617069617279

// lockCheckTimeout bounds one check of the lock: a lock connection that
// does not answer this long is taken as lost (it cannot be replaced
// without giving the lock up).
const lockCheckTimeout = 10 * time.Second

// pgLock is the one-queen lock on PostgreSQL: a session advisory lock held
// by a connection of its own, outside the pool, so that nothing else ever
// runs on it or closes it. Only the store's lock watcher uses conn after
// Open, and release only after the watcher has stopped.
type pgLock struct {
	conn *pgx.Conn
	pid  uint32 // the backend holding the lock
}

// acquirePGLock connects and takes the lock, or answers ErrLocked when
// another session holds it.
func acquirePGLock(ctx context.Context, cfg *pgx.ConnConfig) (*pgLock, error) {
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("store: connect to PostgreSQL: %w", err)
	}
	var got bool
	if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", int64(pgLockKey)).Scan(&got); err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("store: PostgreSQL advisory lock: %w", classifyPG(err))
	}
	if !got {
		conn.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("%w (PostgreSQL advisory lock %d is held)", ErrLocked, pgLockKey)
	}
	return &pgLock{conn: conn, pid: conn.PgConn().PID()}, nil
}

// check confirms that the lock's session is alive and still holds the
// lock (pg_locks of its own backend).
func (l *pgLock) check(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, lockCheckTimeout)
	defer cancel()
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
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var err error
	if !l.conn.IsClosed() {
		_, err = l.conn.Exec(ctx, "SELECT pg_advisory_unlock($1)", int64(pgLockKey))
	}
	return errors.Join(err, l.conn.Close(ctx))
}

// watchLock checks the lock every interval until ctx ends or the lock is
// lost; then it marks the store lost.
func (s *Store) watchLock(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		err := s.lock.check(ctx)
		if err == nil {
			continue
		}
		if ctx.Err() != nil {
			return // Close cancelled the check
		}
		s.markLost(err)
		return
	}
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
// connection dropped or no longer holds it; found within the check
// interval). From then on Update answers LockErr. On SQLite (a file lock
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
