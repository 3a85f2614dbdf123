package transport

import (
	"crypto/subtle"
	"errors"
	"fmt"
	"mime"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/openai"
)

// A web page that a user opens can send requests to any address the
// user's machine reaches, apiary's daemons on loopback included: form
// posts and "simple" fetches (text/plain bodies, no preflight) cross
// sites freely, and DNS rebinding gives the page's own host name a
// loopback address, which makes its requests same-origin. The checks here
// refuse what such a page can send but apiary's own clients never do.

// CheckHost refuses a request whose Host header does not name loopback.
// It is for daemons that admit requests without a token and therefore
// listen on loopback only: there, a foreign host name in Host means DNS
// rebinding, never a real client (403 forbidden_host).
func CheckHost(r *http.Request) error {
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	if IsLoopback(host) {
		return nil
	}
	return &api.RequestError{Status: http.StatusForbidden, Code: "forbidden_host",
		Err: fmt.Errorf("host %q is not this daemon's: without tokens it answers only requests addressed to localhost, 127.0.0.1 or [::1]", printable(r.Host))}
}

// CheckNotForged refuses what a browser can send cross-site to an admin or
// cluster endpoint: a request that changes something (any method but GET,
// HEAD and OPTIONS) whose body is not declared application/json (415
// unsupported_media_type: only forms and text/plain cross sites without a
// preflight), and any request from a foreign Origin, or that the browser
// marks Sec-Fetch-Site: cross-site (403 forbidden_origin).
func CheckNotForged(r *http.Request) error {
	if origin := r.Header.Get("Origin"); origin != "" && !sameOrigin(origin, r) {
		return &api.RequestError{Status: http.StatusForbidden, Code: "forbidden_origin",
			Err: fmt.Errorf("requests from origin %q are refused: admin and cluster endpoints take no browser requests from other sites", printable(origin))}
	}
	if r.Header.Get("Sec-Fetch-Site") == "cross-site" {
		return &api.RequestError{Status: http.StatusForbidden, Code: "forbidden_origin",
			Err: fmt.Errorf("cross-site browser requests are refused")}
	}
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return nil
	}
	ct := r.Header.Get("Content-Type")
	if ct == "application/json" { // what clients send; ParseMediaType allocates
		return nil
	}
	if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
		return &api.RequestError{Status: http.StatusUnsupportedMediaType, Code: "unsupported_media_type",
			Err: fmt.Errorf("%s %s needs Content-Type: application/json (got %q)", r.Method, r.URL.Path, printable(r.Header.Get("Content-Type")))}
	}
	return nil
}

// sameOrigin reports whether origin is the daemon's own: the host (and
// port) the request was addressed to.
func sameOrigin(origin string, r *http.Request) bool {
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" {
		return false
	}
	return strings.EqualFold(u.Host, r.Host)
}

// CORS answers browser clients of the OpenAI endpoints. origins is the
// allow-list (exact "scheme://host[:port]" strings; "*" allows any, for
// deployments whose endpoints need a token anyway). A request without an
// Origin header is not a browser's cross-site request and passes. One
// from an allowed origin gets the CORS headers; a preflight (OPTIONS with
// Access-Control-Request-Method) is answered here, and done is true. Any
// other origin is refused with 403 forbidden_origin.
func CORS(w http.ResponseWriter, r *http.Request, origins []string) (done bool, err error) {
	origin := r.Header.Get("Origin")
	if origin == "" || sameOrigin(origin, r) && r.Method != http.MethodOptions {
		return false, nil
	}
	if !slices.Contains(origins, origin) && !slices.Contains(origins, "*") {
		return false, &api.RequestError{Status: http.StatusForbidden, Code: "forbidden_origin",
			Err: fmt.Errorf("origin %q is not allowed: list it in --cors-origin to let browser pages call this API", printable(origin))}
	}
	h := w.Header()
	h.Set("Access-Control-Allow-Origin", origin)
	h.Add("Vary", "Origin")
	h.Set("Access-Control-Expose-Headers", "X-Apiary-Worker, Retry-After")
	if r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != "" {
		h.Set("Access-Control-Allow-Methods", "GET, POST, OPTIONS")
		h.Set("Access-Control-Allow-Headers", "Authorization, Content-Type, X-Session-Id, X-Apiary-Pool, X-Api-Key, Anthropic-Version")
		h.Set("Access-Control-Max-Age", "600")
		w.WriteHeader(http.StatusNoContent)
		return true, nil
	}
	return false, nil
}

// CheckOrigins checks an allow-list for CORS: "*" or origins of the form
// scheme://host[:port] with nothing after.
func CheckOrigins(origins []string) error {
	for _, o := range origins {
		if o == "*" {
			continue
		}
		u, err := url.Parse(o)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Path != "" || u.RawQuery != "" || u.User != nil {
			return fmt.Errorf("CORS origin %q must be scheme://host[:port], e.g. https://chat.example.com, or *", printable(o))
		}
	}
	return nil
}

// AdmitWorkerRequest is nil when r may reach a worker's handlers (the
// built-in worker's, or an engine's front): with a worker token, every
// request but a health probe (GET or HEAD /health) needs it as the
// bearer; without one, only requests addressed to loopback are served,
// and a shutdown must not be forgeable by a browser. Either way a
// request a browser could forge from another origin is refused. The
// error is in OpenAI's shape.
//
// Only the probe goes without the token: an engine's front relays any
// other request to /health (POST /health, say) to the engine with the
// engine's key, and counts it as a request, which would keep an idle
// worker alive.
func AdmitWorkerRequest(r *http.Request, token string) error {
	if token == "" {
		if err := CheckHost(r); err != nil {
			return openAIError(err)
		}
	} else if !isHealthProbe(r) && subtle.ConstantTimeCompare([]byte(api.Bearer(r)), []byte(token)) != 1 {
		return &openai.Error{Status: http.StatusUnauthorized, Code: openai.CodeUnauthorized,
			Message: "this worker needs its token as a bearer token (APIARY_WORKER_TOKEN); send requests through the queen"}
	}
	if r.URL.Path == "/v1/admin/shutdown" && token == "" {
		return openAIError(CheckNotForged(r)) // no token to stop a forged one
	}
	if r.Header.Get("Origin") != "" || r.Header.Get("Sec-Fetch-Site") == "cross-site" {
		r2 := r.Clone(r.Context())
		r2.Method = http.MethodGet // the origin check alone: completions take any body type
		return openAIError(CheckNotForged(r2))
	}
	return nil
}

// isHealthProbe reports whether r is GET or HEAD /health or /metrics,
// the requests a worker answers without its token (its state and load,
// for probes and a gateway's endpoint picker).
func isHealthProbe(r *http.Request) bool {
	return (r.URL.Path == "/health" || r.URL.Path == "/metrics") && (r.Method == http.MethodGet || r.Method == http.MethodHead)
}

// openAIError turns a refusal of this package into OpenAI's error shape.
func openAIError(err error) error {
	var re *api.RequestError
	if errors.As(err, &re) {
		return &openai.Error{Status: re.Status, Code: re.Code, Message: re.Err.Error()}
	}
	return err
}
