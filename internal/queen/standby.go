package queen

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/openai"
	"github.com/apiary-llm/apiary/internal/store"
	"github.com/apiary-llm/apiary/internal/version"
)

// Several queens on one PostgreSQL database: the one that holds the
// database's lock is active; the others stand by (Config.Standby). A
// standby serves only a refusal on the queen's address — /health 503
// {"status":"standby","active":URL}, every other path 503 with
// Retry-After and the active's advertised URL — so that a load balancer
// sends clients to the active, and tries the lock every StandbyPoll. When
// the active's lease ends — released when it stops, or lapsed on the
// database's clock when it died, froze or lost the database (the standby
// then ends the sessions it left, store/lease.go) — the standby takes
// the lock and the lease, raises the fencing epoch and starts as any
// queen does: pools, rows and settings from the store, workers' tokens
// from their hives.

// StandbyPoll is how often a standby tries to take the database.
const StandbyPoll = 500 * time.Millisecond

// standbyRetryAfter is the Retry-After a standby answers (seconds).
const standbyRetryAfter = 1

// standBy serves the standby's refusal on the queen's address until the
// database's lock is this queen's, and returns the store it opened. It
// tries every StandbyPoll (or the lease's renew interval when shorter).
func (q *Queen) standBy(ctx context.Context, scfg store.Config) (*store.Store, error) {
	ln, err := net.Listen("tcp", q.cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", q.cfg.Addr, err)
	}
	addr := ln.Addr()
	if ln, err = q.cfg.TLS.Listen(ln); err != nil {
		return nil, err
	}
	var active atomic.Pointer[string]
	none := ""
	active.Store(&none)
	srv := &http.Server{Handler: standbyHandler(&active), ReadHeaderTimeout: 10 * time.Second,
		ErrorLog: slog.NewLogLogger(q.log.Handler(), slog.LevelWarn)}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	logged := ""
	t := time.NewTicker(min(StandbyPoll, q.cfg.LeaseRenew))
	defer t.Stop()
	for {
		if holder, epoch, err := store.ActiveHolder(ctx, scfg.URL); err == nil && holder != logged {
			active.Store(&holder)
			q.log.Info("queen standing by: another queen holds the database", "addr", addr.String(), "active", holder, "epoch", epoch)
			logged = holder
		}
		st, err := store.Open(ctx, scfg)
		if err == nil {
			return st, nil
		}
		if !errors.Is(err, store.ErrLocked) {
			q.log.Warn("standby cannot reach the database; trying again", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		case <-t.C:
		}
	}
}

// unlessSteppedDown serves h until the queen steps down (it lost the
// database's lock), then the standby's refusal: a queen that can write
// nothing must not take heartbeats, events or requests while it stops
// the hives it started (which may take their stop timeout), or hives that
// follow the queens (--queen URL1,URL2) stay with it, and the new active,
// hearing nothing from their pools, writes their workers off as lost and
// stops them when the hives come. Refused, they move to the next queen at
// once, and a load balancer takes this one out.
func (q *Queen) unlessSteppedDown(h http.Handler) http.Handler {
	var nobody atomic.Pointer[string]
	unknown := ""
	nobody.Store(&unknown)
	refuse := standbyHandler(&nobody)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if q.deposed() {
			refuse.ServeHTTP(w, r)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// deposed reports whether the queen must no longer act: it stepped
// down, or its lease ran out on its own clock (a queen that wakes from a
// pause finds it so before it serves one more request; its store marks
// itself lost, and the queen steps down).
func (q *Queen) deposed() bool {
	return q.steppedDown.Load() || q.st != nil && q.st.Fence() != nil
}

// standbyHandler answers every request of a standby queen.
func standbyHandler(active *atomic.Pointer[string]) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a := *active.Load()
		if a != "" {
			w.Header().Set(api.ActiveQueenHeader, a)
		}
		w.Header().Set("Retry-After", strconv.Itoa(standbyRetryAfter))
		switch {
		case r.URL.Path == "/health":
			api.WriteJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "standby", "active": a})
			return
		case r.URL.Path == "/health/live" && r.Method == http.MethodGet:
			api.WriteJSON(w, http.StatusOK, api.Liveness{Status: "live", Role: "standby", Active: a, Version: version.Version})
			return
		}
		msg := "this queen is a standby: another queen holds the database"
		if a != "" {
			msg += "; the active queen is " + a
		}
		openai.WriteError(w, &openai.Error{Status: http.StatusServiceUnavailable, Code: "standby", Type: "server_error", Message: msg})
	})
}
