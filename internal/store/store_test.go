package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/apiary-llm/apiary/internal/lifecycle"
	"github.com/apiary-llm/apiary/internal/store"
	"github.com/apiary-llm/apiary/internal/store/pgtest"
)

var pg *pgtest.Cluster

func TestMain(m *testing.M) {
	var err error
	pg, err = pgtest.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: the PostgreSQL half of the store tests needs a throwaway cluster:", err)
		os.Exit(1)
	}
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		if err := pg.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
		os.Exit(code)
	}))
}

// backend opens fresh databases of one kind; the same database again with
// reopen.
type backend struct {
	name string
	cfg  func(t *testing.T) store.Config
}

var backends = []backend{
	{"sqlite", func(t *testing.T) store.Config {
		return store.Config{Path: filepath.Join(t.TempDir(), store.SQLiteFile)}
	}},
	{"postgres", func(t *testing.T) store.Config {
		url, err := pg.NewDatabase(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		return store.Config{URL: url}
	}},
}

// eachBackend runs fn once per database, with a config of a fresh one.
func eachBackend(t *testing.T, fn func(t *testing.T, cfg store.Config)) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) { fn(t, b.cfg(t)) })
	}
}

func open(t *testing.T, cfg store.Config) *store.Store {
	t.Helper()
	s, err := store.Open(t.Context(), cfg)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func at(sec int) time.Time { return time.Date(2025, 1, 2, 3, 4, sec, 123456000, time.UTC) }

func ptr[T any](v T) *T { return &v }

func TestPoolsRoundTrip(t *testing.T) {
	eachBackend(t, func(t *testing.T, cfg store.Config) {
		s := open(t, cfg)
		ctx := t.Context()
		p := store.Pool{ID: "node-a", Endpoint: "http://127.0.0.1:9200", NodeID: "a", Version: "1",
			Status: "healthy", RegisteredAt: at(1), StatusChangedAt: at(1),
			GPUs: json.RawMessage(`[{"id":0}]`), Workers: json.RawMessage(`[]`), Instance: "hive-1"}
		if err := s.Update(ctx, func(tx *store.Tx) error { return tx.PutPool(p) }); err != nil {
			t.Fatal(err)
		}
		// The holder's instance is kept, and replaced with the rest.
		p.Status, p.Drained, p.LastHeartbeatAt = "draining", true, ptr(at(5))
		p.Endpoint, p.Instance = "http://127.0.0.1:9300", "hive-2"
		if err := s.Update(ctx, func(tx *store.Tx) error { return tx.PutPool(p) }); err != nil {
			t.Fatal(err)
		}
		var got []store.Pool
		if err := s.View(ctx, func(tx *store.Tx) (err error) { got, err = tx.Pools(); return }); err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff([]store.Pool{p}, got); diff != "" {
			t.Errorf("pools (-want +got):\n%s", diff)
		}
		// A heartbeat flush sets the last beat, devices and workers, and
		// leaves the rest; a pool gone meanwhile is skipped.
		beat := p
		beat.LastHeartbeatAt, beat.GPUs, beat.Workers = ptr(at(9)), json.RawMessage(`[{"id":1}]`), json.RawMessage(`[{"worker_id":"w1"}]`)
		beat.Status, beat.Endpoint = "ignored", "http://ignored:1"
		if err := s.Update(ctx, func(tx *store.Tx) error { return tx.TouchPools([]store.Pool{{ID: "gone"}, beat}) }); err != nil {
			t.Fatal(err)
		}
		p.LastHeartbeatAt, p.GPUs, p.Workers = beat.LastHeartbeatAt, beat.GPUs, beat.Workers
		if err := s.View(ctx, func(tx *store.Tx) (err error) { got, err = tx.Pools(); return }); err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff([]store.Pool{p}, got); diff != "" {
			t.Errorf("pools after TouchPools (-want +got):\n%s", diff)
		}
		err := s.Update(ctx, func(tx *store.Tx) error { return tx.DeletePool("node-a") })
		if err != nil {
			t.Fatal(err)
		}
		err = s.Update(ctx, func(tx *store.Tx) error { return tx.DeletePool("node-a") })
		if !errors.Is(err, store.ErrNotFound) {
			t.Errorf("second delete: got %v, want ErrNotFound", err)
		}
		err = s.View(ctx, func(tx *store.Tx) error { _, err := tx.Pool("node-a"); return err })
		if !errors.Is(err, store.ErrNotFound) {
			t.Errorf("read deleted pool: got %v, want ErrNotFound", err)
		}
	})
}

func TestRowsRoundTripAndFilters(t *testing.T) {
	eachBackend(t, func(t *testing.T, cfg store.Config) {
		s := open(t, cfg)
		ctx := t.Context()
		rows := []store.Row{
			{ID: "wk-1", PoolID: "p1", ModelRef: "tiny", Status: lifecycle.StatusStarting, Owner: "operator", CreatedAt: at(1)},
			{ID: "wk-2", PoolID: "p1", WorkerID: "w-2", ModelRef: "tiny", GPUDevice: ptr(0), Status: lifecycle.StatusRunning,
				Reason: "ready", Owner: "queen", CreatedAt: at(2), StartedAt: ptr(at(2)), ReadyAt: ptr(at(3)),
				LastHeartbeatAt: ptr(at(4)), VRAMBytes: 1 << 40, URI: "http://127.0.0.1:8001", PID: ptr(4242)},
			{ID: "wk-3", PoolID: "p2", WorkerID: "w-3", ModelRef: "big", GPUDevice: ptr(1), Status: lifecycle.StatusFailed,
				Reason: "exit status 3", Owner: "queen", CreatedAt: at(3), StoppedAt: ptr(at(9)), ExitCode: ptr(3)},
		}
		err := s.Update(ctx, func(tx *store.Tx) error {
			for _, r := range rows {
				if err := tx.InsertRow(r); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		err = s.Update(ctx, func(tx *store.Tx) error { return tx.InsertRow(rows[0]) })
		if !errors.Is(err, store.ErrExists) {
			t.Errorf("duplicate insert: got %v, want ErrExists", err)
		}
		read := func(f store.RowFilter) []store.Row {
			t.Helper()
			var got []store.Row
			if err := s.View(ctx, func(tx *store.Tx) (err error) { got, err = tx.Rows(f); return }); err != nil {
				t.Fatal(err)
			}
			return got
		}
		for _, tc := range []struct {
			name string
			f    store.RowFilter
			want []store.Row
		}{
			{"all newest first", store.RowFilter{}, []store.Row{rows[2], rows[1], rows[0]}},
			{"by status", store.RowFilter{Statuses: []lifecycle.Status{lifecycle.StatusStarting, lifecycle.StatusRunning}}, []store.Row{rows[1], rows[0]}},
			{"by model", store.RowFilter{ModelRef: "big"}, []store.Row{rows[2]}},
			{"by pool", store.RowFilter{PoolID: "p1"}, []store.Row{rows[1], rows[0]}},
			{"limit", store.RowFilter{Limit: 1}, []store.Row{rows[2]}},
		} {
			if diff := cmp.Diff(tc.want, read(tc.f)); diff != "" {
				t.Errorf("%s (-want +got):\n%s", tc.name, diff)
			}
		}
		up := rows[0]
		up.Status, up.WorkerID, up.StartedAt = lifecycle.StatusRunning, "w-1", ptr(at(7))
		if err := s.Update(ctx, func(tx *store.Tx) error { return tx.UpdateRow(up) }); err != nil {
			t.Fatal(err)
		}
		if err := s.Update(ctx, func(tx *store.Tx) error {
			return tx.TouchRows(map[string]time.Time{"wk-1": at(8)})
		}); err != nil {
			t.Fatal(err)
		}
		up.LastHeartbeatAt = ptr(at(8))
		var got store.Row
		if err := s.View(ctx, func(tx *store.Tx) (err error) { got, err = tx.Row("wk-1"); return }); err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(up, got); diff != "" {
			t.Errorf("updated row (-want +got):\n%s", diff)
		}
		err = s.Update(ctx, func(tx *store.Tx) error { return tx.UpdateRow(store.Row{ID: "wk-none", CreatedAt: at(1)}) })
		if !errors.Is(err, store.ErrNotFound) {
			t.Errorf("update of a missing row: got %v, want ErrNotFound", err)
		}
		var counts map[lifecycle.Status]int
		if err := s.View(ctx, func(tx *store.Tx) (err error) { counts, err = tx.CountRows(); return }); err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(map[lifecycle.Status]int{lifecycle.StatusRunning: 2, lifecycle.StatusFailed: 1}, counts); diff != "" {
			t.Errorf("counts (-want +got):\n%s", diff)
		}
	})
}

func TestAuditNewestFirstAndSurvivesReopen(t *testing.T) {
	eachBackend(t, func(t *testing.T, cfg store.Config) {
		ctx := t.Context()
		s, err := store.Open(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		var first []store.AuditEntry
		for i := range 3 {
			err := s.Update(ctx, func(tx *store.Tx) error {
				e, err := tx.Append(store.AuditEntry{TS: at(i), Actor: "admin", Action: "worker.start",
					Target: fmt.Sprintf("wk-%d", i), Reason: "test", Metadata: map[string]any{"n": float64(i)}})
				first = append(first, e)
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
		}
		s.Close()
		s = open(t, cfg)
		var e store.AuditEntry
		if err := s.Update(ctx, func(tx *store.Tx) (err error) {
			e, err = tx.Append(store.AuditEntry{TS: at(10), Actor: "queen", Action: "pool.unhealthy", Target: "p1"})
			return
		}); err != nil {
			t.Fatal(err)
		}
		if e.ID != first[2].ID+1 {
			t.Errorf("id after reopen = %d, want %d", e.ID, first[2].ID+1)
		}
		var got []store.AuditEntry
		if err := s.View(ctx, func(tx *store.Tx) (err error) {
			got, err = tx.Audit(store.AuditFilter{Since: at(1), Limit: 2})
			return
		}); err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff([]store.AuditEntry{e, first[2]}, got); diff != "" {
			t.Errorf("audit (-want +got):\n%s", diff)
		}
		if err := s.View(ctx, func(tx *store.Tx) (err error) {
			got, err = tx.Audit(store.AuditFilter{Target: "wk-1"})
			return
		}); err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff([]store.AuditEntry{first[1]}, got); diff != "" {
			t.Errorf("audit by target (-want +got):\n%s", diff)
		}
	})
}

// A failed Update writes nothing: a row and its audit entry go together.
func TestFailedUpdateWritesNothing(t *testing.T) {
	eachBackend(t, func(t *testing.T, cfg store.Config) {
		s := open(t, cfg)
		ctx := t.Context()
		boom := errors.New("boom")
		err := s.Update(ctx, func(tx *store.Tx) error {
			if err := tx.InsertRow(store.Row{ID: "wk-x", PoolID: "p", ModelRef: "m", Status: lifecycle.StatusStarting, Owner: "queen", CreatedAt: at(1)}); err != nil {
				return err
			}
			if _, err := tx.Append(store.AuditEntry{Actor: "queen", Action: "worker.start", Target: "wk-x"}); err != nil {
				return err
			}
			return boom
		})
		if !errors.Is(err, boom) {
			t.Fatalf("got %v, want boom", err)
		}
		err = s.View(ctx, func(tx *store.Tx) error {
			rows, err := tx.Rows(store.RowFilter{})
			if err != nil {
				return err
			}
			entries, err := tx.Audit(store.AuditFilter{})
			if len(rows) != 0 || len(entries) != 0 {
				t.Errorf("after a failed update: %d rows, %d audit entries; want none", len(rows), len(entries))
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	})
}

func TestSecondOwnerIsRefused(t *testing.T) {
	eachBackend(t, func(t *testing.T, cfg store.Config) {
		s, err := store.Open(t.Context(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := store.Open(t.Context(), cfg); !errors.Is(err, store.ErrLocked) {
			t.Errorf("second open: got %v, want ErrLocked", err)
		}
		s.Close()
		open(t, cfg) // the lock is free again
	})
}

func TestNodes(t *testing.T) {
	eachBackend(t, func(t *testing.T, cfg store.Config) {
		s := open(t, cfg)
		ctx := t.Context()
		n := store.Node{Name: "gpu1", SSHTarget: "me@gpu1:22", InstallDir: "~/.local/bin", CreatedAt: at(1), Metadata: json.RawMessage(`{}`)}
		if err := s.Update(ctx, func(tx *store.Tx) error { return tx.InsertNode(n) }); err != nil {
			t.Fatal(err)
		}
		if err := s.Update(ctx, func(tx *store.Tx) error { return tx.InsertNode(n) }); !errors.Is(err, store.ErrExists) {
			t.Errorf("duplicate node: got %v, want ErrExists", err)
		}
		var got []store.Node
		if err := s.View(ctx, func(tx *store.Tx) (err error) { got, err = tx.Nodes(); return }); err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff([]store.Node{n}, got); diff != "" {
			t.Errorf("nodes (-want +got):\n%s", diff)
		}
		if err := s.Update(ctx, func(tx *store.Tx) error { return tx.DeleteNode("gpu1") }); err != nil {
			t.Fatal(err)
		}
		if err := s.Update(ctx, func(tx *store.Tx) error { return tx.DeleteNode("gpu1") }); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("second delete: got %v, want ErrNotFound", err)
		}
	})
}

// Writers in parallel all land (SQLite: busy timeout and immediate
// transactions instead of "database is locked").
func TestConcurrentWriters(t *testing.T) {
	eachBackend(t, func(t *testing.T, cfg store.Config) {
		s := open(t, cfg)
		ctx := context.Background()
		const writers, each = 8, 40
		var wg sync.WaitGroup
		errs := make(chan error, writers*each)
		for w := range writers {
			wg.Go(func() {
				for i := range each {
					errs <- s.Update(ctx, func(tx *store.Tx) error {
						id := fmt.Sprintf("wk-%d-%d", w, i)
						if err := tx.InsertRow(store.Row{ID: id, PoolID: "p", ModelRef: "m", Status: lifecycle.StatusStarting, Owner: "queen", CreatedAt: time.Now()}); err != nil {
							return err
						}
						_, err := tx.Append(store.AuditEntry{Actor: "queen", Action: "worker.start", Target: id})
						return err
					})
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		var n int
		if err := s.View(ctx, func(tx *store.Tx) error {
			es, err := tx.Audit(store.AuditFilter{})
			n = len(es)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if n != writers*each {
			t.Errorf("%d audit entries, want %d", n, writers*each)
		}
	})
}

// A writer beside another's back-to-back transactions (a batch's jobs
// written a chunk at a time) gets its turn after the one under way, not
// after the whole run: SQLite's busy handler, polling with sleeps that
// grow to 100 ms, missed every gap between them.
func TestSQLiteWriterGetsInBetweenBackToBackTransactions(t *testing.T) {
	s := open(t, backends[0].cfg(t))
	ctx := context.Background()
	stop := make(chan struct{})
	var hog sync.WaitGroup
	hog.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if err := s.Update(ctx, func(tx *store.Tx) error {
				time.Sleep(10 * time.Millisecond) // a chunk's inserts
				_, err := tx.Append(store.AuditEntry{Actor: "queen", Action: "test.chunk", Target: fmt.Sprint(i)})
				return err
			}); err != nil {
				t.Error(err)
				return
			}
		}
	})
	defer hog.Wait()
	defer close(stop)
	time.Sleep(30 * time.Millisecond)
	var slowest time.Duration
	for i := range 10 {
		at := time.Now()
		if err := s.Update(ctx, func(tx *store.Tx) error {
			_, err := tx.Append(store.AuditEntry{Actor: "admin", Action: "test.write", Target: fmt.Sprint(i)})
			return err
		}); err != nil {
			t.Fatal(err)
		}
		slowest = max(slowest, time.Since(at))
	}
	t.Logf("the slowest of 10 writes beside back-to-back 10 ms transactions waited %s", slowest)
	if slowest > 300*time.Millisecond {
		t.Errorf("a write beside back-to-back transactions waited %s", slowest)
	}
}

func TestMigrationsAreRecorded(t *testing.T) {
	eachBackend(t, func(t *testing.T, cfg store.Config) {
		open(t, cfg).Close()
		open(t, cfg) // a second open applies nothing and does not fail
		if store.Version() < 1 {
			t.Fatalf("Version() = %d", store.Version())
		}
	})
}

func TestOpenRefusesAnotherURLScheme(t *testing.T) {
	_, err := store.Open(t.Context(), store.Config{URL: "mysql://x"})
	if err == nil {
		t.Fatal("mysql URL accepted")
	}
}

// A model's setting is written, replaced (max back to none), and read
// again after the store is reopened.
func TestModelSettingsRoundTripAndSurviveReopen(t *testing.T) {
	eachBackend(t, func(t *testing.T, cfg store.Config) {
		s := open(t, cfg)
		ctx := t.Context()
		put := func(ms store.ModelSetting) {
			t.Helper()
			if err := s.Update(ctx, func(tx *store.Tx) error { return tx.PutModelSetting(ms) }); err != nil {
				t.Fatal(err)
			}
		}
		read := func(s *store.Store) []store.ModelSetting {
			t.Helper()
			var got []store.ModelSetting
			if err := s.View(ctx, func(tx *store.Tx) (err error) { got, err = tx.ModelSettings(); return }); err != nil {
				t.Fatal(err)
			}
			return got
		}
		if got := read(s); len(got) != 0 {
			t.Fatalf("settings of a fresh store: %+v", got)
		}
		tiny := store.ModelSetting{ModelRef: "tiny", MinWorkers: 1, MaxWorkers: ptr(3), Reason: "keep one warm", UpdatedAt: at(1)}
		big := store.ModelSetting{ModelRef: "big", MinWorkers: 2, Reason: "two", UpdatedAt: at(2)}
		put(tiny)
		put(big)
		tiny = store.ModelSetting{ModelRef: "tiny", MinWorkers: 0, Reason: "scale down", UpdatedAt: at(3)}
		put(tiny)
		want := []store.ModelSetting{big, tiny}
		if diff := cmp.Diff(want, read(s)); diff != "" {
			t.Errorf("settings (-want +got):\n%s", diff)
		}
		s.Close()
		if diff := cmp.Diff(want, read(open(t, cfg))); diff != "" {
			t.Errorf("settings after reopen (-want +got):\n%s", diff)
		}
	})
}
