package worker

import (
	"errors"
	"fmt"
	"net/http"
	"runtime/debug"
	"time"

	"github.com/apiary-llm/apiary/internal/anthropic"
	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/openai"
	"github.com/apiary-llm/apiary/internal/transport"
)

// Handler returns the worker's HTTP API:
//
//	GET  /health                 status, load, last request time
//	GET  /metrics                load for a gateway's endpoint picker (metrics.go)
//	GET  /v1/models              the one model
//	GET  /v1/models/{id}         the model, when id is the worker's
//	POST /v1/completions         OpenAI completions, streamed or not
//	POST /v1/chat/completions    OpenAI chat completions, streamed or not
//	POST /v1/messages            Anthropic messages, streamed or not
//	POST /v1/messages/count_tokens  the tokens of a messages body's prompt
//	POST /v1/responses           OpenAI's Responses API, as a chat completion
//	POST /v1/admin/shutdown      graceful shutdown
//
// With a token (APIARY_WORKER_TOKEN; a hive gives each worker its own)
// every request but GET (or HEAD) /health and GET /metrics needs it as a bearer token: a worker listens
// on its node's network, and only its hive and the queen may use it.
// Without one the worker listens on loopback and answers only requests
// addressed there (transport.CheckHost, against DNS rebinding), and a
// shutdown whose body is not declared JSON is refused (a form a web page
// can post). Browser requests from another origin are refused either way
// (transport.CheckNotForged).
// A wrong method answers 405 and an unknown path 404, both with the error
// body; a panic answers 500 and is logged.
func (w *Worker) Handler() http.Handler {
	mux := http.NewServeMux()
	routes := []route{
		{http.MethodGet, "/health", w.handleHealth, false},
		{http.MethodGet, "/metrics", w.handleMetrics, false},
		{http.MethodGet, "/v1/models", w.handleModels, false},
		{http.MethodGet, "/v1/models/{id}", w.handleModel, false},
		{http.MethodPost, "/v1/completions", w.handleCompletions, false},
		{http.MethodPost, "/v1/chat/completions", w.handleChatCompletions, false},
		{http.MethodPost, "/v1/embeddings", w.handleEmbeddings, false},
		{http.MethodPost, "/v1/messages", w.handleMessages, true},
		{http.MethodPost, "/v1/messages/count_tokens", w.handleCountTokens, true},
		{http.MethodPost, "/v1/responses", w.handleResponses, false},
		{http.MethodPost, "/v1/admin/shutdown", w.handleShutdown, false},
	}
	for _, path := range openai.RerankPaths {
		routes = append(routes, route{http.MethodPost, path, w.handleRerank, false})
	}
	for _, rt := range routes {
		write := openai.WriteError
		if rt.anthropic {
			write = anthropic.WriteError
		}
		mux.Handle(rt.method+" "+rt.path, w.adaptWith(rt.h, write))
		mux.Handle(rt.path, w.adaptWith(methodNotAllowed(rt.method), write))
	}
	mux.Handle("/", w.adapt(notFound))
	return w.recoverPanics(w.guard(mux))
}

// route is one of Handler's routes.
type route struct {
	method, path string
	h            handlerFunc
	anthropic    bool // errors in Anthropic's shape
}

// guard refuses, before any handler runs, a request without the worker's
// token (but for GET or HEAD /health), one addressed to a foreign host while the
// worker has no token, and what a browser can forge.
func (w *Worker) guard(next http.Handler) http.Handler {
	refuse := w.adapt(func(rw http.ResponseWriter, r *http.Request) error {
		return w.admitRequest(r)
	})
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		r = w.markArrival(r)
		if w.admitRequest(r) != nil {
			refuse.ServeHTTP(rw, r)
			return
		}
		next.ServeHTTP(rw, r)
	})
}

// admitRequest is nil when r may reach the handlers.
func (w *Worker) admitRequest(r *http.Request) error {
	return transport.AdmitWorkerRequest(r, w.cfg.Token)
}

// handlerFunc is an HTTP handler that returns its error instead of writing
// it; adapt maps it to the response.
type handlerFunc func(http.ResponseWriter, *http.Request) error

// adapt turns a handlerFunc into an http.Handler: the returned error is
// written with openai.WriteError unless the response already began (a
// stream reports its own errors), and every request is logged.
func (w *Worker) adapt(h handlerFunc) http.Handler { return w.adaptWith(h, openai.WriteError) }

// adaptWith is adapt with another error writer (Anthropic's shape on
// /v1/messages).
func (w *Worker) adaptWith(h handlerFunc, writeError func(http.ResponseWriter, error) int) http.Handler {
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := &api.StatusRecorder{ResponseWriter: rw}
		err := h(rec, r)
		status := rec.Status
		switch {
		case err == nil:
		case errors.Is(err, errClientGone):
			status = 499 // nginx's "client closed request", for the log only
			w.log.Info("client went away", "method", r.Method, "path", r.URL.Path, "err", err)
		case rec.Status != 0:
			w.log.Warn("request failed after the response began", "method", r.Method, "path", r.URL.Path, "err", err)
		default:
			status = writeError(rec, err)
			if status >= 500 && status != http.StatusServiceUnavailable {
				w.log.Error("request failed", "method", r.Method, "path", r.URL.Path, "status", status, "err", err)
			} else {
				w.log.Info("request refused", "method", r.Method, "path", r.URL.Path, "status", status,
					"code", openai.AsError(err).Code)
			}
		}
		if status == 0 {
			status = http.StatusOK
		}
		w.log.Debug("request", "method", r.Method, "path", r.URL.Path, "status", status,
			"duration_ms", time.Since(start).Milliseconds(), "remote", r.RemoteAddr)
	})
}

// recoverPanics answers 500 when a handler panics and logs the stack. A
// panic after the response began aborts the connection instead, so that
// the client sees a broken stream rather than a clean end.
func (w *Worker) recoverPanics(next http.Handler) http.Handler {
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		rec := &api.StatusRecorder{ResponseWriter: rw}
		defer func() {
			v := recover()
			if v == nil {
				return
			}
			if v == http.ErrAbortHandler {
				panic(v)
			}
			w.log.Error("handler panicked", "method", r.Method, "path", r.URL.Path, "panic", fmt.Sprint(v),
				"stack", string(debug.Stack()))
			if rec.Status != 0 {
				panic(http.ErrAbortHandler)
			}
			openai.WriteError(rec, &openai.Error{Status: http.StatusInternalServerError, Code: openai.CodeInternal,
				Message: "internal server error"})
		}()
		next.ServeHTTP(rec, r)
	})
}

func methodNotAllowed(allow string) handlerFunc {
	return func(rw http.ResponseWriter, r *http.Request) error {
		rw.Header().Set("Allow", allow)
		return &openai.Error{Status: http.StatusMethodNotAllowed, Code: openai.CodeMethodNotAllowed,
			Message: fmt.Sprintf("%s %s is not allowed; use %s", r.Method, r.URL.Path, allow)}
	}
}

func notFound(_ http.ResponseWriter, r *http.Request) error {
	return &openai.Error{Status: http.StatusNotFound, Code: openai.CodeNotFound,
		Message: fmt.Sprintf("no endpoint %s %s on this worker", r.Method, r.URL.Path)}
}

// Health is the GET /health body. The hive's health checker reads Status,
// its idle timeout LastRequestAt.
type Health struct {
	Status        Status     `json:"status"` // loading, ready, busy, draining
	Model         string     `json:"model"`
	InFlight      int        `json:"in_flight"`
	Queued        int        `json:"queued"`
	Slots         int        `json:"slots"`
	LastRequestAt *time.Time `json:"last_request_at"` // RFC 3339; null before the first request
	VRAMBytes     uint64     `json:"vram_bytes"`      // 0 until the model is loaded
}

// Health reports the worker's current state.
func (w *Worker) Health() Health {
	w.mu.Lock()
	defer w.mu.Unlock()
	h := Health{
		Status:    w.status,
		Model:     w.cfg.ModelRef,
		InFlight:  w.inFlight,
		Queued:    w.queued,
		Slots:     w.cfg.Slots,
		VRAMBytes: w.info.MemoryBytes,
	}
	if h.Status == StatusReady && w.inFlight >= w.cfg.Slots {
		h.Status = StatusBusy
	}
	if !w.lastRequestAt.IsZero() {
		t := w.lastRequestAt.UTC().Truncate(time.Millisecond)
		h.LastRequestAt = &t
	}
	return h
}

func (w *Worker) handleHealth(rw http.ResponseWriter, _ *http.Request) error {
	openai.WriteJSON(rw, http.StatusOK, w.Health())
	return nil
}

func (w *Worker) handleModels(rw http.ResponseWriter, _ *http.Request) error {
	openai.WriteJSON(rw, http.StatusOK, openai.ModelList{Object: openai.ObjectList, Data: []openai.Model{w.model()}})
	return nil
}

func (w *Worker) handleModel(rw http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	if id != w.cfg.ModelRef {
		return &openai.Error{Status: http.StatusNotFound, Code: openai.CodeModelNotFound, Param: "model",
			Message: fmt.Sprintf("model %q is not served here; this worker serves %q", id, w.cfg.ModelRef)}
	}
	openai.WriteJSON(rw, http.StatusOK, w.model())
	return nil
}

// model describes the served model for /v1/models.
func (w *Worker) model() openai.Model {
	return openai.Model{ID: w.cfg.ModelRef, Object: openai.ObjectModel, Created: w.created.Unix(), OwnedBy: "apiary"}
}

// handleShutdown answers 202 and starts a graceful shutdown (guard checked
// the token).
func (w *Worker) handleShutdown(rw http.ResponseWriter, r *http.Request) error {
	w.log.Info("shutdown requested over HTTP", "remote", r.RemoteAddr)
	openai.WriteJSON(rw, http.StatusAccepted, map[string]string{"status": string(StatusDraining)})
	w.RequestShutdown()
	return nil
}
