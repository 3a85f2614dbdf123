package hive

import (
	"cmp"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/modelstore"
	"github.com/apiary-llm/apiary/internal/transport"
	"github.com/apiary-llm/apiary/internal/version"
)

// handlerFunc is a handler that returns its error; handle maps it once.
type handlerFunc func(w http.ResponseWriter, r *http.Request) error

func (h *Hive) routes() http.Handler {
	mux := http.NewServeMux()
	open := func(fn handlerFunc) http.Handler { return h.handle(fn, false) }
	auth := func(fn handlerFunc) http.Handler { return h.handle(fn, true) }

	mux.Handle("GET /health", open(h.getHealth))
	mux.Handle("GET /metrics", auth(func(w http.ResponseWriter, r *http.Request) error {
		promhttp.HandlerFor(h.metrics.reg, promhttp.HandlerOpts{}).ServeHTTP(w, r)
		return nil
	}))
	mux.Handle("GET /v2/workers", auth(h.listWorkers))
	mux.Handle("GET /v2/workers/{id}", auth(h.getWorker))
	mux.Handle("GET /v2/workers/tokens", auth(h.getWorkerTokens))
	mux.Handle("GET /v2/workers/{id}/logs", auth(h.getWorkerLogs))
	mux.Handle("POST /v2/workers/start", auth(h.postStart))
	mux.Handle("POST /v2/workers/{id}/stop", auth(h.postStop))
	// Authenticated by the worker's own token, checked by its owner.
	mux.Handle("POST /v2/internal/workers/ready", open(h.postReady))
	mux.Handle("GET /v2/gpus", auth(h.getGPUs))
	mux.Handle("GET /v2/models", auth(h.getModels))
	mux.Handle("POST /v2/models/pull", auth(h.postPull))
	mux.Handle("GET /v2/models/pulls", auth(h.listPulls))
	mux.Handle("GET /v2/models/pulls/{id}", auth(h.getPull))
	mux.Handle("POST /v2/shutdown", auth(h.postShutdown))
	// Any other path or method: 404 to a caller with the cluster token,
	// 401 without (as for the routes that exist, so that a caller
	// without it cannot tell which do).
	mux.Handle("/", auth(func(http.ResponseWriter, *http.Request) error {
		return &api.RequestError{Status: http.StatusNotFound, Code: "not_found", Err: errors.New("no such endpoint")}
	}))
	return mux
}

// handle refuses what a browser can forge (transport.CheckNotForged) and,
// without a cluster token, requests not addressed to loopback
// (transport.CheckHost); authenticates when needToken; limits the body,
// runs fn and maps its error.
func (h *Hive) handle(fn handlerFunc, needToken bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if h.cfg.ClusterToken == "" {
			if err := transport.CheckHost(r); err != nil {
				writeError(w, err)
				return
			}
		}
		if r.URL.Path != "/health" {
			if err := transport.CheckNotForged(r); err != nil {
				writeError(w, err)
				return
			}
		}
		if needToken && h.cfg.ClusterToken != "" {
			if subtle.ConstantTimeCompare([]byte(api.Bearer(r)), []byte(h.cfg.ClusterToken)) != 1 {
				writeError(w, fmt.Errorf("%w: missing or wrong cluster token (APIARY_CLUSTER_TOKEN)", ErrUnauthorized))
				return
			}
		}
		r.Body = http.MaxBytesReader(w, r.Body, h.cfg.MaxBodyBytes)
		if err := h.checkQueenEpoch(r); err != nil {
			writeError(w, err)
			return
		}
		if err := fn(w, r); err != nil {
			if status, _ := api.StatusOf(err); status >= 500 && r.Context().Err() == nil { // a caller that went away is no failure
				h.log.Error("request failed", "method", r.Method, "path", r.URL.Path, "err", err)
			}
			writeError(w, err)
		}
	})
}

func (h *Hive) getHealth(w http.ResponseWriter, _ *http.Request) error {
	api.WriteJSON(w, http.StatusOK, api.Health{Status: "ok", Version: version.Version})
	return nil
}

func (h *Hive) listWorkers(w http.ResponseWriter, r *http.Request) error {
	all, _ := strconv.ParseBool(r.URL.Query().Get("all"))
	api.WriteJSON(w, http.StatusOK, api.WorkerList{Workers: h.reg.list(all)})
	return nil
}

// getWorkerTokens gives the live workers' own tokens, as a heartbeat
// does: a queen that restarted (or took over) asks for them at once
// instead of waiting for the next beat.
func (h *Hive) getWorkerTokens(w http.ResponseWriter, r *http.Request) error {
	_, tokens := h.reg.heartbeat()
	out := api.WorkerTokens{WorkerTokens: tokens}
	if h.queen != nil {
		out.Instance = h.queen.instance
	}
	api.WriteJSON(w, http.StatusOK, out)
	return nil
}

func (h *Hive) getWorker(w http.ResponseWriter, r *http.Request) error {
	wk, ok := h.reg.get(r.PathValue("id"), true)
	if !ok {
		return fmt.Errorf("%w: %s", ErrWorkerNotFound, r.PathValue("id"))
	}
	api.WriteJSON(w, http.StatusOK, h.reg.snapshot(wk))
	return nil
}

func (h *Hive) postStart(w http.ResponseWriter, r *http.Request) error {
	var req api.StartWorkerRequest
	if err := api.Decode(r, &req, false); err != nil {
		return err
	}
	if req.LifecycleID != "" {
		// The hive reports it in every heartbeat: take only what the
		// queen would take there.
		if err := api.CheckID("lifecycle_id", req.LifecycleID); err != nil {
			return err
		}
	}
	if req.Engine != "" {
		if err := api.CheckID("engine", req.Engine); err != nil {
			return err
		}
	}
	if err := req.WorkerOptions.Check(); err != nil {
		return err
	}
	snap, err := h.startWorker(r.Context(), req)
	if err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusAccepted, api.StartWorkerResponse{WorkerID: snap.WorkerID, Status: snap.Status})
	return nil
}

// maxStopReason bounds a stop's reason (it is kept in the worker's
// history and sent in its events).
const maxStopReason = 1024

func (h *Hive) postStop(w http.ResponseWriter, r *http.Request) error {
	var req api.StopWorkerRequest
	if err := api.Decode(r, &req, true); err != nil {
		return err
	}
	if req.GraceSeconds != nil && *req.GraceSeconds < 0 {
		return api.BadRequest("grace_seconds must not be negative")
	}
	if len(req.Reason) > maxStopReason {
		return api.BadRequest("reason must be at most %d bytes, got %d", maxStopReason, len(req.Reason))
	}
	id := r.PathValue("id")
	wk, ok := h.reg.get(id, false)
	if !ok {
		return fmt.Errorf("%w: %s", ErrWorkerNotFound, id)
	}
	c := stopCmd{drain: req.Drain, reason: "stop requested"}
	if req.Drain {
		c.reason = "drain requested"
	}
	if req.Reason != "" {
		c.reason = api.Printable(req.Reason, maxStopReason)
	}
	if req.GraceSeconds != nil {
		c.grace = secondsDuration(*req.GraceSeconds)
	}
	if err := wk.requestStop(c); err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusAccepted, api.StopWorkerResponse{WorkerID: id, Status: h.reg.snapshot(wk).Status})
	return nil
}

func (h *Hive) postReady(w http.ResponseWriter, r *http.Request) error {
	var cb api.ReadyCallback
	if err := api.Decode(r, &cb, false); err != nil {
		return err
	}
	wk, ok := h.reg.get(cb.WorkerID, false)
	if !ok {
		return fmt.Errorf("%w: %s", ErrWorkerNotFound, cb.WorkerID)
	}
	if err := wk.deliverReady(r.Context(), api.Bearer(r), cb); err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusOK, h.reg.snapshot(wk))
	return nil
}

func (h *Hive) getGPUs(w http.ResponseWriter, r *http.Request) error {
	gpus, err := h.gpus(r.Context())
	if err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusOK, api.GPUList{GPUs: gpus})
	return nil
}

func (h *Hive) getModels(w http.ResponseWriter, _ *http.Request) error {
	models, err := listModels(h.cfg.ModelsDir, h.cfg.CtxSize, h.digests)
	if err != nil {
		return err
	}
	engines := h.engineNames()
	for i := range models {
		models[i].Engines = engines
	}
	api.WriteJSON(w, http.StatusOK, api.ModelList{Models: models})
	return nil
}

func (h *Hive) postShutdown(w http.ResponseWriter, _ *http.Request) error {
	api.WriteJSON(w, http.StatusAccepted, api.Health{Status: "shutting_down", Version: version.Version})
	h.Shutdown()
	return nil
}

// listModels lists the models dir through the shared model store: what
// `apiary models ls` shows, less the files the GGUF reader rejects (a
// truncated file, a split model that lacks a part): the queen never
// places a worker on those. Each carries the estimate a start is checked
// against at ctxSize (the hive's --worker-ctx-size), and its digest once
// digests has it (nil: none).
func listModels(dir string, ctxSize int, digests *modelstore.Digests) ([]api.Model, error) {
	models, err := modelstore.List(dir)
	if err != nil {
		return nil, fmt.Errorf("list models: %w", err)
	}
	if digests != nil {
		digests.Forget(models)
	}
	out := make([]api.Model, 0, len(models))
	for _, m := range models {
		if m.Info == nil {
			continue
		}
		am := api.Model{Ref: m.Ref, SizeBytes: m.Size, ModifiedAt: m.ModTime.UTC(), Vision: m.Projector != ""}
		if m.Info != nil {
			am.Architecture = m.Info.Architecture
			am.EstimateBytes = int64(m.Info.EstimateMemory(ctxSize).Total)
			am.ParameterCount, am.FileType = m.Info.ParameterCount, m.Info.FileType.String()
			am.Pooling = cmp.Or(m.Info.Pooling, api.PoolingUnspecified)
		}
		if st, err := os.Stat(m.Projector); m.Projector != "" && err == nil {
			am.EstimateBytes += st.Size() // the projector's weights load beside the model's
		}
		if digests != nil {
			am.Digest = digests.Lookup(m)
		}
		out = append(out, am)
	}
	return out, nil
}
