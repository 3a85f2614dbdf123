package queen

import (
	"context"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/fleet"
	"github.com/apiary-llm/apiary/internal/store"
)

// Cascading shutdown (docs/ownership.md): SIGTERM to the queen, or
// POST /api/admin/shutdown, or the end of the queen's own lifeline (its
// keeper is gone) → every hive the queen started stops its workers and
// exits (Fleet.StopAll, the queen still serving so their last events
// arrive) → the queen stops serving and exits. Hives it did not start are
// left running.

// startOwned loads the nodes, starts the hives the queen owns and watches
// its lifeline; cancel stops the queen. The returned stop is step 0 of the
// queen's shutdown: it cascades the owned hives and waits for them.
func (q *Queen) startOwned(cancel context.CancelFunc) (stop func()) {
	own := q.cfg.Ownership
	q.fleet = fleet.New(fleet.Config{Hives: own.Hives, DataDir: q.cfg.DataDir, HeartbeatTimeout: q.cfg.HeartbeatTimeout,
		TLS: q.cfg.TLS, ClusterToken: q.cfg.Tokens.Cluster, Logger: q.log}, controlPlane{q})
	var nodes []store.Node
	ctx, done := context.WithTimeout(context.Background(), 30*time.Second)
	err := q.st.View(ctx, func(tx *store.Tx) (err error) { nodes, err = tx.Nodes(); return err })
	done()
	if err != nil {
		q.log.Error("cannot read the nodes; starting no hive on them", "err", err)
	}
	q.log.Info("ownership", "owner", own.Owner, "local_hive", own.LocalHive, "nodes", len(nodes))
	q.fleet.Start(nodes)

	var wg sync.WaitGroup
	closing := make(chan struct{})
	if own.Lifeline != nil {
		wg.Go(func() {
			_, err := io.Copy(io.Discard, own.Lifeline)
			select {
			case <-closing:
				return
			default:
			}
			q.log.Warn("lifeline to the parent ended; the queen's owner is gone, shutting down with every hive it started",
				"owner", own.Owner, "err", err)
			cancel()
		})
	}
	return func() {
		start := time.Now()
		q.fleet.StopAll()
		q.log.Info("hives of the queen stopped", "took", time.Since(start).Round(time.Millisecond).String())
		close(closing)
		if own.Lifeline != nil {
			_ = own.Lifeline.Close()
		}
		wg.Wait()
		q.fleet.Close()
	}
}

// requestStop asks the running queen to shut down; it does not wait.
func (q *Queen) requestStop() {
	q.stopMu.Lock()
	stop := q.stop
	q.stopMu.Unlock()
	if stop != nil {
		stop()
	}
}

func (q *Queen) postShutdown(w http.ResponseWriter, r *http.Request, c caller) error {
	var req api.ShutdownRequest
	if err := api.Decode(r, &req, true); err != nil {
		return err
	}
	reason := "shutdown requested"
	if req.Reason != "" {
		var err error
		if reason, err = checkReason(req.Reason); err != nil {
			return err
		}
	}
	hives := q.fleet.Names()
	wctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 10*time.Second)
	defer cancel()
	if err := q.st.Update(wctx, func(tx *store.Tx) error {
		_, err := tx.Append(store.AuditEntry{Actor: c.actor, Action: "queen.shutdown", Target: "queen", Reason: reason,
			Metadata: map[string]any{"hives": hives}})
		return err
	}); err != nil {
		q.log.Error("cannot audit the shutdown request; shutting down all the same", "err", err)
	}
	q.log.Info("shutdown requested", "by", c.actor, "reason", reason, "hives", hives)
	if hives == nil {
		hives = []string{}
	}
	api.WriteJSON(w, http.StatusAccepted, api.ShutdownResponse{Status: "shutting_down", Hives: hives})
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
	q.requestStop()
	return nil
}
