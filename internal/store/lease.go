package store

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"golang.org/x/sys/unix"
)

// Leadership on PostgreSQL is a lease with a deadline, in the queen_lease
// row: holder, epoch, session (the application_name of every connection
// of the holder) and expires_at, on the database's clock. The holder
// renews it every LeaseRenew; a standby that finds it lapsed (expires_at
// passed on the database's clock) ends the holder's sessions
// (pg_terminate_backend, so that a session kept open by a partition or a
// frozen process lets its advisory lock go) and takes it.
//
// The holder stops acting on its own clock before the lease can lapse:
// each renewal sent at monotonic time t that succeeds lets it act until
// t + the renew deadline (3/4 of LeaseDuration), while the database sets
// expires_at to its own now + LeaseDuration, a now that is after t. So the
// holder's deadline is at least LeaseDuration/4 before any standby can
// see the lease lapse, whatever the queens' wall clocks say; only the
// rate of the clocks matters. Every write and every command to a hive
// checks that deadline first (Fence), so a queen frozen past it (SIGSTOP,
// a stalled VM) finds itself deposed when it wakes, before it acts.

// Lease defaults (Config.LeaseDuration, Config.LeaseRenew).
const (
	// DefaultLeaseDuration is how long a renewal keeps the lease; a
	// standby takes over at most this long (plus its poll) after the
	// active queen's last renewal.
	DefaultLeaseDuration = 4 * time.Second
	// DefaultLeaseRenew is how often the active queen renews its lease.
	DefaultLeaseRenew = time.Second
)

// lease is the holder's side of the lease.
type lease struct {
	dur      time.Duration // LeaseDuration: what a renewal adds on the database's clock
	renew    time.Duration // how often it is renewed
	deadline time.Duration // how long after a renewal was sent the holder acts on it
	session  string        // the application_name of this store's connections
	base     time.Time     // monotonic origin of until
	// until is when this holder stops acting, in nanoseconds after base
	// (0 until the lease is taken).
	until atomic.Int64
}

func newLease(dur, renew time.Duration) (*lease, error) {
	dur, renew = cmp.Or(dur, DefaultLeaseDuration), cmp.Or(renew, DefaultLeaseRenew)
	if dur < 0 || renew < 0 || renew*3 > dur {
		return nil, fmt.Errorf("lease renew interval %s must be at most a third of the lease duration %s", renew, dur)
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	return &lease{dur: dur, renew: renew, deadline: dur * 3 / 4, session: "apiary-queen-" + hex.EncodeToString(b[:]), base: time.Now()}, nil
}

// now is the monotonic time in nanoseconds after base.
func (l *lease) now() int64 { return int64(time.Since(l.base)) }

// renewed records a successful renewal (or take) sent at sent.
func (l *lease) renewed(sent int64) { l.until.Store(sent + int64(l.deadline)) }

// left is how long the holder may still act; 0 or less: no more.
func (l *lease) left() time.Duration { return time.Duration(l.until.Load() - l.now()) }

// dbNow is the database's clock in milliseconds since 1970.
const dbNow = "(extract(epoch from clock_timestamp()) * 1000)::bigint"

// leaseRow is the lease as a standby reads it.
type leaseRow struct {
	holder, session string
	epoch           int64
	left            time.Duration // until expires_at on the database's clock; ≤ 0: lapsed
}

// live reports whether the lease binds others: held (not released) and
// not lapsed.
func (r leaseRow) live() bool { return r.session != "" && r.left > 0 }

// readLease reads the lease row; ok is false when there is none (a fresh
// database, or one of a schema before leases: no lease binds).
func readLease(ctx context.Context, conn *pgx.Conn) (r leaseRow, ok bool, err error) {
	var leftMS int64
	err = conn.QueryRow(ctx, "SELECT holder, session, epoch, expires_at - "+dbNow+" FROM queen_lease WHERE id = 1").
		Scan(&r.holder, &r.session, &r.epoch, &leftMS)
	var pe *pgconn.PgError
	switch {
	case errors.Is(err, pgx.ErrNoRows), errors.As(err, &pe) && (pe.Code == "42P01" || pe.Code == "42703"): // no row, table or column yet
		return leaseRow{}, false, nil
	case err != nil:
		return leaseRow{}, false, fmt.Errorf("read the queen lease: %w", classifyPG(err))
	}
	r.left = time.Duration(leftMS) * time.Millisecond
	return r, true, nil
}

// endLapsed ends the sessions of a holder whose lease lapsed: those named
// by its session, and the one holding the advisory lock. It reports
// whether there was such a holder.
func (s *Store) endLapsed(ctx context.Context, conn *pgx.Conn) (bool, error) {
	r, ok, err := readLease(ctx, conn)
	if err != nil || !ok || r.session == "" || r.left > 0 {
		return false, err
	}
	var ended []int32
	err = conn.QueryRow(ctx, `SELECT coalesce(array_agg(pid) FILTER (WHERE pg_terminate_backend(pid)), '{}') FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid()
		AND (application_name = $1 OR pid IN (SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1
			AND ((classid::int8 << 32) | objid::int8) = $2::int8
			AND database = (SELECT oid FROM pg_database WHERE datname = current_database())))`,
		r.session, int64(pgLockKey)).Scan(&ended)
	if err != nil {
		return false, fmt.Errorf("end the sessions of %s, whose lease lapsed %s ago: %w", r.holder, -r.left.Round(time.Millisecond), classifyPG(err))
	}
	// pg_terminate_backend only signals a backend (its form that waits is
	// PostgreSQL 14's): wait, within lockWait, until they are gone.
	left := len(ended)
	for deadline := time.Now().Add(lockWait); left > 0 && time.Now().Before(deadline); {
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1)", ended).Scan(&left); err != nil {
			return false, fmt.Errorf("wait for the ended sessions of %s: %w", r.holder, classifyPG(err))
		}
		if left > 0 {
			select {
			case <-ctx.Done():
				return false, ctx.Err()
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	s.log.Warn("the active queen's lease lapsed: ended its sessions", "holder", r.holder, "epoch", r.epoch,
		"lapsed_for", -r.left.Round(time.Millisecond), "sessions", len(ended), "still_exiting", left)
	return true, nil
}

// takeLease raises the fencing epoch and takes the lease, on the lock's
// connection, which holds the advisory lock: from now on a write of any
// store with an older epoch fails (proveEpoch). It fails with ErrLocked
// when the lease is live (not lapsed, not released). The row is locked
// FOR UPDATE first: that waits for every write transaction of the old
// holder (they hold it FOR KEY SHARE).
func (s *Store) takeLease(ctx context.Context, holder string) error {
	if holder == "" {
		holder = fmt.Sprintf("backend pid %d", s.lock.pid)
	}
	l := s.lease
	sent := l.now()
	var epoch int64
	var held leaseRow
	err := pgx.BeginFunc(ctx, s.lock.conn, func(tx pgx.Tx) error {
		var leftMS int64
		err := tx.QueryRow(ctx, "SELECT holder, session, expires_at - "+dbNow+" FROM queen_lease WHERE id = 1 FOR UPDATE").
			Scan(&held.holder, &held.session, &leftMS)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		if held.left = time.Duration(leftMS) * time.Millisecond; held.live() {
			return ErrLocked
		}
		return tx.QueryRow(ctx, `INSERT INTO queen_lease (id, epoch, holder, taken_at, session, expires_at)
			VALUES (1, 1, $1, $2, $3, `+dbNow+` + $4)
			ON CONFLICT (id) DO UPDATE SET epoch = queen_lease.epoch + 1, holder = EXCLUDED.holder,
				taken_at = EXCLUDED.taken_at, session = EXCLUDED.session, expires_at = EXCLUDED.expires_at
			RETURNING epoch`, holder, time.Now().UnixMilli(), l.session, l.dur.Milliseconds()).Scan(&epoch)
	})
	switch {
	case errors.Is(err, ErrLocked):
		return fmt.Errorf("%w (%s holds the lease for %s more)", ErrLocked, held.holder, held.left.Round(time.Millisecond))
	case err != nil:
		return fmt.Errorf("take the queen lease: %w", classifyPG(err))
	}
	s.epoch = epoch
	l.renewed(sent)
	s.log.Info("fencing epoch taken", "epoch", epoch, "lease", l.dur, "renew", l.renew, "session", l.session)
	return nil
}

// renewLease extends the lease by LeaseDuration from the database's now,
// on the lock's connection. It fails when the lease is no longer this
// store's (another queen took it, or it lapsed first: a lapsed lease is
// never renewed, a standby may be taking it).
func (s *Store) renewLease(ctx context.Context) error {
	var epoch int64
	err := s.lock.conn.QueryRow(ctx, `UPDATE queen_lease SET expires_at = `+dbNow+` + $1
		WHERE id = 1 AND epoch = $2 AND session = $3 AND expires_at > `+dbNow+` RETURNING epoch`,
		s.lease.dur.Milliseconds(), s.epoch, s.lease.session).Scan(&epoch)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return errLeaseGone
	case err != nil:
		return fmt.Errorf("renew the lease on the lock's connection (backend pid %d): %w", s.lock.pid, err)
	}
	return nil
}

var errLeaseGone = errors.New("the lease is no longer this queen's: it lapsed, or another queen took it")

// keepLease renews the lease every renew interval until ctx ends, and
// checks the lock; when a renewal finds the lease gone, the lock's
// session ends, or no renewal succeeds before the holder's deadline, it
// marks the store lost (releasing the lease first when this queen's own
// session ended, so that a standby need not wait for it to lapse).
func (s *Store) keepLease(ctx context.Context) {
	l := s.lease
	t := time.NewTicker(l.renew)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		sent := l.now()
		rctx, cancel := context.WithTimeout(ctx, l.left())
		err := s.renewLease(rctx)
		if err == nil {
			l.renewed(sent)
			err = s.lock.check(rctx)
		}
		cancel()
		switch {
		case ctx.Err() != nil:
			return // Close cancelled the renewal
		case err == nil:
			continue
		case errors.Is(err, errLeaseGone):
			s.markLost(err)
			return
		case s.lock.conn.IsClosed() && l.left() > 0:
			// This queen's own session ended (terminated, the server
			// restarted, the network dropped it): stop acting, then
			// let the lease go.
			l.until.Store(0)
			s.releaseLease()
			s.markLost(err)
			return
		case l.left() <= 0:
			s.markLost(fmt.Errorf("no renewal of the lease succeeded within %s: %w", l.deadline, err))
			return
		}
		s.log.Warn("lease renewal failed; trying again", "err", err, "acting_for", l.left().Round(time.Millisecond))
	}
}

// releaseTimeout bounds giving the lease up.
const releaseTimeout = time.Second

// releaseLease gives the lease up (a standby takes it at once), through
// the pool: the lock's connection may be the one that broke. Nothing
// happens when another queen took it meanwhile.
func (s *Store) releaseLease() {
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	_, err := s.db.ExecContext(ctx, "UPDATE queen_lease SET session = '', expires_at = 0 WHERE id = 1 AND epoch = $1 AND session = $2",
		s.epoch, s.lease.session)
	if err != nil {
		s.log.Warn("cannot release the lease; a standby takes it when it lapses", "err", err)
	}
}

// Fence says whether this store may still act for the database: nil
// while it holds the lease by its own clock (always on SQLite), else why
// not (wrapping ErrLockLost). Every write checks it, and so must every
// effect outside the database (a command to a hive) right before it is
// made. A store whose deadline passed is marked lost here: a queen that
// wakes from a pause finds itself deposed at its first act.
func (s *Store) Fence() error {
	select {
	case <-s.lost:
		return s.lostErr
	default:
	}
	if s.lease == nil || s.epoch == 0 {
		return nil
	}
	if s.closed.Load() {
		return fmt.Errorf("%w: the store is closed", ErrLockLost)
	}
	if left := s.lease.left(); left <= 0 {
		s.markLost(fmt.Errorf("the lease ran out %s ago on this queen's clock (no renewal succeeded within %s)",
			-left.Round(time.Millisecond), s.lease.deadline))
		return s.lostErr
	}
	return nil
}

// LeaseSession is the application_name of this store's PostgreSQL
// connections ("" on SQLite).
func (s *Store) LeaseSession() string {
	if s.lease == nil {
		return ""
	}
	return s.lease.session
}

// withNetDefaults makes a dead network to PostgreSQL seen in seconds on
// both sides: TCP keepalives and a TCP user timeout (unacknowledged data
// for longer ends the connection) on the queen's connections, and the
// same asked of the server for its side (the parameters of the same
// names in the URL win). They do nothing on a unix socket. It names the
// connections with session (application_name).
func withNetDefaults(cfg *pgx.ConnConfig, userTimeout time.Duration, session string) {
	d := &net.Dialer{
		KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: time.Second, Interval: time.Second, Count: 3},
		Control: func(network, _ string, c syscall.RawConn) error {
			if !strings.HasPrefix(network, "tcp") {
				return nil
			}
			var serr error
			err := c.Control(func(fd uintptr) {
				serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(userTimeout.Milliseconds()))
			})
			return cmp.Or(err, serr)
		},
	}
	cfg.DialFunc = d.DialContext
	for name, v := range map[string]string{"tcp_keepalives_idle": "1", "tcp_keepalives_interval": "1", "tcp_keepalives_count": "3",
		"tcp_user_timeout": strconv.FormatInt(userTimeout.Milliseconds(), 10)} {
		if _, ok := cfg.RuntimeParams[name]; !ok {
			cfg.RuntimeParams[name] = v
		}
	}
	if session != "" {
		cfg.RuntimeParams["application_name"] = session
	}
}
