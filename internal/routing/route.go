package routing

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/apiary-llm/apiary/internal/anthropic"
	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/engine"
	"github.com/apiary-llm/apiary/internal/modelconfig"
	"github.com/apiary-llm/apiary/internal/openai"
	"github.com/apiary-llm/apiary/internal/registry"
	"github.com/apiary-llm/apiary/internal/secret"
	"github.com/apiary-llm/apiary/internal/transport"
)

const maxSessionLen = 256

// Routes adds the OpenAI-compatible API, authenticated with
// APIARY_API_TOKEN.
func (s *Service) Routes(mux *http.ServeMux) {
	mux.Handle("GET /v1/models", s.inference("models", s.getModels))
	mux.Handle("GET /v1/models/{id}", s.inference("models", s.getModel))
	mux.Handle("POST /v1/completions", s.inference("completions", s.postCompletions))
	mux.Handle("POST /v1/chat/completions", s.inference("chat_completions", s.postChatCompletions))
	mux.Handle("POST /v1/embeddings", s.inference("embeddings", s.postEmbeddings))
	for _, path := range openai.RerankPaths {
		mux.Handle("POST "+path, s.inference("rerank", s.postRerank))
	}
	mux.Handle("POST /v1/messages", s.inferenceAs("messages", s.postMessages, true))
	mux.Handle("POST /v1/messages/count_tokens", s.inferenceAs("count_tokens", func(w http.ResponseWriter, r *http.Request, c *call) error {
		return s.serveInference(w, r, c, "/v1/messages/count_tokens", func(body []byte) (string, bool, error) {
			req, err := anthropic.DecodeCountTokens(body)
			return req.Model, false, err
		})
	}, true))
	mux.Handle("POST /v1/responses", s.inference("responses", s.postResponses))
	mux.Handle("GET /v1/responses/{id}", s.inference("responses", s.getResponse))
	mux.Handle("DELETE /v1/responses/{id}", s.inference("responses", s.deleteResponse))
	s.ollamaRoutes(mux)
	mux.Handle("OPTIONS /v1/", s.inference("preflight", func(w http.ResponseWriter, r *http.Request, c *call) error {
		w.WriteHeader(http.StatusNoContent) // not a CORS preflight: nothing to say
		return nil
	}))
	// Any other /v1/ path, or method: 404 with what was asked, or 405
	// naming the methods the path takes on this mux (the Batch API's
	// routes too). Without it, the OPTIONS route above made Go's mux
	// answer every unknown /v1/ path 405.
	mux.Handle("/v1/", s.inference("unknown", func(w http.ResponseWriter, r *http.Request, c *call) error {
		if allow := allowedMethods(mux, r); allow != "" {
			w.Header().Set("Allow", allow)
			return &openai.Error{Status: http.StatusMethodNotAllowed, Code: openai.CodeMethodNotAllowed,
				Message: fmt.Sprintf("%s %s is not allowed; use %s", api.Printable(r.Method, 20), api.Printable(r.URL.Path, 200), allow)}
		}
		return &openai.Error{Status: http.StatusNotFound, Code: openai.CodeNotFound,
			Message: fmt.Sprintf("no endpoint %s %s (check the URL for typos)", api.Printable(r.Method, 20), api.Printable(r.URL.Path, 200))}
	}))
}

// allowedMethods lists the methods mux serves r's path with, other than
// the catch-alls ("" when none).
func allowedMethods(mux *http.ServeMux, r *http.Request) string {
	var allow []string
	for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodDelete} {
		probe := r.Clone(r.Context())
		probe.Method = m
		if _, pattern := mux.Handler(probe); pattern != "" && pattern != "/v1/" && pattern != "OPTIONS /v1/" && pattern != "/api/" && pattern != "/" {
			allow = append(allow, m)
		}
	}
	if len(allow) == 0 {
		return ""
	}
	return strings.Join(append(allow, http.MethodOptions), ", ")
}

// call is one OpenAI request as the metrics see it.
type call struct {
	endpoint string
	model    string // modelUnknown until the model is known to exist
	start    time.Time
	// granted, when set, learns how long the request waited for a worker
	// (before the answer's first byte).
	granted func(waited time.Duration)
	// stats, once the request goes to the relay, is what its answer
	// said, for Config.Finished.
	stats *reqStats
}

// inferenceFunc is an OpenAI handler: it returns its error, which
// inference maps to the OpenAI error shape unless the answer began.
type inferenceFunc func(w http.ResponseWriter, r *http.Request, c *call) error

// inference authenticates with the API token and maps errors with
// openai.WriteError, the OpenAI side's one mapper.
func (s *Service) inference(endpoint string, fn inferenceFunc) http.Handler {
	return s.inferenceAs(endpoint, fn, false)
}

// inferenceAs is inference for the OpenAI API, or with anthropic for
// Anthropic's: errors in its shape, and its x-api-key header taken as
// well as a bearer token.
func (s *Service) inferenceAs(endpoint string, fn inferenceFunc, anthropicAPI bool) http.Handler {
	writeError := openai.WriteError
	if anthropicAPI {
		writeError = anthropic.WriteError
	}
	return s.inferenceWith(endpoint, fn, writeError, anthropicAPI)
}

// inferenceWith is inference with errors written by writeError; with
// xAPIKey, Anthropic's x-api-key header is taken as well as a bearer token.
func (s *Service) inferenceWith(endpoint string, fn inferenceFunc, writeError func(http.ResponseWriter, error) int, xAPIKey bool) http.Handler {
	anthropicAPI := xAPIKey
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c := &call{endpoint: endpoint, model: modelUnknown, start: time.Now()}
		sw := &api.StatusRecorder{ResponseWriter: w}
		done, err := transport.CORS(sw, r, s.cfg.CORSOrigins)
		if done {
			return // a preflight, answered
		}
		if err != nil {
			err = &openai.Error{Status: http.StatusForbidden, Code: "forbidden_origin", Message: err.Error()}
		} else if tok := s.cfg.APIToken; tok != "" && subtle.ConstantTimeCompare([]byte(clientToken(r, anthropicAPI)), []byte(tok)) != 1 {
			sw.Header().Set("WWW-Authenticate", `Bearer realm="apiary"`)
			err = &openai.Error{Status: http.StatusUnauthorized, Code: openai.CodeUnauthorized,
				Message: "missing or wrong bearer token (" + secret.APITokenEnv + ")"}
		} else {
			err = fn(sw, r, c)
		}
		gone := err != nil && (errors.Is(err, errClientGone) || r.Context().Err() != nil)
		switch {
		case err == nil, gone:
			// Nobody is left to answer.
		case sw.Status == 0:
			oe := s.guarded(openai.AsError(err), r)
			writeError(sw, oe)
			if oe.Status >= 500 && oe.Status != http.StatusServiceUnavailable && oe.Status != http.StatusGatewayTimeout {
				s.log.Error("inference request failed", "path", r.URL.Path, "model_ref", c.model, "status", oe.Status, "err", err)
			}
		default:
			s.log.Warn("inference request failed after its answer began", "path", r.URL.Path, "model_ref", c.model, "err", err)
		}
		code := strconv.Itoa(sw.Code())
		if gone {
			code = "499" // nginx's "client closed request"
		}
		s.m.requests.WithLabelValues(c.model, c.endpoint, code).Inc()
		if c.stats != nil && s.cfg.Finished != nil {
			status := sw.Code()
			if gone {
				status = 499
			}
			s.cfg.Finished(c.stats.finished(c.start, c.endpoint, s.nameOf(c.model), c.stats.stream, status))
		}
	})
}

// clientToken is the API token a request carries: its bearer token, or
// for Anthropic's API its x-api-key header when it has no bearer token.
func clientToken(r *http.Request, anthropicAPI bool) string {
	if tok := api.Bearer(r); tok != "" || !anthropicAPI {
		return tok
	}
	return r.Header.Get("X-Api-Key")
}

// errClientGone means the client went away; nothing can be answered.
var errClientGone = errors.New("client went away")

// upstreamError is a worker's error answer that the queen could not
// pass on (it tried elsewhere, and no worker did better): a worker that
// is busy (503) is the client's 503, anything else a bad gateway.
type upstreamError struct {
	status  int
	code    string
	message string
	// answer is how the client is answered (openai.Coded): a busy worker
	// (503) is the client's 503 with the worker's code, anything else a
	// bad gateway.
	answer openai.CodedError
}

func newUpstreamError(status int, code, message string) *upstreamError {
	e := &upstreamError{status: status, code: code, message: message,
		answer: openai.CodedError{Status: http.StatusBadGateway, Code: "worker_failed", Type: openai.TypeServer}}
	if status == http.StatusServiceUnavailable {
		e.answer = openai.CodedError{Status: status, Code: code, Retry: time.Second}
	}
	return e
}

func (e *upstreamError) Error() string {
	return fmt.Sprintf("worker answered %d %s: %s", e.status, e.code, e.message)
}

func (e *upstreamError) HTTPStatus() int           { return e.answer.Status }
func (e *upstreamError) ErrorCode() string         { return e.answer.Code }
func (e *upstreamError) RetryAfter() time.Duration { return e.answer.Retry }
func (e *upstreamError) ErrorType() string         { return e.answer.Type }

// servable returns the pools that count for /v1/models and for "does
// this model exist": every pool that is not offline.
func (s *Service) servable() []registry.Pool {
	return s.cp.Pools(registry.Filter{Statuses: []registry.Status{registry.Healthy, registry.Draining, registry.Unhealthy}})
}

func (s *Service) getModels(w http.ResponseWriter, r *http.Request, _ *call) error {
	list, err := s.listModels(r)
	if err != nil {
		return err
	}
	openai.WriteJSON(w, http.StatusOK, list)
	return nil
}

// listModels is what GET /v1/models lists for r: every model a pool has
// or a worker runs, and the config's names and aliases; with
// X-Apiary-Pool, what that pool can serve.
func (s *Service) listModels(r *http.Request) (openai.ModelList, error) {
	pools := s.servable()
	id := r.Header.Get(api.PoolHeader)
	if id != "" {
		// What one pool can serve (its hive's list and its workers).
		if _, err := s.knownPool(id); err != nil {
			return openai.ModelList{}, err
		}
		pools = slices.DeleteFunc(pools, func(p registry.Pool) bool { return p.ID != id })
	}
	s.catalog.ensureRead(r.Context(), answering(pools))
	cat := s.catalog.snapshot()
	seen := map[string]openai.Model{}
	add := func(ref string, created int64) {
		if m, ok := seen[ref]; !ok || (m.AliasOf == "" && created > 0 && (m.Created == 0 || created < m.Created)) {
			seen[ref] = openai.Model{ID: ref, Object: openai.ObjectModel, Created: created, OwnedBy: "apiary"}
		}
	}
	if id == "" {
		// The config's names and aliases, with their file's time.
		for _, m := range s.configuredModels() {
			if info, ok := s.catalog.lookup(pools, s.resolve(m.ID).ref); ok {
				m.Created = info.ModifiedAt.Unix()
			}
			seen[m.ID] = m
		}
	}
	for _, p := range pools {
		for ref, m := range cat[p.ID] {
			add(ref, m.ModifiedAt.Unix())
		}
		for _, wk := range p.Workers {
			if wk.ModelRef != "" {
				add(wk.ModelRef, 0)
			}
		}
	}
	if id == "" {
		// The models of live rows no pool lists: workers run by hand
		// (a request for them is routed, see knownModel).
		for _, ref := range s.cp.LiveModels() {
			add(ref, 0)
		}
	}
	list := openai.ModelList{Object: openai.ObjectList, Data: make([]openai.Model, 0, len(seen))}
	for _, m := range seen {
		if info, ok := s.catalog.lookup(pools, s.resolve(m.ID).ref); ok {
			m.Capabilities = s.capabilities(info)
		}
		list.Data = append(list.Data, m)
	}
	slices.SortFunc(list.Data, func(a, b openai.Model) int {
		switch {
		case a.ID < b.ID:
			return -1
		case a.ID > b.ID:
			return 1
		}
		return 0
	})
	return list, nil
}

// capabilities is what a model's file does beyond text, as a hive lists
// it or the config gives it (a projector: mmproj), for
// openai.Model.Capabilities.
func (s *Service) capabilities(m api.Model) []string {
	var c []string
	if s.hasProjector(m) {
		c = append(c, "vision")
	}
	if m.Pooling == "rank" {
		c = append(c, "rerank")
	}
	return c
}

func (s *Service) getModel(w http.ResponseWriter, r *http.Request, c *call) error {
	id := r.PathValue("id")
	// The hives' lists read as for the list, so that a model has the same
	// time in both.
	pools := s.servable()
	s.catalog.ensureRead(r.Context(), answering(pools))
	for _, m := range s.configuredModels() {
		if m.ID == id {
			c.model = s.resolve(id).ref
			if info, ok := s.catalog.lookup(pools, c.model); ok {
				m.Created, m.Capabilities = info.ModifiedAt.Unix(), s.capabilities(info)
			}
			openai.WriteJSON(w, http.StatusOK, m)
			return nil
		}
	}
	if err := s.knownModel(r.Context(), id, ""); err != nil {
		return err
	}
	c.model = id
	out := openai.Model{ID: id, Object: openai.ObjectModel, OwnedBy: "apiary"}
	if m, ok := s.catalog.lookup(s.servable(), id); ok {
		out.Created, out.Capabilities = m.ModifiedAt.Unix(), s.capabilities(m)
	}
	openai.WriteJSON(w, http.StatusOK, out)
	return nil
}

// knownModel reports ErrModelNotFound unless a pool (pool, when it is
// not "") has model, a worker of it lives there, or it is a configured
// model with a source (the controller pulls it). A model no list has
// makes the hives' lists be read again (at most once a second each)
// before the answer is no.
func (s *Service) knownModel(ctx context.Context, model, pool string) error {
	if api.CheckModel(model) != nil {
		return modelNotFound("%q is not a model ref (a GGUF file name without .gguf); see GET /v1/models", model)
	}
	// A live worker of the model answers it without a look at every pool
	// (the common case, and cheap with thousands of pools).
	if s.counts(target{model, pool}, false).Live() > 0 {
		return nil
	}
	pools := s.servable()
	where := "no pool has"
	if pool != "" {
		pools = slices.DeleteFunc(pools, func(p registry.Pool) bool { return p.ID != pool })
		where = "pool " + pool + " does not have"
	}
	if _, ok := s.catalog.lookup(pools, model); ok {
		return nil
	}
	if s.catalog.ensure(ctx, answering(pools), model) {
		return nil
	}
	if s.pullSource(model) != "" {
		return nil // the controller pulls it on a pool
	}
	return modelNotFound("%s model %q; see GET /v1/models", where, model)
}

// modelNotFound is ErrModelNotFound (404 model_not_found, the field
// "model") said once, in the words given.
func modelNotFound(format string, a ...any) error {
	return &openai.Error{Status: http.StatusNotFound, Code: openai.CodeModelNotFound, Param: "model",
		Message: fmt.Sprintf(format, a...), Err: ErrModelNotFound}
}

func (s *Service) postCompletions(w http.ResponseWriter, r *http.Request, c *call) error {
	return s.serveInference(w, r, c, "/v1/completions", func(body []byte) (string, bool, error) {
		req, err := openai.DecodeCompletionRequest(body, openai.Limits{})
		return req.Model, req.Stream, err
	})
}

func (s *Service) postChatCompletions(w http.ResponseWriter, r *http.Request, c *call) error {
	return s.serveInference(w, r, c, "/v1/chat/completions", func(body []byte) (string, bool, error) {
		req, err := openai.DecodeChatCompletionRequest(body, openai.Limits{})
		return req.Model, req.Stream, err
	})
}

func (s *Service) postEmbeddings(w http.ResponseWriter, r *http.Request, c *call) error {
	return s.serveInference(w, r, c, "/v1/embeddings", func(body []byte) (string, bool, error) {
		req, err := openai.DecodeEmbeddingRequest(body)
		return req.Model, false, err
	})
}

// postRerank relays POST /v1/rerank (and llama.cpp's other names of it)
// to a worker's /v1/rerank. A model the hives list with a pooling other
// than rank is refused here, as its worker would refuse it.
func (s *Service) postRerank(w http.ResponseWriter, r *http.Request, c *call) error {
	return s.serveInference(w, r, c, "/v1/rerank", func(body []byte) (string, bool, error) {
		req, err := openai.DecodeRerankRequest(body)
		if err != nil {
			return "", false, err
		}
		if req.Model != "" {
			if err := s.checkReranker(req.Model); err != nil {
				return "", false, err
			}
		}
		return req.Model, false, nil
	})
}

// checkReranker refuses name (a ref, or a configured name) when a pool
// lists its file with a pooling other than rank; a model no list has, or
// one an older hive lists without its pooling, is left to its worker.
func (s *Service) checkReranker(name string) error {
	m, ok := s.catalog.lookup(s.servable(), s.resolve(name).ref)
	if !ok || m.Pooling == "" || m.Pooling == "rank" {
		return nil
	}
	return openai.NotReranker(name, fmt.Errorf("%w: its pooling is %s", engine.ErrNotReranker, m.Pooling))
}

// postMessages relays Anthropic's POST /v1/messages. A configured
// model's name is resolved as on the OpenAI endpoints, but its sampling
// defaults (named as OpenAI names them) are not added.
func (s *Service) postMessages(w http.ResponseWriter, r *http.Request, c *call) error {
	return s.serveInference(w, r, c, "/v1/messages", func(body []byte) (string, bool, error) {
		req, err := anthropic.Decode(body)
		return req.Model, req.Stream, err
	})
}

// serveInference checks a request (the body is read up to path's limit,
// decoded and validated as the worker would, so that a bad one gets its
// 400 or 413 without a worker) and relays it as it came to a worker of
// its model.
func (s *Service) serveInference(w http.ResponseWriter, r *http.Request, c *call, path string,
	decode func([]byte) (model string, stream bool, err error)) error {
	body, err := s.readBody(w, r, path)
	if err != nil {
		return err
	}
	return s.serveRead(w, r, c, path, body, int64(len(body)), decode)
}

// serveRead is serveInference once the body is read: sent is its size as
// the client sent it (before a translation), checked against what its
// model takes (checkBodySize) once the model is known.
func (s *Service) serveRead(w http.ResponseWriter, r *http.Request, c *call, path string, body []byte, sent int64,
	decode func([]byte) (model string, stream bool, err error)) error {
	body, err := s.inlineImages(r.Context(), path, body)
	if err != nil {
		return err
	}
	model, stream, err := decode(body)
	if err != nil {
		return err
	}
	if model == "" {
		return &openai.Error{Status: http.StatusBadRequest, Code: openai.CodeMissingParameter, Param: "model",
			Message: "model is required: name the model to run (see GET /v1/models)", Err: openai.ErrInvalidRequest}
	}
	session := r.Header.Get(api.SessionHeader)
	if len(session) > maxSessionLen || (session != "" && !printable(session)) {
		return &openai.Error{Status: http.StatusBadRequest, Code: openai.CodeInvalidValue, Param: api.SessionHeader,
			Message: fmt.Sprintf("%s must be printable text of at most %d bytes", api.SessionHeader, maxSessionLen), Err: openai.ErrInvalidRequest}
	}
	pool := r.Header.Get(api.PoolHeader)
	if pool != "" {
		if err := s.usablePool(pool); err != nil {
			return err
		}
	}
	// A configured name or alias goes to its model's file, with the
	// model's sampling defaults; routing, affinity and placement see the
	// file.
	res := s.resolve(model)
	anthropicAPI := strings.HasPrefix(path, "/v1/messages")
	if anthropicAPI {
		res.model.Defaults = modelconfig.Defaults{}
	}
	if body, err = rewriteBody(body, model, res); err != nil {
		return err
	}
	rr := relayReq{model: res.ref, pool: pool, path: path, body: body, sent: sent, stream: stream, session: session, anthropic: anthropicAPI}
	if res.configured && model != res.ref {
		rr.name = model
	}
	return s.serveBody(w, r, c, rr)
}

// serveBody relays rr (its model resolved, its body checked) once its
// model is known: the last part of every inference endpoint.
func (s *Service) serveBody(w http.ResponseWriter, r *http.Request, c *call, rr relayReq) error {
	if err := s.knownModel(r.Context(), rr.model, rr.pool); err != nil {
		return err
	}
	if err := s.checkBodySize(rr.path, rr.model, rr.sent); err != nil {
		return err
	}
	c.model = rr.model
	c.stats = &reqStats{stream: rr.stream}
	rr.start, rr.granted, rr.stats = c.start, c.granted, c.stats
	return s.relay(w, r, rr)
}

// knownPool returns the registered pool id (from X-Apiary-Pool) names.
func (s *Service) knownPool(id string) (registry.Pool, error) {
	if len(id) > maxSessionLen || !printable(id) {
		return registry.Pool{}, &openai.Error{Status: http.StatusBadRequest, Code: openai.CodeInvalidValue, Param: api.PoolHeader,
			Message: fmt.Sprintf("%s must be a pool id (a node name) of at most %d bytes", api.PoolHeader, maxSessionLen), Err: openai.ErrInvalidRequest}
	}
	p, ok := s.cp.Pool(id)
	if !ok {
		return registry.Pool{}, &openai.Error{Status: http.StatusNotFound, Code: "pool_not_found", Param: api.PoolHeader,
			Message: fmt.Sprintf("no pool %q is registered (%s pins a request to one pool; see apiary pools)", id, api.PoolHeader)}
	}
	return p, nil
}

// usablePool checks the pool a request is pinned to (X-Apiary-Pool): it
// must be registered and healthy, or the request is answered at once
// rather than queued for a pool that cannot serve it.
func (s *Service) usablePool(id string) error {
	p, err := s.knownPool(id)
	if err != nil {
		return err
	}
	if p.Status != registry.Healthy {
		return &openai.Error{Status: http.StatusServiceUnavailable, Code: "pool_unavailable", Param: api.PoolHeader, RetryAfter: 5 * time.Second,
			Message: fmt.Sprintf("pool %s is %s: it takes no requests now (send the request without %s to use any pool)", id, p.Status, api.PoolHeader)}
	}
	return nil
}

func printable(s string) bool {
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}
