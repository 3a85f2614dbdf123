package front

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httputil"
	"time"

	"github.com/apiary-llm/apiary/internal/openai"
	"github.com/apiary-llm/apiary/internal/transport"
)

// Error codes of the front, the built-in worker's where they mean the
// same.
const (
	codeModelLoading   = "model_loading"
	codeDraining       = "draining"
	codeEngineDown     = "engine_unhealthy"
	codeEngineNoAnswer = "engine_unreachable"
)

// Handler is the front's HTTP API:
//
//	GET  /health             the front's status and load, when the engine's health path answers 200; else 503
//	POST /v1/admin/shutdown  graceful shutdown (202)
//	anything else            relayed to the engine as it came, but for the bearer
//
// The token rule is the built-in worker's: with a token every request
// but GET (or HEAD) /health needs it as its bearer (a POST /health is
// relayed, so it needs the token too); without one only requests
// addressed to a loopback host are served, and a shutdown must be one a
// browser cannot forge. A relayed POST counts as a request in flight
// until its answer has been sent, and sets the last request time when
// it begins and ends.
func (f *Front) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", f.handleHealth)
	mux.HandleFunc("POST /v1/admin/shutdown", f.handleShutdown)
	mux.HandleFunc("/", f.handleRelay)
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if err := f.admit(r); err != nil {
			openai.WriteError(rw, err)
			return
		}
		mux.ServeHTTP(rw, r)
	})
}

// admit is nil when r may reach the handlers: the built-in worker's
// checks.
func (f *Front) admit(r *http.Request) error {
	return transport.AdmitWorkerRequest(r, f.cfg.Token)
}

// healthBody is GET /health: the fields of the built-in worker's that
// the hive reads.
type healthBody struct {
	Status        Status     `json:"status"`
	Model         string     `json:"model"`
	InFlight      int        `json:"in_flight"`
	Slots         int        `json:"slots"`
	LastRequestAt *time.Time `json:"last_request_at"`
}

// health is the front's status and load (the engine is not asked).
func (f *Front) health() healthBody {
	f.mu.Lock()
	defer f.mu.Unlock()
	h := healthBody{Status: f.status, Model: f.cfg.ModelRef, InFlight: f.inFlight, Slots: f.cfg.Slots}
	if h.Status == StatusReady && f.inFlight >= f.cfg.Slots {
		h.Status = StatusBusy
	}
	if !f.lastRequestAt.IsZero() {
		t := f.lastRequestAt.UTC().Truncate(time.Millisecond)
		h.LastRequestAt = &t
	}
	return h
}

// handleHealth answers the front's health once the engine's own health
// path answered 200 (a starting front answers without asking it), and
// 503 with the engine's answer when it did not.
func (f *Front) handleHealth(rw http.ResponseWriter, r *http.Request) {
	h := f.health()
	if h.Status != StatusLoading {
		if err := f.probe(r.Context(), 5*time.Second); err != nil {
			openai.WriteError(rw, &openai.Error{Status: http.StatusServiceUnavailable, Code: codeEngineDown,
				Message: fmt.Sprintf("the engine's health path did not answer 200: %v", err)})
			return
		}
	}
	openai.WriteJSON(rw, http.StatusOK, h)
}

func (f *Front) handleShutdown(rw http.ResponseWriter, r *http.Request) {
	f.log.Info("shutdown requested over HTTP", "remote", r.RemoteAddr)
	openai.WriteJSON(rw, http.StatusAccepted, map[string]string{"status": string(StatusDraining)})
	f.RequestShutdown()
}

// handleRelay relays r to the engine while the front is ready, counting
// a POST as a request in flight.
func (f *Front) handleRelay(rw http.ResponseWriter, r *http.Request) {
	counted := r.Method == http.MethodPost
	if err := f.begin(counted); err != nil {
		openai.WriteError(rw, err)
		return
	}
	if counted {
		defer f.end()
	}
	// Full duplex: the engine may answer before the relay has read the
	// body's end (the relay reads past its last byte to see it). Without
	// it net/http consumes and closes the body as the answer's headers
	// go out, and the relay, finding it closed, closes the engine
	// connection under the answer: streams cut after their first chunk.
	if err := http.NewResponseController(rw).EnableFullDuplex(); err != nil {
		f.log.Warn("relay without full duplex", "err", err)
	}
	// The shutdown grace's end cuts the request, as the client's going
	// away does.
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	defer context.AfterFunc(f.hardCtx, cancel)()
	f.proxy.ServeHTTP(rw, r.WithContext(ctx))
}

// begin admits a request: 503 model_loading while the engine starts,
// 503 draining once a shutdown began.
func (f *Front) begin(counted bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch f.status {
	case StatusLoading:
		return &openai.Error{Status: http.StatusServiceUnavailable, Code: codeModelLoading, RetryAfter: time.Second,
			Message: fmt.Sprintf("model %s is still loading; retry shortly", f.cfg.ModelRef)}
	case StatusDraining:
		return &openai.Error{Status: http.StatusServiceUnavailable, Code: codeDraining,
			Message: "this worker is shutting down and takes no new requests"}
	}
	if counted {
		f.inFlight++
		f.lastRequestAt = time.Now()
	}
	return nil
}

func (f *Front) end() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.inFlight--
	f.lastRequestAt = time.Now()
	f.checkIdleLocked()
}

// rewrite points a relayed request at the engine: the same method, path,
// query, headers and body, with the engine's key as its bearer instead
// of the worker's token (the proxy drops hop-by-hop headers, Forwarded
// and X-Forwarded-*).
func (f *Front) rewrite(pr *httputil.ProxyRequest) {
	pr.SetURL(f.target)
	pr.Out.Header.Del("Authorization")
	if f.cfg.EngineKey != "" {
		pr.Out.Header.Set("Authorization", "Bearer "+f.cfg.EngineKey)
	}
}

// proxyError answers a request the engine did not answer: 503 draining
// when the shutdown grace ran out first, nothing when the client went
// away, else 502 with the error shape.
func (f *Front) proxyError(rw http.ResponseWriter, r *http.Request, err error) {
	switch {
	case f.hardCtx.Err() != nil:
		openai.WriteError(rw, &openai.Error{Status: http.StatusServiceUnavailable, Code: codeDraining,
			Message: "this worker shut down before the engine answered"})
		return
	case r.Context().Err() != nil:
		f.log.Info("the client went away before the engine answered", "path", r.URL.Path)
		return
	}
	f.log.Warn("the engine did not answer", "path", r.URL.Path, "err", err)
	openai.WriteError(rw, &openai.Error{Status: http.StatusBadGateway, Code: codeEngineNoAnswer,
		Message: fmt.Sprintf("the engine did not answer: %v", err)})
}
