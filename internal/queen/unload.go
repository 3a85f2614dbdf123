package queen

import (
	"context"
	"errors"
	"net/http"

	"github.com/apiary-llm/apiary/internal/api"
)

// postModelUnload stops every live worker of a model (POST
// /api/admin/models/{name}/unload, the dashboard's Unload): each drains,
// its row says who unloaded it and why, and the audit has a worker.stop
// entry by the caller with the reason. The answer comes once their rows
// have ended. A model the config pins or keeps min_workers of is refused
// 409, with why (routing's Unload, which Ollama's keep_alive 0 uses too).
func (q *Queen) postModelUnload(w http.ResponseWriter, r *http.Request, c caller) error {
	name := r.PathValue("name")
	if err := checkModel(name); err != nil {
		return err
	}
	var req api.UnloadRequest
	if err := api.Decode(r, &req, false); err != nil {
		return err
	}
	reason, err := checkReason(req.Reason)
	if err != nil {
		return err
	}
	if req.PoolID != "" {
		if err := checkID("pool_id", req.PoolID); err != nil {
			return err
		}
	}
	ref := q.models.resolve(name)
	stopped, err := q.routing.Unload(r.Context(), ref, req.PoolID, func(ctx context.Context, id string) error {
		_, err := q.stopWorker(ctx, id, stopOrder{drain: true, reason: reason, actor: c.actor, action: "worker.stop",
			meta: map[string]any{"unload": q.models.shown(ref)}, rowReason: "unloaded by " + c.actor + ": " + reason})
		if errors.Is(err, ErrRowEnded) {
			return nil
		}
		return err
	})
	if err != nil {
		return err
	}
	if stopped == nil {
		stopped = []string{}
	}
	api.WriteJSON(w, http.StatusOK, api.UnloadAnswer{Model: q.models.shown(ref), Stopped: stopped})
	return nil
}
