package store_test

import (
	"bytes"
	"errors"
	"log/slog"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/apiary-llm/apiary/internal/lifecycle"
	"github.com/apiary-llm/apiary/internal/store"
	"github.com/apiary-llm/apiary/internal/testbin"
)

// seedAged writes rows and audit entries of every age and status; the
// ids of what a 720h retention keeps are kept*.
func seedAged(t *testing.T, s *store.Store, now time.Time) (keptRows []string, keptAudit []string) {
	t.Helper()
	old, recent := now.Add(-800*time.Hour), now.Add(-time.Hour)
	rows := []store.Row{
		{ID: "wk-old-stopped", Status: lifecycle.StatusStopped, CreatedAt: old, StoppedAt: ptr(old)},
		{ID: "wk-old-failed-never-stopped", Status: lifecycle.StatusFailed, CreatedAt: old},
		{ID: "wk-ended-recently", Status: lifecycle.StatusStopped, CreatedAt: old, StoppedAt: ptr(recent)},
		{ID: "wk-recent-failed", Status: lifecycle.StatusFailed, CreatedAt: recent},
		{ID: "wk-old-running", Status: lifecycle.StatusRunning, CreatedAt: old},
		{ID: "wk-old-starting", Status: lifecycle.StatusStarting, CreatedAt: old},
		{ID: "wk-old-draining", Status: lifecycle.StatusDraining, CreatedAt: old},
	}
	err := s.Update(t.Context(), func(tx *store.Tx) error {
		for _, r := range rows {
			r.PoolID, r.ModelRef, r.Owner = "p", "m", "queen"
			if err := tx.InsertRow(r); err != nil {
				return err
			}
		}
		for i, ts := range []time.Time{old, old.Add(time.Second), recent, now, old.Add(2 * time.Second)} {
			target := "old"
			if ts.After(now.Add(-720 * time.Hour)) {
				target = "recent"
			}
			if _, err := tx.Append(store.AuditEntry{TS: ts, Actor: "queen", Action: "test", Target: target, Reason: string(rune('a' + i))}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return []string{"wk-ended-recently", "wk-old-draining", "wk-old-running", "wk-old-starting", "wk-recent-failed"}, []string{"recent", "recent"}
}

// left is what the store holds: row ids (sorted) and audit targets.
func left(t *testing.T, s *store.Store) (rows []string, audit []string) {
	t.Helper()
	err := s.View(t.Context(), func(tx *store.Tx) error {
		rs, err := tx.Rows(store.RowFilter{})
		if err != nil {
			return err
		}
		for _, r := range rs {
			rows = append(rows, r.ID)
		}
		es, err := tx.Audit(store.AuditFilter{})
		for _, e := range es {
			audit = append(audit, e.Target)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(rows)
	return rows, audit
}

// Prune removes old audit entries and rows that ended long ago; recent
// entries, recently ended rows and live rows (however old) stay.
func TestPruneRemovesOldEndedRowsAndAuditKeepsLiveRows(t *testing.T) {
	eachBackend(t, func(t *testing.T, cfg store.Config) {
		s := open(t, cfg)
		now := time.Now()
		wantRows, wantAudit := seedAged(t, s, now)
		if p, err := s.Prune(t.Context(), time.Time{}, time.Time{}); err != nil || p != (store.Pruned{}) {
			t.Errorf("prune with no cutoffs: %+v %v, want nothing removed", p, err)
		}
		cutoff := now.Add(-720 * time.Hour)
		p, err := s.Prune(t.Context(), cutoff, cutoff)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(store.Pruned{Audit: 3, Rows: 2}, p); diff != "" {
			t.Errorf("pruned (-want +got):\n%s", diff)
		}
		rows, audit := left(t, s)
		if diff := cmp.Diff(wantRows, rows); diff != "" {
			t.Errorf("rows left (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff(wantAudit, audit); diff != "" {
			t.Errorf("audit left (-want +got):\n%s", diff)
		}
		if p, err := s.Prune(t.Context(), cutoff, cutoff); err != nil || p != (store.Pruned{}) {
			t.Errorf("second prune: %+v %v, want nothing removed", p, err)
		}
	})
}

// A backlog larger than one batch is removed in several bounded
// transactions, all of it.
func TestPruneRemovesABacklogInBatches(t *testing.T) {
	eachBackend(t, func(t *testing.T, cfg store.Config) {
		s := open(t, cfg)
		const n = 2*1000 + 7
		old := time.Now().Add(-800 * time.Hour)
		err := s.Update(t.Context(), func(tx *store.Tx) error {
			for i := range n {
				if _, err := tx.Append(store.AuditEntry{TS: old.Add(time.Duration(i) * time.Millisecond), Actor: "queen", Action: "test", Target: "old"}); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		p, err := s.Prune(t.Context(), time.Now().Add(-720*time.Hour), time.Time{})
		if err != nil || p.Audit != n {
			t.Errorf("prune of %d old entries: %+v %v", n, p, err)
		}
	})
}

// lineWriter feeds a JSON log handler's lines to a testbin.Lines.
type lineWriter struct {
	mu    sync.Mutex
	lines *testbin.Lines
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for l := range bytes.Lines(p) {
		w.lines.Add(string(bytes.TrimSuffix(l, []byte("\n"))))
	}
	return len(p), nil
}

// A store opened with a retention prunes once at start, in the background,
// and logs how many it removed.
func TestRetentionPrunesAtOpenAndLogsCounts(t *testing.T) {
	eachBackend(t, func(t *testing.T, cfg store.Config) {
		s := open(t, cfg)
		wantRows, wantAudit := seedAged(t, s, time.Now())
		s.Close()

		lines := testbin.NewLines()
		cfg.Logger = slog.New(slog.NewJSONHandler(&lineWriter{lines: lines}, nil))
		cfg.Retention = store.Retention{Audit: 720 * time.Hour, Rows: 720 * time.Hour}
		s = open(t, cfg)
		lines.Wait(t, 0, "pruned", map[string]string{"audit_removed": "3", "rows_removed": "2"})
		rows, audit := left(t, s)
		if diff := cmp.Diff(wantRows, rows); diff != "" {
			t.Errorf("rows left (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff(wantAudit, audit); diff != "" {
			t.Errorf("audit left (-want +got):\n%s", diff)
		}
	})
}

// Kept responses of the Responses API: read back as written, deleted
// once, pruned with the rows' cutoff (an old one goes, a new one stays).
func TestResponsesKeptAndPruned(t *testing.T) {
	eachBackend(t, func(t *testing.T, cfg store.Config) {
		s := open(t, cfg)
		now := time.Now()
		old := store.StoredResponse{ID: "resp_old", CreatedAt: now.Add(-1000 * time.Hour), Response: []byte(`{"id":"resp_old"}`), Messages: []byte(`[]`)}
		recent := store.StoredResponse{ID: "resp_new", CreatedAt: now, Response: []byte(`{"id":"resp_new"}`), Messages: []byte(`[{"role":"user","content":"hi"}]`)}
		for _, r := range []store.StoredResponse{old, recent} {
			if err := s.PutResponse(t.Context(), r); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.PutResponse(t.Context(), recent); err == nil {
			t.Errorf("a second response with a taken id was kept")
		}
		got, err := s.Response(t.Context(), "resp_new")
		if err != nil || string(got.Response) != string(recent.Response) || string(got.Messages) != string(recent.Messages) ||
			got.CreatedAt.UnixMicro() != recent.CreatedAt.UnixMicro() {
			t.Errorf("read back %+v %v", got, err)
		}
		p, err := s.Prune(t.Context(), time.Time{}, now.Add(-720*time.Hour))
		if err != nil || p.Responses != 1 {
			t.Errorf("prune: %+v %v, want the old response removed", p, err)
		}
		if _, err := s.Response(t.Context(), "resp_old"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("the pruned response: %v", err)
		}
		if err := s.DeleteResponse(t.Context(), "resp_new"); err != nil {
			t.Fatal(err)
		}
		if err := s.DeleteResponse(t.Context(), "resp_new"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("a second delete: %v", err)
		}
	})
}
