package hive

import (
	"context"
	"fmt"

	"github.com/apiary-llm/apiary/internal/secret"
)

// Settled is closed once the hive serves and its first registration with
// the queen was tried: taken (registered) or not (the hive works
// standalone until the queen answers); at Ready for a hive without a queen.
func (h *Hive) Settled() <-chan struct{} { return h.settled }

func (h *Hive) settle() { h.settleOnce.Do(func() { close(h.settled) }) }

// Alive asks the hive's own listener for /health: nil while its HTTP
// server accepts and answers. Valid after Ready; the service manager's
// watchdog is pinged only while it holds.
func (h *Hive) Alive(ctx context.Context) error {
	return h.cfg.TLS.ProbeSelf(ctx, h.addr, "/health")
}

// Summary is one line on the hive's state for the service manager
// (systemctl status): its pool, its live workers, and its queen. Valid
// after Ready.
func (h *Hive) Summary() string {
	queen := "none (standalone)"
	if h.queen != nil {
		base := secret.RedactURL(h.queen.base())
		queen = "registered at " + base
		if !h.queen.up.Load() {
			queen = "standalone, " + base + " does not take this hive's messages"
		}
	}
	return fmt.Sprintf("pool %s serving at %s; workers: %d live; queen: %s", h.cfg.PoolID, h.URL(), len(h.reg.liveWorkers()), queen)
}
