package store_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/store"
)

// The PostgreSQL timeouts are on by default, and the URL's parameters
// win.
func TestPostgresTimeoutsDefaultAndURLOverride(t *testing.T) {
	u := newPG(t)
	for _, tc := range []struct {
		name            string
		url             string
		statement, lock string
	}{
		{"defaults", u, "30s", "5s"},
		{"from the URL", withParams(t, u, "statement_timeout", "60s", "lock_timeout", "250"), "1min", "250ms"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := open(t, store.Config{URL: tc.url})
			for name, want := range map[string]string{"statement_timeout": tc.statement, "lock_timeout": tc.lock} {
				got, err := s.Setting(t.Context(), name)
				if err != nil || got != want {
					t.Errorf("%s = %q (%v), want %q", name, got, err, want)
				}
			}
			s.Close()
		})
	}
}

// A statement stuck behind another session's lock fails with ErrTimeout
// after lock_timeout, or statement_timeout when lock_timeout is off,
// instead of waiting for ever.
func TestHungStatementFailsWithTimeout(t *testing.T) {
	for _, tc := range []struct {
		name   string
		params []string
		says   string
	}{
		{"lock_timeout", []string{"lock_timeout", "300"}, "lock_timeout"},
		{"statement_timeout", []string{"lock_timeout", "0", "statement_timeout", "300"}, "statement_timeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := newPG(t)
			s := open(t, store.Config{URL: withParams(t, u, tc.params...)})
			// Another session holds the audit table.
			holder, err := admin(t, u).Conn(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			defer holder.Close()
			tx, err := holder.BeginTx(t.Context(), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			if _, err := tx.ExecContext(t.Context(), "LOCK TABLE audit_log IN ACCESS EXCLUSIVE MODE"); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(t.Context(), waitLimit)
			defer cancel()
			start := time.Now()
			_, err = appendEntry(ctx, s, "stuck")
			took := time.Since(start)
			if !errors.Is(err, store.ErrTimeout) {
				t.Fatalf("append behind a held lock: got %v after %s, want ErrTimeout", err, took)
			}
			mustContain(t, err, tc.says)
			if took > 3*time.Second {
				t.Errorf("append failed after %s; the timeout is 300ms", took)
			}
		})
	}
}

// Connecting to a server that accepts and never answers fails after
// DefaultConnectTimeout, without a deadline from the caller.
func TestConnectToSilentServerTimesOut(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 8)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c // held open, never answered
		}
	}()
	defer func() {
		ln.Close()
		for c := range accepted {
			c.Close()
		}
	}()
	start := time.Now()
	s, err := store.Open(context.Background(), store.Config{URL: "postgres://u@" + ln.Addr().String() + "/db?sslmode=disable"})
	took := time.Since(start)
	if err == nil {
		s.Close()
		t.Fatal("Open of a silent server succeeded")
	}
	if took < store.DefaultConnectTimeout-time.Second || took > store.DefaultConnectTimeout+3*time.Second {
		t.Errorf("Open failed after %s, want about %s: %v", took, store.DefaultConnectTimeout, err)
	}
	mustContain(t, err, "cannot connect to PostgreSQL at "+ln.Addr().String()+" (user u, database db): no answer within 5s (connect_timeout)")
}

// When the network to PostgreSQL stops passing bytes (no answer, no
// reset, so the server's own timeouts never fire) a transaction fails on
// the client side after twice the statement timeout.
func TestStalledNetworkFailsTheTransaction(t *testing.T) {
	u := newPG(t)
	proxy, pu := newRelay(t, u)
	// 1 s (a client-side limit of 2 s): with 300 ms, the migrations at
	// open once ran past their 600 ms under make test's two runs.
	s := open(t, store.Config{URL: withParams(t, pu, "statement_timeout", "1000")})
	if _, err := appendEntry(t.Context(), s, "before"); err != nil {
		t.Fatal(err)
	}
	proxy.Freeze()
	start := time.Now()
	_, err := appendEntry(t.Context(), s, "stalled")
	took := time.Since(start)
	proxy.Thaw()
	if !errors.Is(err, store.ErrTimeout) {
		t.Fatalf("append over a stalled network: got %v after %s, want ErrTimeout", err, took)
	}
	if took > 5*time.Second {
		t.Errorf("append failed after %s; the limit is 2s", took)
	}
	if _, err := appendEntry(t.Context(), s, "after"); err != nil {
		t.Errorf("append once the network is back: %v", err)
	}
}
