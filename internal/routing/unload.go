package routing

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/apiary-llm/apiary/internal/lifecycle"
	"github.com/apiary-llm/apiary/internal/openai"
	"github.com/apiary-llm/apiary/internal/registry"
)

// Unload stops every live worker of model (on pool, when it names one)
// with stop, and returns once their rows have ended (as Ollama
// answers an unload once the model is out of memory); each finishes the
// requests it serves first. A model the config pins, or keeps
// min_workers of, is refused with 409: its workers would only be started
// again.
//
// stop stops one worker by its lifecycle id, audited as the caller's
// (the queen's for an Ollama client's unload, an admin's from the
// dashboard); a row that ended meanwhile is no error. stopped are the
// lifecycle ids of the workers it stopped.
func (s *Service) Unload(ctx context.Context, model, pool string, stop func(ctx context.Context, lifecycleID string) error) (stopped []string, err error) {
	switch {
	case s.pinned(model):
		return nil, &openai.Error{Status: http.StatusConflict, Code: "model_pinned",
			Message: fmt.Sprintf("model %s is pinned by the queen's config: it stays loaded; an operator stops its workers (apiary workers stop)", s.nameOf(model))}
	case s.cp.Replicas()[model].Min > 0:
		return nil, &openai.Error{Status: http.StatusConflict, Code: "model_kept",
			Message: fmt.Sprintf("the queen's config keeps %d workers of model %s running (min_workers): they would be started again", s.cp.Replicas()[model].Min, s.nameOf(model))}
	}
	var failed []string
	for _, p := range s.cp.Pools(registry.Filter{}) {
		if pool != "" && p.ID != pool {
			continue
		}
		for _, wk := range p.Workers {
			if wk.ModelRef != model || wk.LifecycleID == "" || !live(wk) || lifecycle.State(wk.Status) == lifecycle.Draining {
				continue
			}
			if err := stop(ctx, wk.LifecycleID); err != nil {
				s.log.Warn("unload could not stop a worker", "model_ref", model, "lifecycle_id", wk.LifecycleID, "pool_id", p.ID, "err", err)
				failed = append(failed, p.ID)
				continue
			}
			stopped = append(stopped, wk.LifecycleID)
		}
	}
	if len(failed) > 0 {
		return stopped, &openai.Error{Status: http.StatusServiceUnavailable, Code: openai.CodeServiceUnavailable, RetryAfter: time.Second,
			Message: fmt.Sprintf("model %s is not unloaded: %d of its workers could not be stopped now; try again", s.nameOf(model), len(failed))}
	}
	for _, id := range stopped {
		for {
			changed := s.changes.wait()
			row, err := s.cp.Row(ctx, id)
			if err != nil || row.Status == lifecycle.StatusStopped || row.Status == lifecycle.StatusFailed {
				break
			}
			select {
			case <-ctx.Done():
				return stopped, fmt.Errorf("%w: while its workers stopped: %w", errClientGone, ctx.Err())
			case <-changed:
			case <-time.After(evictPoll):
			}
		}
	}
	return stopped, nil
}
