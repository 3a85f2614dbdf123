package registry

import (
	"errors"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/apiary-llm/apiary/internal/api"
)

// registerAs registers pool id from hive instance at endpoint.
func (h *harness) registerAs(id, endpoint, instance string) error {
	_, err := h.r.Register(h.ctx, api.RegisterPool{PoolID: id, Endpoint: endpoint, NodeID: id, Version: "t", Instance: instance}, "hive:"+id)
	return err
}

// restart closes h's registry and loads another from the same store, as
// a queen that restarts does.
func (h *harness) restart(t *testing.T) *harness {
	h.r.Close()
	h2 := newHarness(t, h.st)
	if err := h2.r.Load(h2.ctx); err != nil {
		t.Fatal(err)
	}
	return h2
}

func isHeld(err error) bool {
	var he *HeldError
	return errors.As(err, &he)
}

// After a queen restart, a second hive with the pool id of a live one was
// refused registration, but its other calls were taken (the holder's
// instance was not kept, and an unknown holder let everyone through): its
// going offline took the live pool down. The holder is now stored: after
// a restart the restored pool is held by it until the lease the restart
// gave it runs out, the other hive's registration and messages are
// refused, the holder's are taken, and once the lease lapses unrenewed the
// pool can be taken over.
func TestRestoredPoolIsHeld(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, newFakeStore())
		if err := h.registerAs("p", "http://a:1", "hive-a"); err != nil {
			t.Fatal(err)
		}
		if err := h.r.Flush(h.ctx); err != nil {
			t.Fatal(err)
		}
		h = h.restart(t)
		if p, _ := h.r.Get("p"); p.Instance != "hive-a" {
			t.Fatalf("restored holder %q, want hive-a", p.Instance)
		}
		if err := h.registerAs("p", "http://b:1", "hive-b"); !isHeld(err) {
			t.Errorf("another hive registering a restored pool: %v, want a HeldError", err)
		}
		for _, instance := range []string{"hive-b", ""} {
			if err := h.r.CheckHolder("p", instance); !isHeld(err) {
				t.Errorf("message of instance %q for the restored pool: %v, want a HeldError", instance, err)
			}
		}
		if err := h.r.CheckHolder("p", "hive-a"); err != nil {
			t.Errorf("the holder's message: %v", err)
		}
		advance(ttl - time.Millisecond)
		if err := h.registerAs("p", "http://b:1", "hive-b"); !isHeld(err) {
			t.Errorf("another hive just before the restored lease ends: %v, want a HeldError", err)
		}
		advance(time.Millisecond)
		if err := h.registerAs("p", "http://b:1", "hive-b"); err != nil {
			t.Errorf("another hive after the restored lease lapsed unrenewed: %v", err)
		}
		if err := h.r.CheckHolder("p", "hive-a"); !isHeld(err) {
			t.Errorf("the old holder's message after the takeover: %v, want a HeldError", err)
		}
	})
}

// The README's stop line (hive and queen stopped together) left the pool
// healthy when the queen came back, with no hive behind it. A pool
// restored live is unhealthy until its hive beats or answers (audited,
// and stored at the next flush), keeps its lease for the heartbeat
// timeout and the grace, then loses its workers as a silent pool does.
func TestRestoredPoolIsUnhealthyUntilItsHiveIsHeardFrom(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		h := newHarness(t, st)
		for _, id := range []string{"beats", "answers", "silent", "other"} {
			if err := h.registerAs(id, "http://"+id+":1", "hive-"+id); err != nil {
				t.Fatal(err)
			}
		}
		h = h.restart(t)
		for _, id := range []string{"beats", "answers", "silent", "other"} {
			if got := h.status(id); got != Unhealthy {
				t.Errorf("%s restored %s, want unhealthy", id, got)
			}
		}
		if err := h.r.Flush(h.ctx); err != nil {
			t.Fatal(err)
		}
		if got := st.status("silent"); got != string(Unhealthy) {
			t.Errorf("stored status of a restored pool %q, want unhealthy", got)
		}
		if diff := cmp.Diff([]string{"pool.register", "pool.unhealthy"}, st.actions("silent")); diff != "" {
			t.Errorf("audit of a restored pool (-want +got):\n%s", diff)
		}

		if b := h.beat("beats"); b.Status != Healthy || !b.FullInventory {
			t.Errorf("first beat of a restored pool: %+v", b)
		}
		if back, err := h.r.Answered(h.ctx, "answers", "hive-someone"); back || err != nil {
			t.Errorf("another instance answering for a restored pool brought it back: %v %v", back, err)
		}
		if back, err := h.r.Answered(h.ctx, "answers", "hive-answers"); !back || err != nil {
			t.Errorf("the holder answering did not bring its pool back: %v %v", back, err)
		}
		if got := h.status("answers"); got != Healthy {
			t.Errorf("pool whose holder answered: %s", got)
		}
		if back, _ := h.r.Answered(h.ctx, "answers", "hive-answers"); back {
			t.Error("Answered brought back a pool that was back already")
		}
		if diff := cmp.Diff([]string{"pool.register", "pool.unhealthy", "pool.healthy"}, st.actions("answers")); diff != "" {
			t.Errorf("audit of the pool whose hive answered (-want +got):\n%s", diff)
		}

		advance(ttl + grace - time.Millisecond)
		if got := h.lostCalls(); len(got) != 0 {
			t.Errorf("workers lost before the timeout and the grace: %v", got)
		}
		h.beat("beats")
		if _, err := h.r.Heartbeat(h.ctx, "answers", api.Heartbeat{}); err != nil {
			t.Fatal(err)
		}
		advance(time.Millisecond)
		var lost []string
		for _, c := range h.lostCalls() {
			lost = append(lost, c.pool)
		}
		slices.Sort(lost)
		if diff := cmp.Diff([]string{"other", "silent"}, lost); diff != "" {
			t.Errorf("pools lost after the timeout and the grace (-want +got):\n%s", diff)
		}
	})
}

// A pool stored by a queen that kept no holder has none (""): a message
// that names an instance is refused, so that its hive registers again
// (its endpoint tells it from another hive); one that names none is not.
func TestUnknownHolderLetsNoInstanceThrough(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, newFakeStore())
		if err := h.registerAs("p", "http://a:1", ""); err != nil {
			t.Fatal(err)
		}
		h = h.restart(t)
		if err := h.r.CheckHolder("p", "hive-x"); !isHeld(err) {
			t.Errorf("an instance's message for a pool with no known holder: %v, want a HeldError", err)
		}
		if err := h.r.CheckHolder("p", ""); err != nil {
			t.Errorf("a message naming no instance: %v", err)
		}
		if err := h.registerAs("p", "http://b:1", "hive-b"); !isHeld(err) {
			t.Errorf("another endpoint registering: %v, want a HeldError", err)
		}
		if err := h.registerAs("p", "http://a:1", "hive-a"); err != nil {
			t.Errorf("the holder's endpoint registering again: %v", err)
		}
		if err := h.r.CheckHolder("p", "hive-a"); err != nil {
			t.Errorf("the holder's message after it registered: %v", err)
		}
	})
}
