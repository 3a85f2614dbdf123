package transport

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/openai"
)

func TestCheckBaseURL(t *testing.T) {
	for _, ok := range []string{"http://127.0.0.1:9200", "https://node-1.example.com", "http://[::1]:8001/", "https://h_1.internal:443"} {
		if _, err := CheckBaseURL("endpoint", ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for bad, want := range map[string]string{
		"http://127.0.0.1:1/?":            "query",
		"http://127.0.0.1:1?x=1":          "query",
		"http://127.0.0.1:1#frag":         "fragment",
		"http://u:p@127.0.0.1:1":          "user info",
		"http://127.0.0.1:1/v2":           "path",
		"file:///etc/passwd":              "scheme",
		"gopher://h:70":                   "scheme",
		"http://":                         "host",
		"http://127.0.0.1:0":              "port",
		"http://127.0.0.1:99999":          "port",
		"http://evil\x1b[2J.example":      "URL",
		"http:127.0.0.1":                  "host",
		"http://a b.example":              "",
		"http://-bad-.example":            "neither",
		"//127.0.0.1:1":                   "scheme",
		"http://127.0.0.1:1/%2e%2e/admin": "path",
	} {
		_, err := CheckBaseURL("endpoint", bad)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want an error about %s", bad, err, want)
		}
		if err != nil && strings.ContainsAny(err.Error(), "\x1b\x00") {
			t.Errorf("%q: the error carries control bytes: %q", bad, err)
		}
	}
}

// A list of queens: every element checked, spaces and a trailing "/"
// dropped; an empty element, a bad URL or one given twice is named with
// its place.
func TestBaseURLs(t *testing.T) {
	got, err := BaseURLs("--queen", " http://a:8080/, https://b.example.com ")
	if err != nil || strings.Join(got, " ") != "http://a:8080 https://b.example.com" {
		t.Fatalf("got %q, %v", got, err)
	}
	if got, err := BaseURLs("--queen", "http://127.0.0.1:8080"); err != nil || len(got) != 1 {
		t.Fatalf("one URL: %q, %v", got, err)
	}
	for bad, want := range map[string]string{
		"":                          "--queen is empty",
		"http://a:1,,http://b:1":    "element 2 is empty",
		"http://a:1,":               "element 2 is empty",
		"http://a:1, ftp://b:1":     `--queen element 2 "ftp://b:1": scheme must be http or https`,
		"http://a:1,http://b:1/v2":  `--queen element 2 "http://b:1/v2" must not have a path`,
		"http://a:1,http://a:1/":    "http://a:1 is given twice",
		"127.0.0.1:8080":            "is not a URL",
		"http://a:1,http://b:99999": "element 2",
	} {
		if _, err := BaseURLs("--queen", bad); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: got %v, want an error with %q", bad, err, want)
		}
	}
}

func TestCheckNotForged(t *testing.T) {
	for _, tc := range []struct {
		name, method, ct, origin, site string
		want                           int
	}{
		{"json post", "POST", "application/json", "", "", 0},
		{"json post with charset", "POST", "application/json; charset=utf-8", "", "", 0},
		{"same origin", "POST", "application/json", "http://127.0.0.1:8080", "same-origin", 0},
		{"get", "GET", "", "", "", 0},
		{"text/plain", "POST", "text/plain", "", "", 415},
		{"form", "POST", "application/x-www-form-urlencoded", "", "", 415},
		{"no type", "POST", "", "", "", 415},
		{"delete without type", "DELETE", "", "", "", 415},
		{"foreign origin", "POST", "application/json", "http://evil.example", "", 403},
		{"null origin", "POST", "application/json", "null", "", 403},
		{"foreign origin get", "GET", "", "http://evil.example", "", 403},
		{"cross-site fetch", "GET", "", "", "cross-site", 403},
	} {
		r := httptest.NewRequest(tc.method, "http://127.0.0.1:8080/api/admin/shutdown", nil)
		if tc.ct != "" {
			r.Header.Set("Content-Type", tc.ct)
		}
		if tc.origin != "" {
			r.Header.Set("Origin", tc.origin)
		}
		if tc.site != "" {
			r.Header.Set("Sec-Fetch-Site", tc.site)
		}
		err := CheckNotForged(r)
		var re *api.RequestError
		switch {
		case tc.want == 0 && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != 0 && (!errors.As(err, &re) || re.Status != tc.want):
			t.Errorf("%s: %v, want %d", tc.name, err, tc.want)
		}
	}
}

func TestCheckHost(t *testing.T) {
	for host, ok := range map[string]bool{
		"127.0.0.1:8080": true, "localhost:8080": true, "[::1]:8080": true, "localhost": true, "app.localhost:1": true,
		"evil.example:8080": false, "192.168.1.5:8080": false, "127.0.0.1.nip.io:8080": false, "": false,
	} {
		r := httptest.NewRequest("GET", "http://x/", nil)
		r.Host = host
		if err := CheckHost(r); (err == nil) != ok {
			t.Errorf("Host %q: %v, want ok=%v", host, err, ok)
		}
	}
}

func TestCORS(t *testing.T) {
	allowed := []string{"https://chat.example.com"}
	pre := httptest.NewRequest("OPTIONS", "http://127.0.0.1:8080/v1/chat/completions", nil)
	pre.Header.Set("Origin", "https://chat.example.com")
	pre.Header.Set("Access-Control-Request-Method", "POST")
	w := httptest.NewRecorder()
	if done, err := CORS(w, pre, allowed); !done || err != nil || w.Code != http.StatusNoContent ||
		w.Header().Get("Access-Control-Allow-Origin") != "https://chat.example.com" ||
		!strings.Contains(w.Header().Get("Access-Control-Allow-Headers"), "Authorization") {
		t.Errorf("preflight: done=%v err=%v %d %v", done, err, w.Code, w.Header())
	}
	evil := httptest.NewRequest("POST", "http://127.0.0.1:8080/v1/completions", nil)
	evil.Header.Set("Origin", "https://evil.example")
	if _, err := CORS(httptest.NewRecorder(), evil, allowed); err == nil {
		t.Error("a foreign origin passed")
	}
	if _, err := CORS(httptest.NewRecorder(), evil, nil); err == nil {
		t.Error("an origin passed the empty allow-list")
	}
	curl := httptest.NewRequest("POST", "http://127.0.0.1:8080/v1/completions", nil)
	if done, err := CORS(httptest.NewRecorder(), curl, nil); done || err != nil {
		t.Errorf("a request without Origin: %v %v", done, err)
	}
	for _, bad := range []string{"chat.example.com", "https://chat.example.com/", "https://u@x", "ftp://x"} {
		if CheckOrigins([]string{bad}) == nil {
			t.Errorf("origin %q accepted", bad)
		}
	}
}

// The client never follows a redirect: the 3xx comes back as it is, and
// the target (which would get the bearer token) sees nothing.
func TestClientRefusesRedirects(t *testing.T) {
	hit := false
	target := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { hit = true }))
	defer target.Close()
	redirector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, target.URL+"/steal", http.StatusTemporaryRedirect)
	}))
	defer redirector.Close()
	req, _ := http.NewRequest("POST", redirector.URL+"/v2/workers/start", strings.NewReader("{}"))
	req.Header.Set("Authorization", "Bearer secret")
	resp, err := NewClient(nil, 0).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusTemporaryRedirect || hit {
		t.Errorf("status %d, redirect target hit: %v", resp.StatusCode, hit)
	}
}

func TestLoadClientTLS(t *testing.T) {
	if _, err := loadClientTLS(t.TempDir() + "/missing.pem"); err == nil || !strings.Contains(err.Error(), CAFileEnv) {
		t.Errorf("missing CA file: %v", err)
	}
	if _, err := loadClientTLS("/etc/hostname"); err == nil || !strings.Contains(err.Error(), "no PEM") {
		t.Errorf("not a PEM: %v", err)
	}
	if (ServerTLS{CertFile: "a"}).Validate() == nil {
		t.Error("a certificate without its key passed")
	}
	if err := (ServerTLS{CertFile: "/etc/hostname", KeyFile: "/etc/hostname"}).Validate(); err == nil {
		t.Error("a bad pair passed")
	}
}

// With a worker token only a health probe, GET or HEAD /health, goes
// without it: any other method on /health (which an engine's front
// relays to its engine) needs the token as every other path does.
func TestAdmitWorkerRequestExemptsOnlyTheHealthProbe(t *testing.T) {
	const token = "worker-token-0123456789"
	for _, c := range []struct {
		method, path, auth string
		ok                 bool
	}{
		{"GET", "/health", "", true},
		{"HEAD", "/health", "", true},
		{"POST", "/health", "", false},
		{"PUT", "/health", "", false},
		{"DELETE", "/health", "", false},
		{"OPTIONS", "/health", "", false},
		{"POST", "/health", "Bearer " + token, true},
		{"POST", "/health", "bearer " + token, true}, // the scheme in any case (RFC 7235)
		{"GET", "/v1/models", "", false},
		{"GET", "/v1/models", "Bearer " + token, true},
		{"GET", "/v1/models", "BEARER " + token, true},
		{"POST", "/v1/chat/completions", "Bearer wrong", false},
	} {
		r := httptest.NewRequest(c.method, "http://127.0.0.1:8001"+c.path, nil)
		if c.auth != "" {
			r.Header.Set("Authorization", c.auth)
		}
		err := AdmitWorkerRequest(r, token)
		if (err == nil) != c.ok {
			t.Errorf("%s %s (%q): %v, want ok=%v", c.method, c.path, c.auth, err, c.ok)
		}
		var oe *openai.Error
		if err != nil && (!errors.As(err, &oe) || oe.Status != http.StatusUnauthorized) {
			t.Errorf("%s %s: %v, want a 401", c.method, c.path, err)
		}
	}
}
