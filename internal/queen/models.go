package queen

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/registry"
	"github.com/apiary-llm/apiary/internal/routing"
	"github.com/apiary-llm/apiary/internal/store"
)

// modelSettings owns the models' settings (apiary models scale): loaded
// at start, changed through put, which writes the store (with the audit
// entry) before memory. Bounded by the models operators set.
type modelSettings struct {
	st  *store.Store
	wmu sync.Mutex // serializes put across its store write, so memory follows the store's order
	mu  sync.Mutex
	m   map[string]store.ModelSetting // guarded by mu; by model
}

func loadModelSettings(ctx context.Context, st *store.Store) (*modelSettings, error) {
	var list []store.ModelSetting
	if err := st.View(ctx, func(tx *store.Tx) (err error) { list, err = tx.ModelSettings(); return err }); err != nil {
		return nil, fmt.Errorf("load model settings: %w", err)
	}
	s := &modelSettings{st: st, m: make(map[string]store.ModelSetting, len(list))}
	for _, ms := range list {
		s.m[ms.ModelRef] = ms
	}
	return s, nil
}

// put writes ms with its audit entry (model.scale), then takes it.
func (s *modelSettings) put(ctx context.Context, ms store.ModelSetting, actor string) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.mu.Lock()
	old, had := s.m[ms.ModelRef]
	s.mu.Unlock()
	meta := map[string]any{"model_ref": ms.ModelRef, "min_workers": ms.MinWorkers, "max_workers": ms.MaxWorkers}
	if had {
		meta["was"] = map[string]any{"min_workers": old.MinWorkers, "max_workers": old.MaxWorkers}
	}
	err := s.st.Update(ctx, func(tx *store.Tx) error {
		if err := tx.PutModelSetting(ms); err != nil {
			return err
		}
		_, err := tx.Append(store.AuditEntry{TS: ms.UpdatedAt, Actor: actor, Action: "model.scale", Target: "model:" + ms.ModelRef,
			Reason: ms.Reason, Metadata: meta})
		return err
	})
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.m[ms.ModelRef] = ms
	s.mu.Unlock()
	return nil
}

// list returns the settings, by model.
func (s *modelSettings) list() []store.ModelSetting {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]store.ModelSetting, 0, len(s.m))
	for _, ms := range s.m {
		out = append(out, ms)
	}
	slices.SortFunc(out, func(a, b store.ModelSetting) int { return strings.Compare(a.ModelRef, b.ModelRef) })
	return out
}

// replicas is the settings as routing reads them.
func (s *modelSettings) replicas() map[string]routing.Replica {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]routing.Replica, len(s.m))
	for m, ms := range s.m {
		r := routing.Replica{Min: ms.MinWorkers}
		if ms.MaxWorkers != nil {
			n := *ms.MaxWorkers
			r.Max = &n
		}
		out[m] = r
	}
	return out
}

// putModel serves PUT /api/admin/models/{name}: the model's min_workers
// (and max_workers) from now on, persisted and audited; the controller
// acts on it at once.
func (q *Queen) putModel(w http.ResponseWriter, r *http.Request, c caller) error {
	model := r.PathValue("name")
	if _, m, ok := q.models.file().Resolve(model); ok {
		model = m.File // a configured name or alias scales its model's file
	}
	if err := checkModel(model); err != nil {
		return err
	}
	if name, _, ok := q.models.file().ByFile(model); ok {
		if _, set := q.models.replicas()[model]; set {
			return fmt.Errorf("%w: models.%s in %s sets min_workers or max_workers of %s; change them there (the file is read again when it changes, or on SIGHUP)",
				ErrModelConfigured, name, q.models.path, model)
		}
	}
	var req api.ModelScaleRequest
	if err := api.Decode(r, &req, false); err != nil {
		return err
	}
	reason, err := checkReason(req.Reason)
	if err != nil {
		return err
	}
	switch {
	case req.MinWorkers == nil:
		return api.BadRequest("min_workers is required (0: keep none warm)")
	case *req.MinWorkers < 0 || *req.MinWorkers > api.MaxReplicas:
		return api.BadRequest("min_workers %d must be from 0 to %d", *req.MinWorkers, api.MaxReplicas)
	case req.MaxWorkers != nil && (*req.MaxWorkers < *req.MinWorkers || *req.MaxWorkers > api.MaxReplicas):
		return api.BadRequest("max_workers %d must be from min_workers (%d) to %d", *req.MaxWorkers, *req.MinWorkers, api.MaxReplicas)
	}
	ms := store.ModelSetting{ModelRef: model, MinWorkers: *req.MinWorkers, MaxWorkers: req.MaxWorkers, Reason: reason, UpdatedAt: micro(time.Now())}
	if err := q.settings.put(r.Context(), ms, c.actor); err != nil {
		return err
	}
	attrs := []any{"model_ref", model, "min_workers", ms.MinWorkers}
	if ms.MaxWorkers != nil { // the number, not the pointer's address; none: the queen's bound
		attrs = append(attrs, "max_workers", *ms.MaxWorkers)
	}
	q.log.Info("model scaled", append(attrs, "actor", c.actor, "reason", reason)...)
	q.routing.Poke()
	api.WriteJSON(w, http.StatusOK, q.modelWire(ms, q.routing.CrashLoops()))
	return nil
}

// getModels serves GET /api/admin/models: every model's setting with its
// live workers and crash loop.
func (q *Queen) getModels(w http.ResponseWriter, r *http.Request, _ caller) error {
	if _, err := query(r); err != nil {
		return err
	}
	loops := q.routing.CrashLoops()
	out := api.ModelSettingList{Models: []api.ModelSetting{}}
	configured := q.models.replicas()
	for _, ms := range q.settings.list() {
		if _, ok := configured[ms.ModelRef]; !ok {
			out.Models = append(out.Models, q.modelWire(ms, loops))
		}
	}
	// The model config's, which replace those of PUT for their models.
	f := q.models.file()
	for ref, r := range configured {
		name, _, _ := f.ByFile(ref)
		ms := store.ModelSetting{ModelRef: ref, MinWorkers: r.Min, MaxWorkers: r.Max,
			Reason: fmt.Sprintf("models.%s in the model config %s", name, q.models.path)}
		w := q.modelWire(ms, loops)
		w.From = "config"
		out.Models = append(out.Models, w)
	}
	slices.SortFunc(out.Models, func(a, b api.ModelSetting) int { return strings.Compare(a.Model, b.Model) })
	api.WriteJSON(w, http.StatusOK, out)
	return nil
}

func (q *Queen) modelWire(ms store.ModelSetting, loops map[string]routing.CrashLoop) api.ModelSetting {
	n := controlPlane{q}.Count(ms.ModelRef, "", true)
	out := api.ModelSetting{Model: ms.ModelRef, ModelName: q.models.nameOf(ms.ModelRef), MinWorkers: ms.MinWorkers, MaxWorkers: ms.MaxWorkers, Reason: ms.Reason,
		UpdatedAt: ms.UpdatedAt, Starting: n.Starting, Running: n.Running}
	if l, ok := loops[ms.ModelRef]; ok {
		out.CrashLoop = &api.CrashLoop{Since: l.Since, Failures: l.Failures, LastFailure: l.LastFailure, LastExit: l.LastExit, NextTry: l.NextTry}
	}
	return out
}

// logTail returns the last n lines of the log of a row's worker, from
// its hive (a worker that never started on its hive has none).
func (q *Queen) logTail(ctx context.Context, id string, n int) ([]string, error) {
	row, err := q.rows.get(ctx, id)
	if err != nil {
		return nil, err
	}
	if row.WorkerID == "" {
		return nil, fmt.Errorf("worker %s never started on its hive (%s): it has no log", id, row.Reason)
	}
	pool, ok := q.reg.Get(row.PoolID)
	if !ok || pool.Status == registry.Offline {
		return nil, fmt.Errorf("%w: pool %s of %s is gone", ErrPoolUnavailable, row.PoolID, id)
	}
	src, ok := q.hives.(HiveLogs)
	if !ok {
		src = q.hivesHTTP
	}
	body, err := src.WorkerLogs(ctx, pool.Endpoint, row.WorkerID, api.LogQuery{Tail: n})
	if err != nil {
		return nil, err
	}
	defer body.Close()
	var lines []string
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 0, 64<<10), api.MaxLogBytes)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	if err := sc.Err(); err != nil && !errors.Is(err, context.Canceled) {
		return lines, fmt.Errorf("log of %s: %w", id, err)
	}
	return lines, nil
}
