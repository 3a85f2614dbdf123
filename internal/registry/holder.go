package registry

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/store"
)

// A pool is held by one hive process at a time: the instance of its last
// registration (api.RegisterPool.Instance), which the store keeps across
// queen restarts. Another hive with the pool's id is refused while the
// holder is alive, and so is every later message of a hive that does not
// hold the pool (CheckHolder). A pool the queen restored at its start is
// unhealthy until its hive is heard from, and held by its stored holder
// for the lease the restart gave it.

// HeldError refuses a hive's registration, or its later messages, for a
// pool that another hive holds: two hives with one pool id (the clones of
// one machine, or one --pool-id given twice) would otherwise take turns
// at it, and each one's heartbeats would mark the other's workers lost.
// The queen answers it 409 pool_id_in_use.
type HeldError struct {
	PoolID string
	Holder Pool // the holder as it last registered and beat
	// Registering is true for a refused registration, false for a
	// message of a hive that no longer holds the pool.
	Registering bool
}

func (e *HeldError) Error() string {
	h := e.Holder
	holder := fmt.Sprintf("the hive at %s (node %q, last heartbeat %s ago)", h.Endpoint, h.NodeID,
		time.Since(h.LastHeartbeatAt).Round(time.Millisecond))
	if e.Registering {
		return fmt.Sprintf("pool id %q is held by %s, which is alive; two hives cannot share a pool id: "+
			"start this hive with its own --pool-id (the pool can be taken over once its holder stops beating)", e.PoolID, holder)
	}
	return fmt.Sprintf("pool id %q is held by another hive now, %s; this hive's messages for it are refused: "+
		"it must register again, and needs its own --pool-id while that one is alive", e.PoolID, holder)
}

// HTTPStatus and ErrorCode make a HeldError a 409 pool_id_in_use.
func (e *HeldError) HTTPStatus() int   { return http.StatusConflict }
func (e *HeldError) ErrorCode() string { return "pool_id_in_use" }

// EndpointError refuses a hive's registration at an endpoint that
// another pool's live hive registered: the queen would send one pool's
// starts and stops to the other's hive (two hives that advertise the same
// loopback address from two machines, say). The queen answers it 409
// endpoint_in_use. The holder's endpoint becomes free when its lease runs
// out (it stopped beating) or it goes offline.
type EndpointError struct {
	Endpoint string
	Holder   Pool // the pool that registered the endpoint
}

func (e *EndpointError) Error() string {
	h := e.Holder
	return fmt.Sprintf("endpoint %s is registered by pool %q (node %q, last heartbeat %s ago), which is alive; "+
		"two pools cannot share an endpoint: give this hive its own address (hive --advertise), "+
		"or stop the hive of pool %q first", e.Endpoint, h.ID, h.NodeID, time.Since(h.LastHeartbeatAt).Round(time.Millisecond), h.ID)
}

// HTTPStatus and ErrorCode make an EndpointError a 409 endpoint_in_use.
func (e *EndpointError) HTTPStatus() int   { return http.StatusConflict }
func (e *EndpointError) ErrorCode() string { return "endpoint_in_use" }

// endpointHolderLocked returns the pool other than reg's whose live hive
// registered reg's endpoint, unless it is the hive registering (the same
// instance, under a new pool id); nil when none. A pool whose lease ran
// out, or that went offline, holds nothing: a hive restarted at the same
// address with another pool id registers once the old one stops beating.
// The caller holds mu.
func (r *Registry) endpointHolderLocked(reg api.RegisterPool, now time.Time) *entry {
	for id, e := range r.pools {
		if id == reg.PoolID || e.Endpoint != reg.Endpoint || reg.Instance != "" && reg.Instance == e.Instance {
			continue
		}
		if e.heldLocked(now) {
			return e
		}
	}
	return nil
}

// sameHive reports whether reg comes from the hive that holds p: the same
// hive process (instance), or a hive at the same endpoint (the same hive
// restarted: two live hives cannot listen at one address).
func sameHive(p Pool, reg api.RegisterPool) bool {
	return reg.Instance != "" && reg.Instance == p.Instance || reg.Endpoint == p.Endpoint
}

// restoreLocked makes a pool loaded live unhealthy until its hive is
// heard from (see Load). The change reaches the store, with its audit
// entry, at the next flush: Load writes nothing.
func (r *Registry) restoreLocked(e *entry, now time.Time) {
	from := e.Status
	reason := fmt.Sprintf("the queen restarted; its hive has not been heard from since (last heartbeat %s before)",
		now.Sub(e.LastHeartbeatAt).Round(time.Millisecond))
	e.Status, e.StatusChangedAt = Unhealthy, now
	e.restored, e.heldUntil, e.lostPending, e.statusDirty = true, now.Add(r.cfg.HeartbeatTimeout), true, true
	r.pendingAudit = append(r.pendingAudit, store.AuditEntry{TS: now, Actor: ActorQueen, Action: "pool.unhealthy", Target: e.ID,
		Reason: reason, Metadata: map[string]any{"from": string(from), "to": string(Unhealthy)}})
	r.armLocked(e, r.cfg.HeartbeatTimeout+r.cfg.UnhealthyGrace)
	r.log.Info("pool status changed", "pool_id", e.ID, "from", from, "to", Unhealthy, "reason", reason, "actor", ActorQueen)
}

// heldLocked reports whether e's holder holds it against another hive:
// its lease runs (healthy, draining), or it was restored and the lease
// the restart gave it has not run out. The caller holds mu.
func (e *entry) heldLocked(now time.Time) bool {
	return e.Status == Healthy || e.Status == Draining || e.restored && now.Before(e.heldUntil)
}

// Awaited returns the pools restored at the queen's start (see Load)
// whose hives have not been heard from yet while the lease the restart
// gave them runs: their workers are presumed alive, and requests for them
// wait for their hives rather than being refused as by a pool that is
// down.
func (r *Registry) Awaited() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	now := time.Now()
	var ids []string
	for _, e := range r.order {
		if e.restored && e.Status == Unhealthy && now.Before(e.heldUntil) {
			ids = append(ids, e.ID)
		}
	}
	return ids
}

// CheckHolder refuses (*HeldError) a message of hive instance for pool id
// when it does not come from the hive that holds the pool: a hive that
// was refused or taken over must not report workers (its heartbeats would
// mark the holder's workers lost), nor take the pool offline. The holder
// is the instance of the pool's last registration, kept across queen
// restarts. A message that names no instance (a hive that sends none) is
// refused only when the holder has one; one that names an instance for a
// pool whose holder is not known by one (stored by an older queen) is
// refused too, and its hive registers again (where its endpoint tells the
// holder apart). A message for an unknown pool is not refused here.
func (r *Registry) CheckHolder(id, instance string) error {
	r.mu.RLock()
	defer r.mu.RUnlock()
	e := r.pools[id]
	if e == nil || e.Instance == instance {
		return nil
	}
	e.beat.Lock() // LastHeartbeatAt is a lease field
	defer e.beat.Unlock()
	return &HeldError{PoolID: id, Holder: e.lend()}
}

// Answered brings back a pool restored at the queen's start (see Load)
// whose hive answered a call of the queen before its first heartbeat: a
// hive that answers at the pool's endpoint as the pool's holder (instance,
// or any hive when the holder is not known by one) is alive, and its
// pool is routed to again at once rather than at its next heartbeat. Its
// lease starts; its inventory is still awaited. Any other pool is left as
// it is (false).
func (r *Registry) Answered(ctx context.Context, id, instance string) (bool, error) {
	defer r.lockWrite()()
	if r.closed {
		return false, ErrClosed
	}
	e := r.pools[id]
	if e == nil || !e.restored || e.Status != Unhealthy || e.Instance != "" && e.Instance != instance {
		return false, nil
	}
	next := e.lend()
	next.Status = live(e.Drained)
	err := r.changeLocked(ctx, e, next, change{actor: "hive:" + id, action: "pool." + string(next.Status),
		reason: "its hive answered the queen after the queen restarted"}, false)
	if err != nil {
		return false, err
	}
	e.restored, e.lostPending = false, false
	r.armLocked(e, r.cfg.HeartbeatTimeout)
	return true, nil
}
