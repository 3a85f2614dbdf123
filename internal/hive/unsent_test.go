package hive

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/apiary-llm/apiary/internal/api"
)

// The events the queen did not take keep their order through a failed
// send (putBack), stay bounded (the oldest go), and survive the hive
// (saved in its data dir, read once by the next hive, which removes the
// file).
func TestUnsentEventsKeepTheirOrderAndSurviveTheHive(t *testing.T) {
	ev := func(id, to string) api.WorkerEvent { return api.WorkerEvent{PoolID: "p", WorkerID: id, To: to} }
	var u unsent
	u.add(ev("w1", "draining"), ev("w1", "stopped"))
	taken := u.take()
	u.add(ev("w2", "stopped")) // came while the first two were being sent
	u.putBack(taken[1:])       // the first was taken, the second was not
	want := []api.WorkerEvent{ev("w1", "stopped"), ev("w2", "stopped")}
	if diff := cmp.Diff(want, u.take()); diff != "" {
		t.Errorf("order after a failed send (-want +got):\n%s", diff)
	}

	for i := range maxUnsent + 3 {
		u.add(api.WorkerEvent{WorkerID: "w", Reason: string(rune('a' + i%26))})
	}
	if got := u.take(); len(got) != maxUnsent || got[0].Reason != string(rune('a'+3)) {
		t.Errorf("bounded list: %d events, first %q; want %d, the oldest 3 dropped", len(got), got[0].Reason, maxUnsent)
	}

	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "hive"), 0o755); err != nil {
		t.Fatal(err)
	}
	d := &dataDir{root: dir}
	if err := d.saveUnsent(want); err != nil {
		t.Fatal(err)
	}
	got, err := d.loadUnsent()
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("events read by the next hive (-want +got):\n%s", diff)
	}
	if again, err := d.loadUnsent(); err != nil || len(again) != 0 {
		t.Errorf("events read a second time: %v %v, want none (the file is removed)", again, err)
	}
	if err := d.saveUnsent(nil); err != nil {
		t.Errorf("saving none: %v", err)
	}
}
