package hive

import (
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
	r := newRegistry(41000)
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
	r.publish(spawned, api.Worker{WorkerID: spawned.id, Status: "starting"}, held{reserved: spawned.estimate})
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
