package hive

import (
	"errors"
	"testing"

	"github.com/apiary-llm/apiary/internal/api"
)

// Regression: a worker is in the live table from its admission (port and
// memory taken) but has a snapshot only once spawned. A heartbeat in that
// window listed an entry without worker id and the new worker's token
// apart from it; the queen refused both and stopped the worker
// (BenchmarkColdStartOverhead and BenchmarkRelayTLS failed with 503/404
// now and then). Lists and heartbeats leave such a worker out, and a
// heartbeat's tokens are those of its listed workers.
func TestRegistryLeavesOutWorkersNotSpawnedYet(t *testing.T) {
	r := newRegistry(41000, 0)
	dev := deviceInfo{ID: 0, Kind: "cpu", TotalBytes: 1 << 30, FreeBytes: 1 << 30}
	admit := func(id string) *worker {
		w := &worker{id: id, device: dev, estimate: 1 << 20, token: "token-of-" + id}
		if err := r.admit(w, "127.0.0.1", 41000, 41999); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.remove(w) })
		return w
	}
	spawned := admit("w-spawned")
	r.publish(spawned, api.Worker{WorkerID: spawned.id, Status: "starting"}, []held{{reserved: spawned.estimate}})
	admit("w-admitted") // not spawned yet: no snapshot
	ws, tokens := r.heartbeat()
	if len(ws) != 1 || ws[0].WorkerID != "w-spawned" || len(tokens) != 1 || tokens["w-spawned"] != "token-of-w-spawned" {
		t.Errorf("heartbeat = %+v, tokens %v; want only w-spawned, with its token", ws, tokens)
	}
	if l := r.list(true); len(l) != 1 || l[0].WorkerID != "w-spawned" {
		t.Errorf("list = %+v, want only w-spawned", l)
	}
	// A worker whose spawn failed ends without a snapshot: not listed either.
	failed := admit("w-failed")
	r.remove(failed)
	if l := r.list(true); len(l) != 1 || l[0].WorkerID != "w-spawned" {
		t.Errorf("list with the ended = %+v, want only w-spawned", l)
	}
}

// Two starts on one device read the driver before either is admitted:
// both see the same free memory, which shows neither. Only one of two
// models that fit that memory one at a time is admitted; before, the
// check took the first's claim from the total but not from the stale
// free reading, and both passed.
func TestConcurrentStartsCannotOvercommitADevice(t *testing.T) {
	r := newRegistry(41000, 0)
	// 16 GiB, 10 GiB free: another process holds 6 GiB.
	reading := deviceInfo{ID: 0, Kind: "cuda", TotalBytes: 16 << 30, FreeBytes: 10 << 30}
	admitted, refused := 0, 0
	for _, id := range []string{"w-a", "w-b"} {
		w := &worker{id: id, device: reading, estimate: 6 << 30}
		err := r.admit(w, "127.0.0.1", 41000, 41999)
		var me *InsufficientMemoryError
		switch {
		case err == nil:
			admitted++
			t.Cleanup(func() { r.remove(w) })
		case errors.As(err, &me):
			refused++
			if me.Available != 4<<30 {
				t.Errorf("refused with %s available, want 4 GiB (10 free less the first start's 6)", api.FormatBytes(me.Available))
			}
		default:
			t.Fatalf("admit %s: %v", id, err)
		}
	}
	if admitted != 1 || refused != 1 {
		t.Errorf("%d admitted, %d refused; want 1 and 1 (12 GiB of starts on 10 GiB free)", admitted, refused)
	}
}
