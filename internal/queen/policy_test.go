package queen

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/lifecycle"
	"github.com/apiary-llm/apiary/internal/store"
)

func TestReconcile(t *testing.T) {
	reg := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	before, after := reg.Add(-time.Minute), reg.Add(time.Minute)
	row := func(id, workerID string, s lifecycle.Status, created time.Time) store.Row {
		return store.Row{ID: id, PoolID: "p", WorkerID: workerID, ModelRef: "tiny", Status: s, CreatedAt: created}
	}
	w := func(id, lid, status string) api.Worker {
		return api.Worker{WorkerID: id, LifecycleID: lid, ModelRef: "tiny", Status: status}
	}
	for _, tc := range []struct {
		name string
		in   reconcileInput
		want reconcilePlan
	}{
		{
			name: "adopt by lifecycle id, sync status",
			in:   reconcileInput{Rows: []store.Row{row("wk-1", "", rowStarting, before)}, Workers: []api.Worker{w("w1", "wk-1", "ready")}},
			want: reconcilePlan{Seen: []string{"wk-1"}, Sync: []rowSync{{ID: "wk-1", Worker: w("w1", "wk-1", "ready"), To: rowRunning}}, Misses: map[string]int{}},
		},
		{
			name: "adopt by worker id, nothing to change",
			in: reconcileInput{Rows: []store.Row{{ID: "wk-1", PoolID: "p", WorkerID: "w1", ModelRef: "tiny", Status: rowRunning, GPUDevice: new(int)}},
				Workers: []api.Worker{w("w1", "", "busy")}},
			want: reconcilePlan{Seen: []string{"wk-1"}, Misses: map[string]int{}},
		},
		{
			name: "draining row with a worker still serving is no news",
			in: reconcileInput{Rows: []store.Row{{ID: "wk-1", PoolID: "p", WorkerID: "w1", ModelRef: "tiny", Status: rowDraining, GPUDevice: new(int)}},
				Workers: []api.Worker{w("w1", "wk-1", "ready")}},
			want: reconcilePlan{Seen: []string{"wk-1"}, Misses: map[string]int{}},
		},
		{
			name: "full inventory loses old rows at once",
			in: reconcileInput{FullInventory: true, RegisteredAt: reg,
				Rows: []store.Row{row("wk-old", "w1", rowRunning, before), row("wk-new", "w2", rowStarting, after)}},
			want: reconcilePlan{Lost: []lostRow{{ID: "wk-old", Reason: "lost: the hive's inventory after it registered does not have this worker"}},
				Misses: map[string]int{"wk-new": 1}},
		},
		{
			name: "second miss loses the row",
			in:   reconcileInput{Rows: []store.Row{row("wk-1", "w1", rowRunning, before)}, Misses: map[string]int{"wk-1": 1}},
			want: reconcilePlan{Lost: []lostRow{{ID: "wk-1", Reason: "lost: missing from 2 heartbeats in a row"}}, Misses: map[string]int{}},
		},
		{
			name: "start not answered yet waits",
			in:   reconcileInput{Rows: []store.Row{row("wk-1", "", rowStarting, after)}, Misses: map[string]int{"wk-1": 5}},
			want: reconcilePlan{Misses: map[string]int{}},
		},
		{
			name: "unknown live workers, ended ones ignored",
			in:   reconcileInput{Workers: []api.Worker{w("w1", "", "ready"), w("w2", "wk-gone", "starting"), w("w3", "", "stopped")}},
			want: reconcilePlan{Unknown: []unknownWorker{{Worker: w("w1", "", "ready"), Why: "no lifecycle row"},
				{Worker: w("w2", "wk-gone", "starting"), Why: "lifecycle row wk-gone is not live"}}, Misses: map[string]int{}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := reconcile(tc.in)
			if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(rowSync{}, lostRow{}, unknownWorker{}, reconcilePlan{}), cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("plan (-want +got):\n%s", diff)
			}
		})
	}
}

// TestReconcileManyRows: a pool with more rows than rowFinder scans finds
// them through its maps, by lifecycle id and by worker id alike.
func TestReconcileManyRows(t *testing.T) {
	var in reconcileInput
	for i := range 3 * rowFinderScan {
		id, wid := fmt.Sprintf("wk-%02d", i), fmt.Sprintf("w%02d", i)
		gpu := 0
		in.Rows = append(in.Rows, store.Row{ID: id, PoolID: "p", WorkerID: wid, ModelRef: "tiny", Status: rowRunning, GPUDevice: &gpu})
		w := api.Worker{WorkerID: wid, ModelRef: "tiny", Status: "ready"}
		if i%2 == 0 {
			w.LifecycleID = id
		}
		if i == 7 {
			w.PID = 42 // new: the row takes it
		}
		if i != 9 {
			in.Workers = append(in.Workers, w)
		}
	}
	got := reconcile(in)
	if len(got.Seen) != len(in.Rows)-1 || len(got.Unknown) != 0 || len(got.Lost) != 0 {
		t.Fatalf("seen %d of %d rows, unknown %v, lost %v", len(got.Seen), len(in.Rows), got.Unknown, got.Lost)
	}
	if len(got.Sync) != 1 || got.Sync[0].ID != "wk-07" {
		t.Errorf("%d rows to sync, want wk-07 alone", len(got.Sync))
	}
	if diff := cmp.Diff(map[string]int{"wk-09": 1}, got.Misses); diff != "" {
		t.Errorf("misses (-want +got):\n%s", diff)
	}
}

// TestFillFromWorkerLeavesTheCopiedRow: reconcile fills a shallow copy of
// a row in memory to see whether it changes; the row itself must not.
func TestFillFromWorkerLeavesTheCopiedRow(t *testing.T) {
	pid, gpu, at := 7, 0, time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	row := store.Row{ID: "wk-1", WorkerID: "w1", PID: &pid, GPUDevice: &gpu, StartedAt: &at, URI: "http://127.0.0.1:1"}
	w := api.Worker{WorkerID: "w1", PID: 7, GPUDevice: 0, StartedAt: at, URI: "http://127.0.0.1:1"}
	next := row
	if fillFromWorker(&next, w) {
		t.Errorf("a worker that matches its row changed it: %+v", next)
	}
	code := 3
	w.PID, w.GPUDevice, w.ExitCode, w.URI = 8, 1, &code, "http://127.0.0.1:2"
	if !fillFromWorker(&next, w) {
		t.Error("a worker with a new pid, device, exit code and uri did not change its row")
	}
	if *row.PID != 7 || *row.GPUDevice != 0 || row.ExitCode != nil || row.URI != "http://127.0.0.1:1" {
		t.Errorf("the copied row changed: pid %d, gpu %d, exit %v, uri %s", *row.PID, *row.GPUDevice, row.ExitCode, row.URI)
	}
	if *next.PID != 8 || *next.GPUDevice != 1 || *next.ExitCode != 3 || next.URI != "http://127.0.0.1:2" {
		t.Errorf("the filled row: pid %d, gpu %d, exit %v, uri %s", *next.PID, *next.GPUDevice, next.ExitCode, next.URI)
	}
}
