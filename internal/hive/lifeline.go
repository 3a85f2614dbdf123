package hive

import (
	"context"
	"io"
	"time"

	"github.com/apiary-llm/apiary/internal/procs"
	"github.com/apiary-llm/apiary/internal/secret"
)

// Who started a hive decides what ends it (docs/ownership.md, "Who owns
// what"). An operator's hive lives until the operator stops it: a queen
// that goes away is not its business, it keeps serving and registers again
// when a queen answers. A hive that a queen (over SSH, or as a local child)
// or a keeper started belongs to that process and must not outlive it: it
// shuts down with its workers when its lifeline closes (the SSH session or
// the parent's pipe on its stdin) or when its lease on the queen ends (no
// answered heartbeat for LeaseTimeout, which covers a queen that died
// behind a network that no longer says so).

// Owners of a hive.
const (
	OwnerOperator = "operator" // started by a person or a service manager
	OwnerQueen    = "queen"    // started by a queen, over SSH or as its child
	OwnerKeeper   = "keeper"   // started by `apiary infer` in ephemeral mode
)

// validOwner reports whether s names an owner.
func validOwner(s string) bool {
	return s == OwnerOperator || s == OwnerQueen || s == OwnerKeeper
}

// Owner is who started the hive.
func (h *Hive) Owner() string { return h.cfg.Owner }

// LifelineEnv lists the variables a parent may hand a hive in the
// preamble of its lifeline (procs.ReadPreamble) instead of on its command
// line, where every user of the machine could read them.
var LifelineEnv = []string{secret.ClusterTokenEnv, secret.HFTokenEnv}

// watchLifeline reads the lifeline until it ends. An end the hive did not
// cause (EOF, a read error before closeLifeline) means the parent is gone:
// the hive shuts down.
func (h *Hive) watchLifeline(closing <-chan struct{}) {
	defer close(h.lifelineEnded)
	asked, err := procs.AwaitLifeline(h.cfg.Lifeline)
	select {
	case <-closing:
		return
	default:
	}
	if asked {
		h.log.Info("the hive's owner asks it to stop: shutting down with every worker", "owner", h.cfg.Owner)
		h.Shutdown()
		return
	}
	if err == nil {
		err = io.EOF
	}
	h.log.Warn("lifeline to the parent ended; the hive's owner is gone, shutting down with every worker",
		"owner", h.cfg.Owner, "err", err)
	h.leaving.Store(true)
	h.Shutdown()
}

// renewLease records an answered heartbeat; it never blocks.
func (h *Hive) renewLease() {
	if h.lease == nil {
		return
	}
	select {
	case h.lease <- struct{}{}:
	default:
	}
}

// watchLease shuts the hive down when no heartbeat was answered for
// LeaseTimeout, counting from the start. It returns when ctx ends.
func (h *Hive) watchLease(ctx context.Context) {
	t := time.NewTimer(h.cfg.LeaseTimeout)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-h.lease:
			t.Reset(h.cfg.LeaseTimeout)
		case <-t.C:
			h.log.Warn("lease on the queen ended: no heartbeat answered in time; the hive's owner is gone, shutting down with every worker",
				"owner", h.cfg.Owner, "lease_timeout", h.cfg.LeaseTimeout.String())
			h.leaving.Store(true)
			h.Shutdown()
			return
		}
	}
}

// ownerLoops starts the lifeline and lease watchers of a hive that belongs
// to another process, on g; stop ends them (closing the lifeline).
func (h *Hive) ownerLoops(goFn func(func()), ctx context.Context) (stop func()) {
	closing := make(chan struct{})
	if h.cfg.Lifeline != nil {
		goFn(func() { h.watchLifeline(closing) })
	}
	if h.lease != nil {
		goFn(func() { h.watchLease(ctx) })
	}
	return func() {
		close(closing)
		if h.cfg.Lifeline != nil {
			_ = h.cfg.Lifeline.Close()
		}
	}
}
