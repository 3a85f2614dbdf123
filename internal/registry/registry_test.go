package registry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeStore keeps what the registry writes, and fails on demand.
type fakeStore struct {
	mu    sync.Mutex
	pools map[string]store.Pool // guarded by mu
	audit []store.AuditEntry    // guarded by mu
	fail  error                 // guarded by mu
	// stall, when set, holds SavePool until it is closed (a store that
	// hangs); read without mu.
	stall chan struct{}
}

func newFakeStore() *fakeStore { return &fakeStore{pools: map[string]store.Pool{}} }

func (f *fakeStore) LoadPools(context.Context) ([]store.Pool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Collect(maps.Values(f.pools)), f.fail
}

func (f *fakeStore) SavePool(_ context.Context, p store.Pool, audit ...store.AuditEntry) error {
	if f.stall != nil {
		<-f.stall
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return f.fail
	}
	f.pools[p.ID] = p
	f.audit = append(f.audit, audit...)
	return nil
}

func (f *fakeStore) RemovePool(_ context.Context, id string, audit store.AuditEntry) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return f.fail
	}
	delete(f.pools, id)
	f.audit = append(f.audit, audit)
	return nil
}

func (f *fakeStore) SaveBeats(_ context.Context, beats []store.Pool, audit []store.AuditEntry) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return f.fail
	}
	for _, b := range beats {
		if p, ok := f.pools[b.ID]; ok {
			p.LastHeartbeatAt, p.GPUs, p.Workers = b.LastHeartbeatAt, b.GPUs, b.Workers
			f.pools[b.ID] = p
		}
	}
	f.audit = append(f.audit, audit...)
	return nil
}

func (f *fakeStore) setFail(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail = err
}

// actions lists the audit actions recorded for target, in order.
func (f *fakeStore) actions(target string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, e := range f.audit {
		if e.Target == target {
			out = append(out, e.Action)
		}
	}
	return out
}

func (f *fakeStore) status(id string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.pools[id].Status
}

const (
	ttl       = 30 * time.Second
	grace     = 20 * time.Second
	retention = 5 * time.Minute
)

type lostCall struct{ pool, reason string }

type harness struct {
	r     *Registry
	st    *fakeStore
	mu    sync.Mutex
	lost  []lostCall // guarded by mu
	ctx   context.Context
	testT *testing.T
}

func newHarness(t *testing.T, st *fakeStore) *harness {
	h := &harness{st: st, ctx: context.Background(), testT: t}
	r, err := New(Config{Store: st, HeartbeatTimeout: ttl, UnhealthyGrace: grace, OfflineRetention: retention,
		FlushInterval: time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		OnLost: func(pool, reason string) {
			h.mu.Lock()
			defer h.mu.Unlock()
			h.lost = append(h.lost, lostCall{pool, reason})
		}})
	if err != nil {
		t.Fatal(err)
	}
	h.r = r
	t.Cleanup(r.Close)
	return h
}

func (h *harness) lostCalls() []lostCall {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.lost)
}

func (h *harness) register(id string) {
	h.testT.Helper()
	if _, err := h.r.Register(h.ctx, api.RegisterPool{PoolID: id, Endpoint: "http://" + id + ".hive.invalid", NodeID: id, Version: "t"}, "hive:"+id); err != nil {
		h.testT.Fatal(err)
	}
}

func (h *harness) beat(id string) Beat {
	h.testT.Helper()
	b, err := h.r.Heartbeat(h.ctx, id, api.Heartbeat{})
	if err != nil {
		h.testT.Fatal(err)
	}
	return b
}

func (h *harness) status(id string) Status {
	p, ok := h.r.Get(id)
	if !ok {
		return "gone"
	}
	return p.Status
}

// advance moves the bubble's clock by d and lets every timer due run.
func advance(d time.Duration) {
	time.Sleep(d)
	synctest.Wait()
}

func TestLeaseExpiresAtTheTimeoutExactly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, newFakeStore())
		h.register("p1")
		advance(ttl - time.Millisecond)
		if got := h.status("p1"); got != Healthy {
			t.Fatalf("just before the timeout: %s, want healthy", got)
		}
		advance(time.Millisecond)
		if got := h.status("p1"); got != Unhealthy {
			t.Fatalf("at the timeout: %s, want unhealthy", got)
		}
		if got := h.st.status("p1"); got != string(Unhealthy) {
			t.Errorf("stored status %q, want unhealthy", got)
		}
		if diff := cmp.Diff([]string{"pool.register", "pool.unhealthy"}, h.st.actions("p1")); diff != "" {
			t.Errorf("audit (-want +got):\n%s", diff)
		}
	})
}

func TestHeartbeatsKeepTheLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, newFakeStore())
		h.register("p1")
		for range 20 {
			advance(ttl - time.Second)
			h.beat("p1")
		}
		if got := h.status("p1"); got != Healthy {
			t.Fatalf("beating pool is %s, want healthy", got)
		}
		if diff := cmp.Diff([]string{"pool.register"}, h.st.actions("p1")); diff != "" {
			t.Errorf("a steady pool audited more than its registration (-want +got):\n%s", diff)
		}
	})
}

func TestUnhealthyPoolComesBackWhenItBeats(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, newFakeStore())
		h.register("p1")
		h.register("p2")
		if _, err := h.r.Drain(h.ctx, "p2", "admin", "maintenance"); err != nil {
			t.Fatal(err)
		}
		advance(ttl)
		for _, id := range []string{"p1", "p2"} {
			if got := h.status(id); got != Unhealthy {
				t.Fatalf("%s: %s, want unhealthy", id, got)
			}
		}
		if b := h.beat("p1"); b.Status != Healthy {
			t.Errorf("p1 after a beat: %s, want healthy", b.Status)
		}
		if b := h.beat("p2"); b.Status != Draining {
			t.Errorf("drained p2 after a beat: %s, want draining", b.Status)
		}
		if diff := cmp.Diff([]string{"pool.register", "pool.unhealthy", "pool.healthy"}, h.st.actions("p1")); diff != "" {
			t.Errorf("p1 audit (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff([]string{"pool.register", "pool.drain", "pool.unhealthy", "pool.draining"}, h.st.actions("p2")); diff != "" {
			t.Errorf("p2 audit (-want +got):\n%s", diff)
		}
		advance(grace * 2)
		if got := h.lostCalls(); len(got) != 0 {
			t.Errorf("OnLost called for pools that came back: %v", got)
		}
	})
}

func TestUnhealthyPastGraceLosesWorkersOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, newFakeStore())
		h.register("p1")
		advance(ttl + grace - time.Millisecond)
		if got := h.lostCalls(); len(got) != 0 {
			t.Fatalf("OnLost before the grace ended: %v", got)
		}
		advance(time.Millisecond)
		got := h.lostCalls()
		if len(got) != 1 || got[0].pool != "p1" {
			t.Fatalf("OnLost calls %v, want one for p1", got)
		}
		advance(10 * grace)
		if got := h.lostCalls(); len(got) != 1 {
			t.Errorf("OnLost called again: %v", got)
		}
		if got := h.status("p1"); got != Unhealthy {
			t.Errorf("lost pool is %s, want unhealthy (it stays known)", got)
		}
	})
}

func TestDeregisterThenRetentionRemoves(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, newFakeStore())
		h.register("p1")
		if _, err := h.r.Deregister(h.ctx, "p1", "admin", "decommissioned"); err != nil {
			t.Fatal(err)
		}
		if got := h.status("p1"); got != Offline {
			t.Fatalf("after deregister: %s, want offline", got)
		}
		if got := h.lostCalls(); len(got) != 1 {
			t.Errorf("OnLost calls %v, want one", got)
		}
		if _, err := h.r.Heartbeat(h.ctx, "p1", api.Heartbeat{}); !errors.Is(err, ErrOffline) {
			t.Errorf("heartbeat of an offline pool: %v, want ErrOffline", err)
		}
		advance(ttl * 3) // no lease on an offline pool
		if got := h.status("p1"); got != Offline {
			t.Fatalf("offline pool became %s", got)
		}
		advance(retention - ttl*3)
		if got := h.status("p1"); got != "gone" {
			t.Fatalf("after the retention: %s, want removed", got)
		}
		if got := h.st.status("p1"); got != "" {
			t.Errorf("store still has the pool (%q)", got)
		}
		if diff := cmp.Diff([]string{"pool.register", "pool.offline", "pool.remove"}, h.st.actions("p1")); diff != "" {
			t.Errorf("audit (-want +got):\n%s", diff)
		}
		if _, err := h.r.Heartbeat(h.ctx, "p1", api.Heartbeat{}); !errors.Is(err, ErrNotFound) {
			t.Errorf("heartbeat of a removed pool: %v, want ErrNotFound", err)
		}
	})
}

func TestReRegisterBringsOfflinePoolBackUndrained(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, newFakeStore())
		h.register("p1")
		if _, err := h.r.Drain(h.ctx, "p1", "admin", "x"); err != nil {
			t.Fatal(err)
		}
		if _, err := h.r.Deregister(h.ctx, "p1", "admin", "x"); err != nil {
			t.Fatal(err)
		}
		h.register("p1")
		if got := h.status("p1"); got != Healthy {
			t.Fatalf("re-registered pool: %s, want healthy", got)
		}
		if b := h.beat("p1"); !b.FullInventory {
			t.Error("first beat after registration is not the full inventory")
		}
		if b := h.beat("p1"); b.FullInventory {
			t.Error("second beat counted as full inventory")
		}
		advance(retention) // the retention timer of the offline days must not remove it
		if got := h.status("p1"); got != Unhealthy {
			t.Errorf("after silence: %s, want unhealthy (not removed)", got)
		}
	})
}

// A failed store write on a request path leaves the registry as it was.
func TestFailedWriteChangesNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		h := newHarness(t, st)
		h.register("p1")
		boom := errors.New("disk full")
		st.setFail(boom)
		if _, err := h.r.Drain(h.ctx, "p1", "admin", "x"); !errors.Is(err, boom) {
			t.Fatalf("drain: %v, want the store's error", err)
		}
		if _, err := h.r.Register(h.ctx, api.RegisterPool{PoolID: "p2", Endpoint: "http://x"}, "hive:p2"); !errors.Is(err, boom) {
			t.Fatalf("register: %v, want the store's error", err)
		}
		if p, _ := h.r.Get("p1"); p.Status != Healthy || p.Drained {
			t.Errorf("p1 after a failed drain: %+v", p)
		}
		if _, ok := h.r.Get("p2"); ok {
			t.Error("p2 exists after its registration failed")
		}
	})
}

// The registry's own timers change memory even when the store fails (a
// silent pool must stop getting work), and Flush catches up later.
func TestLeaseExpiryWithFailingStoreIsRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		h := newHarness(t, st)
		h.register("p1")
		st.setFail(errors.New("disk full"))
		advance(ttl)
		if got := h.status("p1"); got != Unhealthy {
			t.Fatalf("in memory: %s, want unhealthy", got)
		}
		if err := h.r.Flush(h.ctx); err == nil {
			t.Fatal("flush with a failing store succeeded")
		}
		st.setFail(nil)
		if err := h.r.Flush(h.ctx); err != nil {
			t.Fatal(err)
		}
		if got := st.status("p1"); got != string(Unhealthy) {
			t.Errorf("stored status %q, want unhealthy", got)
		}
		if diff := cmp.Diff([]string{"pool.register", "pool.unhealthy"}, st.actions("p1")); diff != "" {
			t.Errorf("audit (-want +got):\n%s", diff)
		}
	})
}

func TestLoadGivesFreshLeasesAndKeepsStatus(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		h := newHarness(t, st)
		h.register("healthy")
		h.register("sick")
		h.register("gone")
		advance(ttl / 2)
		h.beat("healthy")
		if _, err := h.r.Deregister(h.ctx, "gone", "admin", "x"); err != nil {
			t.Fatal(err)
		}
		advance(ttl / 2) // sick misses its lease
		h.r.Close()

		advance(time.Minute) // the queen is down for a minute
		h2 := newHarness(t, st)
		if err := h2.r.Load(h2.ctx); err != nil {
			t.Fatal(err)
		}
		// A live pool is restored unhealthy: its hive has not been heard
		// from since the queen started (TestRestoredPoolIsHeldAndUnhealthy).
		want := map[string]Status{"healthy": Unhealthy, "sick": Unhealthy, "gone": Offline}
		for id, s := range want {
			if got := h2.status(id); got != s {
				t.Errorf("%s after load: %s, want %s", id, got, s)
			}
		}
		if b := h2.beat("healthy"); !b.FullInventory || b.Status != Healthy {
			t.Errorf("first beat after load: %+v, want the full inventory of a healthy pool", b)
		}
		advance(ttl - time.Millisecond)
		if got := h2.status("healthy"); got != Healthy {
			t.Errorf("healthy pool lost its fresh lease early: %s", got)
		}
		advance(grace)
		if got := h2.lostCalls(); len(got) != 1 || got[0].pool != "sick" {
			t.Errorf("OnLost calls %v, want one for sick", got)
		}
		advance(retention)
		if got := h2.status("gone"); got != "gone" {
			t.Errorf("offline pool after its retention: %s, want removed", got)
		}
	})
}

func TestFlushWritesHeartbeats(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		h := newHarness(t, st)
		h.register("p1")
		advance(time.Second)
		if _, err := h.r.Heartbeat(h.ctx, "p1", api.Heartbeat{GPUs: []api.GPU{{ID: 0, FreeBytes: 7}}}); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { _ = h.r.Run(ctx); close(done) }()
		advance(time.Second)
		cancel()
		<-done
		st.mu.Lock()
		defer st.mu.Unlock()
		p := st.pools["p1"]
		var gpus []api.GPU
		if err := json.Unmarshal(p.GPUs, &gpus); err != nil || len(gpus) != 1 || gpus[0].FreeBytes != 7 {
			t.Errorf("stored GPUs %s (%v)", p.GPUs, err)
		}
		if p.LastHeartbeatAt == nil || !p.LastHeartbeatAt.Equal(time.Now().Add(-time.Second)) {
			t.Errorf("stored last heartbeat %v, want %v", p.LastHeartbeatAt, time.Now().Add(-time.Second))
		}
	})
}

func TestQuery(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, newFakeStore())
		for _, id := range []string{"a", "b", "c"} {
			h.register(id)
		}
		beat := func(id string, free uint64, workers ...api.Worker) {
			if _, err := h.r.Heartbeat(h.ctx, id, api.Heartbeat{GPUs: []api.GPU{{ID: 0, FreeBytes: 1}, {ID: 1, FreeBytes: free}}, Workers: workers}); err != nil {
				t.Fatal(err)
			}
		}
		beat("a", 10<<30, api.Worker{WorkerID: "w1", ModelRef: "tiny", Status: "ready"})
		beat("b", 2<<30, api.Worker{WorkerID: "w2", ModelRef: "big", Status: "busy"}, api.Worker{WorkerID: "w3", ModelRef: "tiny", Status: "failed"})
		beat("c", 20<<30)
		if _, err := h.r.Drain(h.ctx, "c", "admin", "x"); err != nil {
			t.Fatal(err)
		}
		ids := func(ps []Pool) []string {
			var out []string
			for _, p := range ps {
				out = append(out, p.ID)
			}
			return out
		}
		for _, tc := range []struct {
			name string
			f    Filter
			want []string
		}{
			{"all", Filter{}, []string{"a", "b", "c"}},
			{"healthy", Filter{Statuses: []Status{Healthy}}, []string{"a", "b"}},
			{"by model (live workers only)", Filter{Model: "tiny"}, []string{"a"}},
			{"by free memory", Filter{MinFreeBytes: 5 << 30}, []string{"a", "c"}},
			{"healthy with room", Filter{Statuses: []Status{Healthy}, MinFreeBytes: 5 << 30}, []string{"a"}},
			{"nothing", Filter{Model: "none"}, nil},
		} {
			if diff := cmp.Diff(tc.want, ids(h.r.Query(tc.f))); diff != "" {
				t.Errorf("%s (-want +got):\n%s", tc.name, diff)
			}
		}
		if diff := cmp.Diff(map[Status]int{Healthy: 2, Draining: 1, Unhealthy: 0, Offline: 0}, h.r.Counts()); diff != "" {
			t.Errorf("counts (-want +got):\n%s", diff)
		}
	})
}

func TestUpdateWorkerIsSeenAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, newFakeStore())
		h.register("a")
		before, _ := h.r.Get("a")
		h.r.UpdateWorker("a", api.Worker{WorkerID: "w1", ModelRef: "tiny", Status: "ready"})
		if got := h.r.Query(Filter{Model: "tiny"}); len(got) != 1 {
			t.Fatalf("ready worker not seen: %v", got)
		}
		h.r.UpdateWorker("a", api.Worker{WorkerID: "w1", ModelRef: "tiny", Status: "stopped"})
		if got := h.r.Query(Filter{Model: "tiny"}); len(got) != 0 {
			t.Fatalf("stopped worker still seen: %v", got)
		}
		if len(before.Workers) != 0 {
			t.Errorf("an earlier snapshot changed: %v", before.Workers)
		}
	})
}

func TestTransitionTable(t *testing.T) {
	for _, tc := range []struct {
		from, to Status
		ok       bool
	}{
		{Healthy, Unhealthy, true}, {Healthy, Draining, true}, {Healthy, Offline, true},
		{Unhealthy, Healthy, true}, {Unhealthy, Draining, true}, {Unhealthy, Offline, true},
		{Draining, Unhealthy, true}, {Draining, Offline, true}, {Draining, Healthy, true},
		{Offline, Healthy, true}, {Offline, Unhealthy, false}, {Offline, Draining, false},
	} {
		if got := CanTransition(tc.from, tc.to); got != tc.ok {
			t.Errorf("%s → %s: %v, want %v", tc.from, tc.to, got, tc.ok)
		}
	}
	if _, err := ParseStatus("sleepy"); err == nil {
		t.Error("ParseStatus accepted an unknown status")
	}
}

func TestConfigValidate(t *testing.T) {
	_, err := New(Config{Store: newFakeStore(), HeartbeatTimeout: -time.Second})
	if err == nil {
		t.Error("negative timeout accepted")
	}
	if _, err := New(Config{}); err == nil {
		t.Error("missing store accepted")
	}
}

// Events cannot grow a pool's worker list beyond MaxWorkersPerPool.
func TestUpdateWorkerIsBounded(t *testing.T) {
	h := newHarness(t, newFakeStore())
	h.register("a")
	for i := range MaxWorkersPerPool + 10 {
		h.r.UpdateWorker("a", api.Worker{WorkerID: fmt.Sprintf("w%d", i), Status: "ready"})
	}
	p, _ := h.r.Get("a")
	if len(p.Workers) != MaxWorkersPerPool {
		t.Errorf("%d workers, want %d", len(p.Workers), MaxWorkersPerPool)
	}
}

// A drained pool can be taken back (drain could not be undone,
// and `pools rm` killed the pool's workers); undraining one that is not
// drained changes nothing, and an offline pool cannot be.
func TestUndrain(t *testing.T) {
	h := newHarness(t, newFakeStore())
	h.register("a")
	if _, err := h.r.Drain(h.ctx, "a", "admin", "maintenance"); err != nil {
		t.Fatal(err)
	}
	p, err := h.r.Undrain(h.ctx, "a", "admin", "done")
	if err != nil || p.Status != Healthy || p.Drained {
		t.Fatalf("undrain: %+v %v", p, err)
	}
	if p, err := h.r.Undrain(h.ctx, "a", "admin", "again"); err != nil || p.Status != Healthy {
		t.Errorf("undrain of a pool not drained: %+v %v", p, err)
	}
	if _, err := h.r.Deregister(h.ctx, "a", "admin", "gone"); err != nil {
		t.Fatal(err)
	}
	if _, err := h.r.Undrain(h.ctx, "a", "admin", "x"); !errors.Is(err, ErrOffline) {
		t.Errorf("undrain of an offline pool: %v", err)
	}
	if _, err := h.r.Undrain(h.ctx, "nope", "admin", "x"); !errors.Is(err, ErrNotFound) {
		t.Errorf("undrain of an unknown pool: %v", err)
	}
}

// An unhealthy pool was kept forever. One still silent an
// offline retention after it was lost goes offline, and is removed after
// another; a heartbeat before then brings it back.
func TestSilentUnhealthyPoolGoesOfflineThenAway(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, newFakeStore())
		h.register("p1")
		advance(ttl + grace)
		if got := h.status("p1"); got != Unhealthy || len(h.lostCalls()) != 1 {
			t.Fatalf("after the grace: %s, %d lost calls", got, len(h.lostCalls()))
		}
		advance(retention - time.Millisecond)
		if got := h.status("p1"); got != Unhealthy {
			t.Fatalf("before the retention: %s, want unhealthy", got)
		}
		advance(time.Millisecond)
		if got := h.status("p1"); got != Offline {
			t.Fatalf("after the retention: %s, want offline", got)
		}
		advance(retention)
		if got := h.status("p1"); got != "gone" {
			t.Fatalf("after another retention: %s, want removed", got)
		}
		if diff := cmp.Diff([]string{"pool.register", "pool.unhealthy", "pool.offline", "pool.remove"}, h.st.actions("p1")); diff != "" {
			t.Errorf("audit (-want +got):\n%s", diff)
		}
	})
}

// The registry held its lock across store writes, and every
// request queries it: a status change waiting for a stalled store stopped
// all routing and every heartbeat. Now queries and heartbeats go on while
// it waits; the change lands when the store answers.
func TestStalledStoreBlocksNoQueryOrHeartbeat(t *testing.T) {
	st := newFakeStore()
	h := newHarness(t, st)
	h.register("a")
	h.register("b")
	st.stall = make(chan struct{})
	drained := make(chan error, 1)
	go func() {
		_, err := h.r.Drain(h.ctx, "a", "admin", "maintenance")
		drained <- err
	}()
	// Wait until the drain holds the writers' lock (it waits for the store).
	for h.r.wmu.TryLock() {
		h.r.wmu.Unlock()
		runtime.Gosched()
	}
	if got := h.r.Query(Filter{}); len(got) != 2 {
		t.Errorf("query while the store stalls: %d pools", len(got))
	}
	if p, ok := h.r.Get("a"); !ok || p.Status != Healthy {
		t.Errorf("pool a while its drain waits for the store: %+v", p)
	}
	h.beat("b")
	h.r.UpdateWorker("b", api.Worker{WorkerID: "w1", Status: "ready"})
	select {
	case err := <-drained:
		t.Fatalf("the drain returned before the store answered: %v", err)
	default:
	}
	close(st.stall)
	if err := <-drained; err != nil {
		t.Fatal(err)
	}
	if got := h.status("a"); got != Draining {
		t.Errorf("after the store answered: %s", got)
	}
	if p, _ := h.r.Get("b"); len(p.Workers) != 1 {
		t.Errorf("pool b's worker from the event: %+v", p.Workers)
	}
}

// TestQueryByModelFollowsEveryChange: a query for a model's pools reads
// the model index; after any mix of registrations, heartbeats, worker
// events, drains, deregistrations and a reload, it answers what a scan of
// every pool answers.
func TestQueryByModelFollowsEveryChange(t *testing.T) {
	st := newFakeStore()
	h := newHarness(t, st)
	rng := rand.New(rand.NewPCG(1, 2))
	models := []string{"m0", "m1", "m2", "m3"}
	statuses := []string{"starting", "ready", "busy", "draining", "stopped", "failed"}
	worker := func() api.Worker {
		return api.Worker{WorkerID: fmt.Sprintf("w%d", rng.IntN(6)), ModelRef: models[rng.IntN(len(models))], Status: statuses[rng.IntN(len(statuses))]}
	}
	check := func(step int) {
		t.Helper()
		all := h.r.Query(Filter{})
		for _, m := range append(models, "m-none") {
			for _, f := range []Filter{{Model: m}, {Model: m, Statuses: []Status{Healthy}}} {
				var want []string
				for _, p := range all {
					if f.Match(p) {
						want = append(want, p.ID)
					}
				}
				var got []string
				for _, p := range h.r.Query(f) {
					got = append(got, p.ID)
				}
				if diff := cmp.Diff(want, got); diff != "" {
					t.Fatalf("step %d, filter %+v (-scan +index):\n%s", step, f, diff)
				}
			}
		}
	}
	for step := range 2000 {
		id := fmt.Sprintf("p%d", rng.IntN(12))
		switch op := rng.IntN(10); {
		case op < 2:
			_, _ = h.r.Register(h.ctx, api.RegisterPool{PoolID: id, Endpoint: "http://" + id + ".hive.invalid"}, "test")
		case op < 6:
			ws := make([]api.Worker, rng.IntN(5))
			for i := range ws {
				ws[i] = worker()
			}
			_, _ = h.r.Heartbeat(h.ctx, id, api.Heartbeat{Workers: ws})
		case op < 8:
			h.r.UpdateWorker(id, worker())
		case op < 9:
			_, _ = h.r.Drain(h.ctx, id, "test", "test")
		default:
			_, _ = h.r.Deregister(h.ctx, id, "test", "test")
		}
		check(step)
	}
	if err := h.r.Flush(h.ctx); err != nil {
		t.Fatal(err)
	}
	reloaded := newHarness(t, st)
	if err := reloaded.r.Load(h.ctx); err != nil {
		t.Fatal(err)
	}
	h = reloaded
	check(-1)
}

func TestSameModels(t *testing.T) {
	w := func(model, status string) api.Worker { return api.Worker{ModelRef: model, Status: status} }
	many := make([]api.Worker, 100)
	for i := range many {
		many[i] = w(fmt.Sprintf("m%d", i%3), "ready")
	}
	for _, tc := range []struct {
		models []string
		ws     []api.Worker
		want   bool
	}{
		{nil, nil, true},
		{nil, []api.Worker{w("a", "stopped"), w("", "ready")}, true},
		{[]string{"a"}, []api.Worker{w("a", "ready"), w("a", "busy")}, true},
		{[]string{"a"}, []api.Worker{w("a", "failed")}, false},
		{[]string{"a"}, []api.Worker{w("a", "ready"), w("b", "starting")}, false},
		{[]string{"a", "b"}, []api.Worker{w("b", "ready"), w("a", "ready")}, true},
		{[]string{"a", "b"}, []api.Worker{w("a", "ready"), w("a", "ready")}, false},
		{[]string{"m0", "m1", "m2"}, many, true},
		{[]string{"m0", "m1"}, many, false},
		{[]string{"m0", "m1", "m2", "m3"}, many, false},
	} {
		if got := sameModels(tc.models, tc.ws); got != tc.want {
			t.Errorf("sameModels(%v, %d workers) = %v, want %v", tc.models, len(tc.ws), got, tc.want)
		}
	}
}

// A pool whose beats change nothing but the time has its row written when
// the stored time is BeatTimeSave old, not at every flush; a change is
// written at the next flush; the final flush writes the latest time. A
// full beat that repeats the last one (an older hive sends only those)
// counts as unchanged: not Changed, and written at the same pace.
func TestFlushWritesUnchangedBeatsAtTheirPace(t *testing.T) {
	for _, repeat := range []bool{false, true} {
		t.Run(fmt.Sprintf("repeated_full=%v", repeat), func(t *testing.T) { testFlushPace(t, repeat) })
	}
}

func testFlushPace(t *testing.T, repeatFull bool) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		h := newHarness(t, st)
		h.register("p1")
		beat := func(hb api.Heartbeat, changed bool) {
			t.Helper()
			b, err := h.r.Heartbeat(h.ctx, "p1", hb)
			if err != nil {
				t.Fatal(err)
			}
			if b.Changed != changed {
				t.Fatalf("beat %+v: Changed %v, want %v", hb, b.Changed, changed)
			}
		}
		flush := func() {
			t.Helper()
			if err := h.r.flush(h.ctx, false); err != nil {
				t.Fatal(err)
			}
		}
		stored := func() (time.Time, string) {
			st.mu.Lock()
			defer st.mu.Unlock()
			p := st.pools["p1"]
			if p.LastHeartbeatAt == nil {
				return time.Time{}, string(p.GPUs)
			}
			return *p.LastHeartbeatAt, string(p.GPUs)
		}
		started := time.Now()
		// full is the same beat decoded afresh, as from the wire, with the
		// device at temp degrees.
		full := func(temp int) api.Heartbeat {
			return api.Heartbeat{GPUs: []api.GPU{{ID: 0, FreeBytes: 7, TemperatureC: &temp, Workers: []string{"w1"}}},
				Workers: []api.Worker{{WorkerID: "w1", ModelRef: "m", Status: "ready", URI: "http://127.0.0.1:9", StartedAt: started}}}
		}
		same := func() api.Heartbeat {
			if repeatFull {
				return full(61)
			}
			return api.Heartbeat{Unchanged: true}
		}
		beat(full(61), true) // the first since the pool registered
		flush()
		first, _ := stored()
		if !first.Equal(time.Now()) {
			t.Fatalf("the full beat's time %v was not written", first)
		}
		for range int(BeatTimeSave/time.Second) - 1 {
			advance(time.Second)
			beat(same(), false)
			flush()
		}
		if at, _ := stored(); !at.Equal(first) {
			t.Errorf("beats that changed nothing wrote the time %v within BeatTimeSave of %v", at, first)
		}
		advance(time.Second)
		beat(same(), false)
		flush()
		if at, _ := stored(); !at.Equal(time.Now()) {
			t.Errorf("stored time %v after BeatTimeSave, want %v", at, time.Now())
		}
		advance(time.Second)
		beat(api.Heartbeat{GPUs: []api.GPU{{ID: 0, FreeBytes: 9}}}, true)
		flush()
		if at, gpus := stored(); !at.Equal(time.Now()) || !strings.Contains(gpus, `"free_vram_bytes":9`) {
			t.Errorf("a changed beat stored %v %s, want now and the new devices", at, gpus)
		}
		advance(time.Second)
		beat(full(61), true)
		flush()
		written, _ := stored()
		// Any field that differs is a change (the temperature here), but
		// one of figures that move on their own is written at the pace of
		// the time, not at the next flush.
		advance(time.Second)
		beat(full(62), true)
		flush()
		if at, gpus := stored(); !at.Equal(written) || strings.Contains(gpus, `"temperature_c":62`) {
			t.Errorf("a beat with another temperature stored %v %s at once, want it at the time's pace", at, gpus)
		}
		advance(time.Second)
		if repeatFull {
			beat(full(62), false)
		} else {
			beat(api.Heartbeat{Unchanged: true}, false)
		}
		if err := h.r.Flush(h.ctx); err != nil {
			t.Fatal(err)
		}
		if at, gpus := stored(); !at.Equal(time.Now()) || !strings.Contains(gpus, `"temperature_c":62`) {
			t.Errorf("the final flush stored %v %s, want the last beat's %v and 62", at, gpus, time.Now())
		}
	})
}

// Heartbeats renew leases under the read lock and their pool's own lock:
// beats of many pools at once, full and unchanged, with queries, a drain,
// model changes and flushes beside them, leave every pool as its last
// beat said (the race detector watches the locking in `make test`).
func TestConcurrentBeatsQueriesAndFlushes(t *testing.T) {
	st := newFakeStore()
	h := newHarness(t, st)
	const pools, beats = 16, 50
	for i := range pools {
		h.register(fmt.Sprintf("p%02d", i))
	}
	var wg sync.WaitGroup
	for i := range pools {
		id := fmt.Sprintf("p%02d", i)
		wg.Go(func() {
			for n := range beats {
				model := fmt.Sprintf("m%d", n%3) // the model changes: the index follows, under the write lock
				hb := api.Heartbeat{GPUs: []api.GPU{{ID: 0, FreeBytes: uint64(n)}}, Workers: []api.Worker{{WorkerID: "w", ModelRef: model, Status: "ready"}}}
				if n%2 == 1 {
					hb = api.Heartbeat{Unchanged: true}
				}
				b, err := h.r.Heartbeat(h.ctx, id, hb)
				if err != nil || b.FullWanted {
					t.Errorf("beat %d of %s: %+v, %v", n, id, b, err)
					return
				}
			}
		})
	}
	wg.Go(func() {
		for range beats {
			for _, p := range h.r.Query(Filter{Model: "m1"}) {
				if !p.HasModel("m1") {
					t.Errorf("query for m1 returned %s with %+v", p.ID, p.Workers)
				}
			}
			_ = h.r.Query(Filter{MinFreeBytes: 10})
			_, _ = h.r.Get("p00")
			if err := h.r.flush(h.ctx, false); err != nil {
				t.Error(err)
			}
		}
	})
	wg.Go(func() {
		if _, err := h.r.Drain(h.ctx, "p01", "admin", "test"); err != nil {
			t.Error(err)
		}
	})
	wg.Wait()
	for i := range pools {
		id := fmt.Sprintf("p%02d", i)
		p, _ := h.r.Get(id)
		last := beats - 2 // the last full beat
		if len(p.GPUs) != 1 || p.GPUs[0].FreeBytes != uint64(last) || len(p.Workers) != 1 || p.Workers[0].ModelRef != fmt.Sprintf("m%d", last%3) {
			t.Errorf("%s after its beats: gpus %+v, workers %+v", id, p.GPUs, p.Workers)
		}
		if got := h.r.Query(Filter{Model: p.Workers[0].ModelRef}); !slices.ContainsFunc(got, func(q Pool) bool { return q.ID == id }) {
			t.Errorf("%s is not among the pools of its model %s", id, p.Workers[0].ModelRef)
		}
	}
	if p, _ := h.r.Get("p01"); p.Status != Draining {
		t.Errorf("drained pool p01 is %s", p.Status)
	}
	if err := h.r.Flush(h.ctx); err != nil {
		t.Fatal(err)
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	for i := range pools {
		id := fmt.Sprintf("p%02d", i)
		var gpus []api.GPU
		if err := json.Unmarshal(st.pools[id].GPUs, &gpus); err != nil || len(gpus) != 1 || gpus[0].FreeBytes != beats-2 {
			t.Errorf("stored GPUs of %s: %s (%v)", id, st.pools[id].GPUs, err)
		}
	}
}

// sameGPU and sameWorker see a difference in every field, including
// fields added later (the test sets each one in turn by reflection).
func TestSameInventorySeesEveryField(t *testing.T) {
	checkEveryField(t, api.GPU{ID: 1, Kind: "cuda", Workers: []string{"w"}}, sameGPU)
	checkEveryField(t, api.Worker{WorkerID: "w", StartedAt: time.Unix(1, 0)}, func(a, b api.Worker) bool {
		return sameWorker(a, b)
	})
	w := api.Worker{WorkerID: "w", StartedAt: time.Unix(1, 0)}
	other := w
	other.StartedAt = w.StartedAt.In(time.FixedZone("x", 3600)) // the same instant
	if !sameWorker(w, other) {
		t.Error("the same start time in another zone is a change")
	}
}

func checkEveryField[T any](t *testing.T, base T, same func(a, b T) bool) {
	t.Helper()
	if !same(base, base) {
		t.Fatalf("%T differs from itself", base)
	}
	typ := reflect.TypeFor[T]()
	for i := range typ.NumField() {
		f := typ.Field(i)
		changed := base
		v := reflect.ValueOf(&changed).Elem().Field(i)
		switch v.Kind() {
		case reflect.String:
			v.SetString(v.String() + "x")
		case reflect.Int, reflect.Int64:
			v.SetInt(v.Int() + 7)
		case reflect.Uint64:
			v.SetUint(v.Uint() + 7)
		case reflect.Pointer:
			v.Set(reflect.New(f.Type.Elem()))
		case reflect.Slice:
			v.Set(reflect.Append(v, reflect.New(f.Type.Elem()).Elem()))
		case reflect.Struct:
			if f.Type != reflect.TypeFor[time.Time]() {
				t.Fatalf("%T.%s: a struct the test cannot change", base, f.Name)
			}
			v.Set(reflect.ValueOf(time.Unix(99, 0)))
		default:
			t.Fatalf("%T.%s: a field of kind %s the test cannot change", base, f.Name, v.Kind())
		}
		if same(base, changed) || same(changed, base) {
			t.Errorf("%T.%s changed, yet the same", base, f.Name)
		}
	}
}

// What moves on its own (a device's memory and temperature, a worker's
// requests in flight and memory) is told apart from a change the store
// must have at once.
func TestMovedOnly(t *testing.T) {
	temp := 50
	g := api.GPU{ID: 0, Kind: "cuda", TotalBytes: 24 << 30, FreeBytes: 10 << 30, TemperatureC: &temp, Workers: []string{"w"}}
	w := api.Worker{WorkerID: "w", ModelRef: "m", Status: "ready", URI: "http://127.0.0.1:9", InFlight: 1, VRAMBytes: 1 << 30}
	for _, tc := range []struct {
		name  string
		gpu   func(*api.GPU)
		wk    func(*api.Worker)
		moved bool
	}{
		{"free memory", func(g *api.GPU) { g.FreeBytes -= 1 << 20 }, nil, true},
		{"allocated and reserved", func(g *api.GPU) { g.AllocatedBytes, g.ReservedBytes = 1, 2 }, nil, true},
		{"temperature", func(g *api.GPU) { g.TemperatureC = nil }, nil, true},
		{"requests in flight", nil, func(w *api.Worker) { w.InFlight = 3 }, true},
		{"worker memory", nil, func(w *api.Worker) { w.VRAMBytes = 2 << 30 }, true},
		{"total memory", func(g *api.GPU) { g.TotalBytes = 1 }, nil, false},
		{"unusable", func(g *api.GPU) { g.Unusable = "driver gone" }, nil, false},
		{"workers on the device", func(g *api.GPU) { g.Workers = nil }, nil, false},
		{"worker status", nil, func(w *api.Worker) { w.Status = "stopping" }, false},
		{"worker uri", nil, func(w *api.Worker) { w.URI = "http://127.0.0.1:10" }, false},
	} {
		g2, w2 := g, w
		if tc.gpu != nil {
			tc.gpu(&g2)
		}
		if tc.wk != nil {
			tc.wk(&w2)
		}
		if got := compareInventory([]api.GPU{g}, []api.Worker{w}, []api.GPU{g2}, []api.Worker{w2}) == inventoryMoved; got != tc.moved {
			t.Errorf("%s: moved only %v, want %v", tc.name, got, tc.moved)
		}
	}
	if compareInventory([]api.GPU{g}, []api.Worker{w}, []api.GPU{g}, nil) != inventoryChanged {
		t.Error("a worker gone: moved only")
	}
}

// A stream's beats get back the arrays nothing holds any more, and
// never ones that were handed out: a snapshot, another caller's Beat, a
// beat that came another way.
func TestSparesAreOnlyFreeArrays(t *testing.T) {
	h := newHarness(t, newFakeStore())
	h.register("p1")
	var s Spares
	n := uint64(0)
	// beat sends a full beat whose free memory moved (a change that keeps
	// the beat's arrays), through the stream (s) or not (nil).
	beat := func(s *Spares) api.Heartbeat {
		t.Helper()
		n++
		hb := api.Heartbeat{GPUs: []api.GPU{{ID: 0, TotalBytes: 100, FreeBytes: n}}, Workers: []api.Worker{{WorkerID: "w", ModelRef: "m", Status: "ready"}}}
		if s != nil {
			*s = Spares{}
		}
		b, err := h.r.HeartbeatReusing(h.ctx, "p1", hb, s)
		if err != nil || !b.Changed {
			t.Fatalf("beat %d: %+v, %v", n, b, err)
		}
		return hb
	}
	same := func(got Spares, want api.Heartbeat) bool {
		return len(got.GPUs) == 1 && &got.GPUs[0] == &want.GPUs[0] && len(got.Workers) == 1 && &got.Workers[0] == &want.Workers[0]
	}
	first := beat(&s) // the first full beat: nothing to give back
	if s.GPUs != nil || s.Workers != nil {
		t.Fatalf("first beat gave back %+v", s)
	}
	second := beat(&s)
	if !same(s, first) {
		t.Fatalf("second beat gave back %+v, want the first beat's arrays", s)
	}
	if _, ok := h.r.Get("p1"); !ok { // the snapshot holds the second beat's arrays
		t.Fatal("p1 gone")
	}
	third := beat(&s)
	if s.GPUs != nil || s.Workers != nil {
		t.Fatalf("the beat after a snapshot gave back the snapshot's arrays: %+v", s)
	}
	beat(&s)
	if !same(s, third) {
		t.Fatalf("fourth beat gave back %+v, want the third beat's arrays", s)
	}
	beat(nil) // a POST: its arrays are not the stream's
	beat(&s)
	if s.GPUs != nil || s.Workers != nil {
		t.Fatalf("the beat after a POST gave back its arrays: %+v", s)
	}
	var other Spares
	beat(&other) // a second stream of the pool (a hive restarted, say)
	if other.GPUs != nil || other.Workers != nil {
		t.Fatalf("a second stream got the first one's arrays: %+v", other)
	}
	_ = second
	// A beat that keeps nothing gives its own arrays back: unchanged, or
	// a full one equal to the last.
	last := beat(&s)
	unchanged := api.Heartbeat{Unchanged: true, GPUs: make([]api.GPU, 0, 2)}
	if _, err := h.r.HeartbeatReusing(h.ctx, "p1", unchanged, &s); err != nil {
		t.Fatal(err)
	}
	if cap(s.GPUs) != 2 {
		t.Fatalf("an unchanged beat gave back %+v, want its own arrays", s)
	}
	repeat := api.Heartbeat{GPUs: slices.Clone(last.GPUs), Workers: slices.Clone(last.Workers)}
	if b, err := h.r.HeartbeatReusing(h.ctx, "p1", repeat, &s); err != nil || b.Changed {
		t.Fatalf("repeated beat: %+v, %v", b, err)
	}
	if !same(s, repeat) {
		t.Fatalf("a repeated beat gave back %+v, want its own arrays", s)
	}
	// Another caller's Beat holds the workers the stream brought.
	beat(&s)
	if _, err := h.r.Heartbeat(h.ctx, "p1", api.Heartbeat{Unchanged: true}); err != nil {
		t.Fatal(err)
	}
	beat(&s)
	if s.GPUs != nil || s.Workers != nil {
		t.Fatalf("the beat after another caller's Beat gave back its workers: %+v", s)
	}
}

// A stream that decodes into the arrays it gets back, as the queen's
// does, never changes what a snapshot, a flush or a status change holds,
// however they interleave (run with -race, it also sees the memory).
func TestSparesNeverChangeWhatIsHandedOut(t *testing.T) {
	st := newFakeStore()
	h := newHarness(t, st)
	h.register("p1")
	const beats = 2000
	var wg sync.WaitGroup
	wg.Go(func() {
		var s Spares
		for n := range beats {
			clear(s.GPUs[:cap(s.GPUs)])
			clear(s.Workers[:cap(s.Workers)])
			hb := api.Heartbeat{GPUs: append(s.GPUs[:0], api.GPU{ID: 0, TotalBytes: 1 << 40, FreeBytes: uint64(n)}),
				Workers: append(s.Workers[:0], api.Worker{WorkerID: "w", ModelRef: "m", Status: "ready", InFlight: n})}
			s = Spares{}
			if _, err := h.r.HeartbeatReusing(h.ctx, "p1", hb, &s); err != nil {
				t.Error(err)
				return
			}
		}
	})
	check := func(p Pool) {
		if len(p.GPUs) == 0 {
			return
		}
		free, inFlight := p.GPUs[0].FreeBytes, p.Workers[0].InFlight
		runtime.Gosched()
		if p.GPUs[0].FreeBytes != free || p.Workers[0].InFlight != inFlight || uint64(inFlight) != free {
			t.Errorf("a snapshot changed under its holder: free %d then %d, in flight %d then %d", free, p.GPUs[0].FreeBytes,
				inFlight, p.Workers[0].InFlight)
		}
	}
	wg.Go(func() {
		for range beats / 4 {
			if p, ok := h.r.Get("p1"); ok {
				check(p)
			}
			for _, p := range h.r.Query(Filter{Model: "m"}) {
				check(p)
			}
			if err := h.r.Flush(h.ctx); err != nil {
				t.Error(err)
			}
		}
	})
	wg.Go(func() {
		for i := range beats / 100 {
			p, err := h.r.Drain(h.ctx, "p1", "admin", "test")
			if i%2 == 1 {
				p, err = h.r.Undrain(h.ctx, "p1", "admin", "test")
			}
			if err != nil {
				t.Error(err)
				return
			}
			check(p)
		}
	})
	wg.Wait()
}
