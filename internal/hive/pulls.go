package hive

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/modelstore"
	"github.com/apiary-llm/apiary/internal/openai"
)

// Sentinel errors of the pull endpoints.
var (
	ErrPullConflict = openai.Sentinel(http.StatusConflict, "pull_in_progress", "another pull of this model is under way")
	ErrModelExists  = openai.Sentinel(http.StatusConflict, "model_exists", "model already exists")
	ErrPullNotFound = openai.Sentinel(http.StatusNotFound, "pull_not_found", "pull not found")
	ErrHubRefused   = openai.Sentinel(http.StatusForbidden, "hub_refused", "the Hub refused access")
)

// maxEndedPulls bounds the ended pulls a hive remembers (GET
// /v2/models/pulls); the oldest are forgotten first.
const maxEndedPulls = 64

// pulls runs the hive's model pulls in the background, one per model at a
// time, and keeps their progress. Each pull's goroutine is counted in wg
// and ends with the hive's pull context.
type pulls struct {
	h      *Hive
	ctx    context.Context // canceled when the hive shuts down
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu    sync.Mutex
	byID  map[string]*api.ModelPull // guarded by mu: running ones and the last maxEndedPulls ended
	order []string                  // guarded by mu: ids by start
}

func newPulls(h *Hive) *pulls {
	ctx, cancel := context.WithCancel(context.Background())
	return &pulls{h: h, ctx: ctx, cancel: cancel, byID: map[string]*api.ModelPull{}}
}

// close cancels the pulls under way (their partial files stay, to be
// resumed) and waits for them.
func (p *pulls) close() {
	p.cancel()
	p.wg.Wait()
}

// start resolves req's ref (so that an unknown model or quantization is
// answered at once) and starts its pull. A pull of the same model from the
// same ref under way is answered as it is (started false); from another
// ref it is ErrPullConflict.
func (p *pulls) start(ctx context.Context, req api.PullModelRequest) (st api.ModelPull, started bool, err error) {
	hub := modelstore.HubFromEnv()
	if tok := p.h.cfg.HFToken; tok != "" {
		hub.Token = tok
	}
	src, err := modelstore.ResolveSource(ctx, nil, hub, req.Ref)
	if err != nil {
		return api.ModelPull{}, false, pullError(err)
	}
	name := req.Name
	if name == "" {
		name = src.Name
	}
	if err := modelstore.CheckRef(name); err != nil {
		return api.ModelPull{}, false, fmt.Errorf("%w: %w", ErrInvalidModelRef, err)
	}
	model := src.ModelRef(name)
	if req.Exact && model != name {
		return api.ModelPull{}, false, fmt.Errorf("%w: %s is a split model of %d parts, served as %s (its first part's name), not %s; name it %s (in the queen's model config, file: %s)",
			ErrInvalidModelRef, req.Ref, len(src.Files), model, name, model, model)
	}
	if !req.Force {
		if path, err := modelstore.Path(p.h.cfg.ModelsDir, model); err == nil {
			if _, err := os.Lstat(path); err == nil {
				return api.ModelPull{}, false, fmt.Errorf("%w: %s (force replaces it)", ErrModelExists, model)
			}
		}
	}
	if err := os.MkdirAll(p.h.cfg.ModelsDir, 0o755); err != nil {
		return api.ModelPull{}, false, fmt.Errorf("models directory: %w", err)
	}

	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ctx.Err() != nil {
		return api.ModelPull{}, false, ErrShuttingDown
	}
	for _, id := range p.order {
		if q := p.byID[id]; q.State == api.PullRunning && q.Model == model {
			if q.Ref == req.Ref {
				return *q, false, nil
			}
			return api.ModelPull{}, false, fmt.Errorf("%w: %s is being pulled from %s", ErrPullConflict, model, q.Ref)
		}
	}
	pull := &api.ModelPull{ID: newPullID(), PoolID: p.h.cfg.PoolID, Ref: req.Ref, Model: model, State: api.PullRunning,
		TotalBytes: src.Size(), StartedAt: time.Now().UTC()}
	p.byID[pull.ID] = pull
	p.order = append(p.order, pull.ID)
	p.pruneLocked()
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		p.run(pull.ID, src, modelstore.PullOptions{Ref: req.Name, Overwrite: req.Force, Hub: hub, Source: &src})
	}()
	return *pull, true, nil
}

// run pulls one model and records how it ended; the queen hears of it.
func (p *pulls) run(id string, src modelstore.Source, opts modelstore.PullOptions) {
	log := p.h.log.With("pull_id", id, "ref", src.Ref)
	log.Info("model pull started")
	opts.StallTimeout = p.h.cfg.PullStallTimeout
	opts.Retrying = func(r modelstore.Retry) {
		log.Warn("model pull resuming: "+r.String(), "file", r.File, "resume_at", r.Resume, "delay", r.Delay.String(), "err", r.Err)
	}
	opts.Progress = func(pr modelstore.Progress) {
		p.mu.Lock()
		defer p.mu.Unlock()
		q := p.byID[id]
		q.WrittenBytes, q.ResumedBytes, q.TotalBytes = pr.Written, pr.Resumed, pr.Total
	}
	m, err := modelstore.Pull(p.ctx, p.h.cfg.ModelsDir, src.Ref, opts)
	now := time.Now().UTC()
	p.mu.Lock()
	q := p.byID[id]
	q.EndedAt = &now
	if err != nil {
		q.State, q.Error = api.PullFailed, err.Error()
	} else {
		q.State, q.Model, q.WrittenBytes, q.TotalBytes = api.PullDone, m.Ref, m.Size, m.Size
	}
	ended := *q
	p.pruneLocked()
	p.mu.Unlock()
	if err != nil {
		log.Warn("model pull failed", "err", err)
	} else {
		log.Info("model pulled", "model_ref", m.Ref, "size", m.Size, "took", now.Sub(ended.StartedAt).Round(time.Millisecond).String())
	}
	if p.h.queen != nil {
		p.h.queen.reportPull(p.ctx, ended)
	}
}

// pruneLocked forgets the oldest ended pulls beyond maxEndedPulls.
func (p *pulls) pruneLocked() {
	ended := 0
	for _, id := range p.order {
		if p.byID[id].State != api.PullRunning {
			ended++
		}
	}
	p.order = slices.DeleteFunc(p.order, func(id string) bool {
		if ended > maxEndedPulls && p.byID[id].State != api.PullRunning {
			ended--
			delete(p.byID, id)
			return true
		}
		return false
	})
}

// list returns the pulls, oldest first.
func (p *pulls) list() []api.ModelPull {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]api.ModelPull, 0, len(p.order))
	for _, id := range p.order {
		out = append(out, *p.byID[id])
	}
	return out
}

func (p *pulls) get(id string) (api.ModelPull, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	q, ok := p.byID[id]
	if !ok {
		return api.ModelPull{}, false
	}
	return *q, true
}

// pullError gives a resolution's error the status it is answered with.
func pullError(err error) error {
	switch {
	case errors.Is(err, modelstore.ErrBadURL), errors.Is(err, modelstore.ErrBadRef):
		return &api.RequestError{Status: http.StatusBadRequest, Code: "invalid_ref", Err: err}
	case errors.Is(err, modelstore.ErrNoModel):
		return fmt.Errorf("%w: %w", ErrModelNotFound, err)
	case errors.Is(err, modelstore.ErrGated):
		return fmt.Errorf("%w: %w", ErrHubRefused, err)
	}
	return &api.RequestError{Status: http.StatusBadGateway, Code: "hub_unreachable", Err: err}
}

func newPullID() string {
	var b [8]byte
	rand.Read(b[:])
	return "pull-" + hex.EncodeToString(b[:])
}

func (h *Hive) postPull(w http.ResponseWriter, r *http.Request) error {
	var req api.PullModelRequest
	if err := api.Decode(r, &req, false); err != nil {
		return err
	}
	if req.Ref == "" {
		return api.BadRequest("ref is required (hf://ORG/REPO:QUANT, hf://ORG/REPO/FILE.gguf or an http(s) URL)")
	}
	st, started, err := h.pulls.start(r.Context(), req)
	if err != nil {
		return err
	}
	status := http.StatusAccepted
	if !started {
		status = http.StatusOK
	}
	api.WriteJSON(w, status, st)
	return nil
}

func (h *Hive) listPulls(w http.ResponseWriter, _ *http.Request) error {
	api.WriteJSON(w, http.StatusOK, api.ModelPullList{Pulls: h.pulls.list()})
	return nil
}

func (h *Hive) getPull(w http.ResponseWriter, r *http.Request) error {
	st, ok := h.pulls.get(r.PathValue("id"))
	if !ok {
		return fmt.Errorf("%w: %s", ErrPullNotFound, r.PathValue("id"))
	}
	api.WriteJSON(w, http.StatusOK, st)
	return nil
}
