package routing

// Ollama's API on the queen (internal/ollama translates): a client of
// Ollama — Open WebUI, Continue, the `ollama` npm and Python packages —
// pointed at the queen lists the models, chats, generates and embeds
// through the same routing, placement and strikes as the OpenAI API, with
// the same token.

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
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
// pools' hives report.
func modelDetails(m api.Model) map[string]any {
	return map[string]any{"format": "gguf", "family": m.Architecture, "families": []string{m.Architecture},
		"parameter_size": "", "quantization_level": "", "parent_model": ""}
}

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
		models = append(models, map[string]any{"name": m.ID, "model": m.ID, "modified_at": modified.UTC().Format(time.RFC3339),
			"size": info.SizeBytes, "digest": "", "details": modelDetails(info)})
	}
	openai.WriteJSON(w, http.StatusOK, map[string]any{"models": models})
	return nil
}

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
			models = append(models, map[string]any{"name": wk.ModelRef, "model": wk.ModelRef, "size": wk.VRAMBytes,
				"digest": "", "details": modelDetails(info), "expires_at": time.Time{}.Format(time.RFC3339), "size_vram": vram,
				"pool": p.ID, "worker_id": wk.WorkerID})
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
	openai.WriteJSON(w, http.StatusOK, map[string]any{"modelfile": "", "parameters": "", "template": "", "license": "",
		"details": modelDetails(info), "model_info": map[string]any{"general.architecture": info.Architecture},
		"capabilities": []string{"completion", "tools"}, "modified_at": info.ModifiedAt.UTC().Format(time.RFC3339)})
	return nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func (s *Service) postOllamaChat(w http.ResponseWriter, r *http.Request, c *call) error {
	return s.serveOllama(w, r, c, ollama.KindChat, s.cfg.MaxBodyBytes, func(body []byte) (string, string, bool, []byte, error) {
		req, out, err := ollama.Chat(body)
		return req.Model, "/v1/chat/completions", req.Stream == nil || *req.Stream, out, err
	})
}

func (s *Service) postOllamaGenerate(w http.ResponseWriter, r *http.Request, c *call) error {
	return s.serveOllama(w, r, c, ollama.KindGenerate, s.cfg.MaxBodyBytes, func(body []byte) (string, string, bool, []byte, error) {
		req, path, out, err := ollama.Generate(body)
		return req.Model, path, req.Stream == nil || *req.Stream, out, err
	})
}

func (s *Service) postOllamaEmbed(w http.ResponseWriter, r *http.Request, c *call) error {
	return s.serveOllama(w, r, c, ollama.KindEmbed, max(s.cfg.MaxBodyBytes, openai.MaxEmbeddingBodyBytes), func(body []byte) (string, string, bool, []byte, error) {
		req, out, err := ollama.Embed(body)
		return req.Model, "/v1/embeddings", false, out, err
	})
}

func (s *Service) postOllamaEmbeddings(w http.ResponseWriter, r *http.Request, c *call) error {
	return s.serveOllama(w, r, c, ollama.KindEmbeddings, s.cfg.MaxBodyBytes, func(body []byte) (string, string, bool, []byte, error) {
		req, out, err := ollama.Embeddings(body)
		return req.Model, "/v1/embeddings", false, out, err
	})
}

// serveOllama reads an Ollama request, translates it to the OpenAI
// request of path, checks that as the OpenAI endpoint would, and relays
// it, the worker's answer translated back on its way to the client.
func (s *Service) serveOllama(w http.ResponseWriter, r *http.Request, c *call, kind ollama.Kind, limit int64,
	convert func([]byte) (model, path string, stream bool, openaiBody []byte, err error)) error {
	body, err := openai.ReadBody(w, r, limit)
	if err != nil {
		return err
	}
	name, path, _, out, err := convert(body)
	if err != nil {
		return ollamaBad(err)
	}
	if name == "" {
		return ollamaBad(fmt.Errorf("%w: model is required", ollama.ErrBadRequest))
	}
	// The model as the client named it, without Ollama's default tag.
	if out, err = setModel(out, ollamaModel(name)); err != nil {
		return err
	}
	decode := func(b []byte) (string, bool, error) {
		switch path {
		case "/v1/chat/completions":
			req, err := openai.DecodeChatCompletionRequest(b, openai.Limits{})
			return req.Model, req.Stream, err
		case "/v1/completions":
			req, err := openai.DecodeCompletionRequest(b, openai.Limits{})
			return req.Model, req.Stream, err
		default:
			req, err := openai.DecodeEmbeddingRequest(b)
			return req.Model, false, err
		}
	}
	tw := translate.New(w, ollama.NewAnswer(kind, name, c.start), ollama.Dialect)
	err = s.serveRead(tw, r, c, path, out, decode)
	if ferr := tw.Finish(); ferr != nil && err == nil {
		err = ferr
	}
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
