package routing

// Ollama's API on the queen (internal/ollama translates): a client of
// Ollama — Open WebUI, Continue, the `ollama` npm and Python packages —
// pointed at the queen lists the models, chats, generates and embeds
// through the same routing, placement and strikes as the OpenAI API, with
// the same token.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/ollama"
	"github.com/apiary-llm/apiary/internal/openai"
	"github.com/apiary-llm/apiary/internal/registry"
	"github.com/apiary-llm/apiary/internal/translate"
	"github.com/apiary-llm/apiary/internal/version"
)

// ollamaRoutes adds Ollama's endpoints to mux.
func (s *Service) ollamaRoutes(mux *http.ServeMux) {
	h := func(endpoint string, fn inferenceFunc) http.Handler {
		return s.inferenceWith(endpoint, fn, writeOllamaError, false)
	}
	mux.Handle("GET /api/version", h("ollama_version", func(w http.ResponseWriter, r *http.Request, c *call) error {
		openai.WriteJSON(w, http.StatusOK, map[string]string{"version": version.Version})
		return nil
	}))
	mux.Handle("GET /api/tags", h("ollama_tags", s.getOllamaTags))
	mux.Handle("GET /api/ps", h("ollama_ps", s.getOllamaPS))
	mux.Handle("POST /api/show", h("ollama_show", s.postOllamaShow))
	mux.Handle("POST /api/chat", h("ollama_chat", s.postOllamaChat))
	mux.Handle("POST /api/generate", h("ollama_generate", s.postOllamaGenerate))
	mux.Handle("POST /api/embed", h("ollama_embed", s.postOllamaEmbed))
	mux.Handle("POST /api/embeddings", h("ollama_embeddings", s.postOllamaEmbeddings))
	// Any other /api/ path (but the dashboard's /api/admin/, which has
	// its own): 404, or 405 where the path takes another method, in
	// Ollama's shape (its client prints "[object Object]" for OpenAI's).
	// Pulling, pushing, creating and deleting models are apiary's own
	// commands (apiary models pull …), not Ollama's.
	mux.Handle("/api/", h("unknown", func(w http.ResponseWriter, r *http.Request, c *call) error {
		if allow := allowedMethods(mux, r); allow != "" {
			w.Header().Set("Allow", allow)
			return &openai.Error{Status: http.StatusMethodNotAllowed, Code: openai.CodeMethodNotAllowed,
				Message: fmt.Sprintf("%s %s is not allowed; use %s", api.Printable(r.Method, 20), api.Printable(r.URL.Path, 200), allow)}
		}
		msg := fmt.Sprintf("no endpoint %s %s", api.Printable(r.Method, 20), api.Printable(r.URL.Path, 200))
		switch r.URL.Path {
		case "/api/pull", "/api/push", "/api/create", "/api/copy", "/api/delete", "/api/blobs":
			msg += ": apiary manages models with its own commands (apiary models pull, apiary models rm); see docs/models.md"
		}
		return &openai.Error{Status: http.StatusNotFound, Code: openai.CodeNotFound, Message: msg}
	}))
}

// writeOllamaError writes err in Ollama's shape, {"error": "…"}.
func writeOllamaError(w http.ResponseWriter, err error) int {
	return openai.WriteErrorAs(w, err, func(e *openai.Error) any { return ollama.Error{Error: e.Message} })
}

// ollamaModel is a model name as an Ollama client sends it: "name" or
// "name:latest" (Ollama's default tag) both name the model "name".
func ollamaModel(name string) string { return strings.TrimSuffix(name, ":latest") }

// ollamaBad maps a translation error to a 400.
func ollamaBad(err error) error {
	if errors.Is(err, ollama.ErrBadRequest) {
		return &openai.Error{Status: http.StatusBadRequest, Code: openai.CodeInvalidValue, Message: err.Error(), Err: openai.ErrInvalidRequest}
	}
	return err
}

// modelDetails are the details Ollama lists for a model, from what its
// pools' hives report of its GGUF header.
func modelDetails(m api.Model) map[string]any {
	return map[string]any{"format": "gguf", "family": m.Architecture, "families": []string{m.Architecture},
		"parameter_size": parameterSize(m.ParameterCount), "quantization_level": m.FileType, "parent_model": ""}
}

// parameterSize is a parameter count as Ollama writes it: 8.0B, 494.03M,
// 6.5M ("" when unknown).
func parameterSize(n uint64) string {
	switch {
	case n == 0:
		return ""
	case n >= 1e9:
		return strconv.FormatFloat(float64(n)/1e9, 'f', 1, 64) + "B"
	case n >= 1e6:
		return strconv.FormatFloat(float64(n)/1e6, 'f', 2, 64) + "M"
	case n >= 1e3:
		return strconv.FormatFloat(float64(n)/1e3, 'f', 0, 64) + "K"
	}
	return strconv.FormatUint(n, 10)
}

// ollamaName is a model's name as Ollama lists it: with its tag,
// ":latest" (apiary's models have no other).
func ollamaName(name string) string { return name + ":latest" }

// neverExpires is the expires_at of a worker that no idle timeout stops
// (Ollama's keep_alive -1 answers a date centuries ahead too).
var neverExpires = time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC)

func (s *Service) getOllamaTags(w http.ResponseWriter, r *http.Request, _ *call) error {
	list, err := s.listModels(r)
	if err != nil {
		return err
	}
	pools := s.servable()
	models := make([]map[string]any, 0, len(list.Data))
	for _, m := range list.Data {
		info, _ := s.catalog.lookup(pools, s.resolve(m.ID).ref)
		modified := info.ModifiedAt
		if modified.IsZero() {
			modified = time.Unix(m.Created, 0)
		}
		models = append(models, map[string]any{"name": ollamaName(m.ID), "model": ollamaName(m.ID), "modified_at": modified.UTC().Format(time.RFC3339),
			"size": info.SizeBytes, "digest": strings.TrimPrefix(info.Digest, "sha256:"), "details": modelDetails(info)})
	}
	openai.WriteJSON(w, http.StatusOK, map[string]any{"models": models})
	return nil
}

// getOllamaPS lists the workers that take requests, one entry a worker,
// with when its hive's idle timeout stops it if no request comes
// (expires_at: its last request through this queen, or its start, plus
// the timeout).
func (s *Service) getOllamaPS(w http.ResponseWriter, r *http.Request, _ *call) error {
	pools := s.servable()
	models := []map[string]any{}
	for _, p := range pools {
		for _, wk := range p.Workers {
			if wk.ModelRef == "" || (wk.Status != "ready" && wk.Status != "busy") {
				continue
			}
			info, _ := s.catalog.lookup([]registry.Pool{p}, wk.ModelRef)
			vram := wk.VRAMBytes
			if i := slices.IndexFunc(p.GPUs, func(g api.GPU) bool { return g.ID == wk.GPUDevice }); i < 0 || p.GPUs[i].Kind == api.DeviceCPU {
				vram = 0 // a CPU's memory is no VRAM
			}
			expires := neverExpires
			if wk.IdleTimeoutMS > 0 {
				from := wk.StartedAt
				if wk.ReadyAt != nil {
					from = *wk.ReadyAt
				}
				if last := s.LastUsed(p.ID, wk.WorkerID); last.After(from) {
					from = last
				}
				expires = from.Add(time.Duration(wk.IdleTimeoutMS) * time.Millisecond)
			}
			name := ollamaName(s.nameOf(wk.ModelRef))
			models = append(models, map[string]any{"name": name, "model": name, "size": wk.VRAMBytes,
				"digest": strings.TrimPrefix(info.Digest, "sha256:"), "details": modelDetails(info), "expires_at": expires.UTC().Format(time.RFC3339Nano),
				"size_vram": vram, "pool": p.ID, "worker_id": wk.WorkerID})
		}
	}
	openai.WriteJSON(w, http.StatusOK, map[string]any{"models": models})
	return nil
}

func (s *Service) postOllamaShow(w http.ResponseWriter, r *http.Request, c *call) error {
	body, err := openai.ReadBody(w, r, s.cfg.MaxBodyBytes)
	if err != nil {
		return err
	}
	var req struct {
		Model   string `json:"model"`
		Name    string `json:"name"` // older clients
		Verbose bool   `json:"verbose"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		return ollamaBad(fmt.Errorf("%w: the body is not a JSON object: %v", ollama.ErrBadRequest, err))
	}
	name := ollamaModel(cmpOr(req.Model, req.Name))
	if name == "" {
		return ollamaBad(fmt.Errorf("%w: model is required", ollama.ErrBadRequest))
	}
	ref := s.resolve(name).ref
	if err := s.knownModel(r.Context(), ref, ""); err != nil {
		return &openai.Error{Status: http.StatusNotFound, Code: openai.CodeNotFound, Message: fmt.Sprintf("model '%s' not found", api.Printable(name, 200))}
	}
	c.model = ref
	info, _ := s.catalog.lookup(s.servable(), ref)
	caps := []string{"completion", "tools"} // as Ollama names them
	if slices.Contains(s.capabilities(info), "vision") {
		caps = append(caps, "vision")
	}
	openai.WriteJSON(w, http.StatusOK, map[string]any{"modelfile": "", "parameters": "", "template": "", "license": "",
		"details": modelDetails(info), "model_info": map[string]any{"general.architecture": info.Architecture},
		"capabilities": caps, "modified_at": info.ModifiedAt.UTC().Format(time.RFC3339)})
	return nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func (s *Service) postOllamaChat(w http.ResponseWriter, r *http.Request, c *call) error {
	return s.serveOllama(w, r, c, ollama.KindChat, "/v1/chat/completions", func(body []byte) (ollamaCall, error) {
		req, act, out, err := ollama.Chat(body)
		return ollamaCall{model: req.Model, path: "/v1/chat/completions", body: out, action: act, stream: req.Stream == nil || *req.Stream}, err
	})
}

func (s *Service) postOllamaGenerate(w http.ResponseWriter, r *http.Request, c *call) error {
	return s.serveOllama(w, r, c, ollama.KindGenerate, "/v1/chat/completions", func(body []byte) (ollamaCall, error) {
		req, act, path, out, err := ollama.Generate(body)
		return ollamaCall{model: req.Model, path: path, body: out, action: act, stream: req.Stream == nil || *req.Stream}, err
	})
}

func (s *Service) postOllamaEmbed(w http.ResponseWriter, r *http.Request, c *call) error {
	return s.serveOllama(w, r, c, ollama.KindEmbed, "/v1/embeddings", func(body []byte) (ollamaCall, error) {
		req, out, err := ollama.Embed(body)
		return ollamaCall{model: req.Model, path: "/v1/embeddings", body: out}, err
	})
}

func (s *Service) postOllamaEmbeddings(w http.ResponseWriter, r *http.Request, c *call) error {
	return s.serveOllama(w, r, c, ollama.KindEmbeddings, "/v1/embeddings", func(body []byte) (ollamaCall, error) {
		req, out, err := ollama.Embeddings(body)
		return ollamaCall{model: req.Model, path: "/v1/embeddings", body: out}, err
	})
}

// ollamaCall is an Ollama request translated: the OpenAI request to
// relay (path and body), or a load or an unload (action).
type ollamaCall struct {
	model  string // as the client named it
	path   string
	body   []byte
	stream bool
	action ollama.Action
}

// serveOllama reads an Ollama request (up to the limit of the OpenAI
// endpoint readAs, the largest it may be translated to), translates it
// to the OpenAI request of path, checks that as the OpenAI endpoint
// would, and relays it, the worker's answer translated back on its way
// to the client. A load or an unload is done here (ollamaAction).
func (s *Service) serveOllama(w http.ResponseWriter, r *http.Request, c *call, kind ollama.Kind, readAs string,
	convert func([]byte) (ollamaCall, error)) error {
	body, err := s.readBody(w, r, readAs)
	if err != nil {
		return err
	}
	oc, err := convert(body)
	if err != nil {
		return ollamaBad(err)
	}
	name, path := oc.model, oc.path
	if name == "" {
		return ollamaBad(fmt.Errorf("%w: model is required", ollama.ErrBadRequest))
	}
	if oc.action != ollama.ActionNone {
		return s.ollamaAction(w, r, c, kind, name, oc)
	}
	// The model as the client named it, without Ollama's default tag.
	out, err := setModel(oc.body, ollamaModel(name))
	if err != nil {
		return err
	}
	decode := func(b []byte) (string, bool, error) {
		switch path {
		case "/v1/chat/completions":
			req, err := openai.DecodeChatCompletionRequest(b, openai.Limits{})
			return req.Model, req.Stream, ollamaParams(err)
		case "/v1/completions":
			req, err := openai.DecodeCompletionRequest(b, openai.Limits{})
			return req.Model, req.Stream, ollamaParams(err)
		default:
			req, err := openai.DecodeEmbeddingRequest(b)
			return req.Model, false, err
		}
	}
	ans := ollama.NewAnswer(kind, name, c.start)
	c.granted = ans.SetLoad
	tw := translate.New(w, ans, ollama.Dialect)
	err = s.serveRead(tw, r, c, path, out, int64(len(body)), decode)
	if ferr := tw.Finish(); ferr != nil && err == nil {
		err = ferr
	}
	return err
}

// ollamaParams names the fields of an OpenAI request the translation
// made as the Ollama client sent them: format's schema is the OpenAI
// request's response_format.json_schema.schema.
func ollamaParams(err error) error {
	var oe *openai.Error
	if !errors.As(err, &oe) {
		return err
	}
	const schema = "response_format.json_schema.schema"
	e := *oe
	e.Param = strings.Replace(e.Param, schema, "format", 1)
	e.Message = strings.ReplaceAll(e.Message, schema, "format")
	return &e
}

// ollamaAction loads or unloads the model a request names and answers
// done at once, as Ollama does (done_reason "load" or "unload"), with
// nothing generated. A load waits until a worker of the model takes
// requests (a cold start, or a swap, as for any request) and hands its
// slot back unused; an unload stops the model's workers (each finishing
// what it serves), audited with why. A model the config pins or keeps
// min_workers of is not unloaded: 409, with why.
func (s *Service) ollamaAction(w http.ResponseWriter, r *http.Request, c *call, kind ollama.Kind, name string, oc ollamaCall) error {
	pool := r.Header.Get(api.PoolHeader)
	if pool != "" {
		if err := s.usablePool(pool); err != nil {
			return err
		}
	}
	ref := s.resolve(ollamaModel(name)).ref
	if err := s.knownModel(r.Context(), ref, pool); err != nil {
		return err
	}
	c.model = ref
	reason := "load"
	if oc.action == ollama.ActionUnload {
		reason = "unload"
		if err := s.unloadModel(r.Context(), ref, pool, "unloaded by an API client: "+r.URL.Path+" with keep_alive 0"); err != nil {
			return err
		}
	} else {
		l, err := s.router.acquire(r.Context(), routeReq{model: ref, pool: pool, session: r.Header.Get(api.SessionHeader)})
		if err != nil {
			if r.Context().Err() != nil {
				return fmt.Errorf("%w: while waiting for a worker: %w", errClientGone, err)
			}
			return err
		}
		s.router.settle(l, verdictNone, nil)
	}
	out, err := ollama.Done(kind, name, reason, time.Now())
	if err != nil {
		return err
	}
	ct := "application/json"
	if oc.stream {
		ct = "application/x-ndjson"
	}
	w.Header().Set("Content-Type", ct)
	w.WriteHeader(http.StatusOK)
	_, err = w.Write(append(out, '\n'))
	return err
}

// unloadModel stops every live worker of model (on pool, when it names
// one) with reason, the queen as the actor: Unload.
func (s *Service) unloadModel(ctx context.Context, model, pool, reason string) error {
	_, err := s.Unload(ctx, model, pool, func(ctx context.Context, lifecycleID string) error {
		return s.cp.StopWorker(ctx, lifecycleID, reason)
	})
	return err
}

// setModel puts model in an OpenAI body.
func setModel(body []byte, model string) ([]byte, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil {
		return nil, err
	}
	m, _ := json.Marshal(model)
	fields["model"] = m
	return json.Marshal(fields)
}
