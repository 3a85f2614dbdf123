//go:build !race

package queen

// The security holes once open, each written as the attack with real processes: the
// request that used to work must fail, and the legitimate one must still
// work.

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/keeper"
	"github.com/apiary-llm/apiary/internal/testbin"
	"github.com/apiary-llm/apiary/internal/testmodel"
)

// attack sends one raw request and returns its status and body.
func attack(t *testing.T, method, url, host string, header map[string]string, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if host != "" {
		req.Host = host
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// A worker listens on its node's network. Straight to it, without its
// token, nothing but /health answers; through the queen it serves.
func TestAttack_WorkerNeedsItsOwnToken(t *testing.T) {
	c := startCluster(t, nil)
	if _, err := c.client.Completions.New(t.Context(), completion(4)); err != nil {
		t.Fatalf("through the queen: %v", err)
	}
	rows := c.rows()
	if len(rows) != 1 || rows[0].URI == "" {
		t.Fatalf("rows %+v", rows)
	}
	uri := rows[0].URI
	for _, tc := range []struct{ method, path, auth, body string }{
		{"POST", "/v1/completions", "", `{"model":"tiny","prompt":"hi","max_tokens":2}`},
		{"POST", "/v1/chat/completions", "", `{"model":"tiny","messages":[{"role":"user","content":"hi"}]}`},
		{"GET", "/v1/models", "", ""},
		{"POST", "/v1/completions", "Bearer wrong-token-0123456789", `{"model":"tiny","prompt":"hi","max_tokens":2}`},
		{"POST", "/v1/admin/shutdown", "", `{}`},
	} {
		h := map[string]string{"Content-Type": "application/json"}
		if tc.auth != "" {
			h["Authorization"] = tc.auth
		}
		if status, body := attack(t, tc.method, uri+tc.path, "", h, tc.body); status != http.StatusUnauthorized {
			t.Errorf("%s %s straight to the worker (auth %q): %d %s, want 401", tc.method, tc.path, tc.auth, status, body)
		}
	}
	if status, _ := attack(t, "GET", uri+"/health", "", nil, ""); status != http.StatusOK {
		t.Errorf("worker /health: %d, want 200 (the hive probes it)", status)
	}
	// The worker still serves the queen.
	if _, err := c.client.Completions.New(t.Context(), completion(4)); err != nil {
		t.Fatalf("through the queen after the attacks: %v", err)
	}
	for _, tok := range []string{"worker_token", "APIARY_WORKER_TOKEN"} {
		if strings.Contains(c.queen.logs.String(), tok) {
			t.Errorf("the queen's log mentions %s", tok)
		}
	}
}

// With no tokens (loopback), a web page the user opens must not be able
// to drive the queen or the hive: cross-site form and text/plain posts,
// foreign origins, and DNS rebinding (a foreign Host) are refused, and the
// daemons stay up. apiary's own clients still work.
func TestAttack_BrowserCannotDriveTheDaemons(t *testing.T) {
	c := startCluster(t, nil)
	pools, err := c.admin.Pools(t.Context(), keeper.PoolFilter{})
	if err != nil || len(pools) != 1 {
		t.Fatalf("pools %+v %v", pools, err)
	}
	hiveURL := pools[0].Endpoint
	plain := map[string]string{"Content-Type": "text/plain"}
	form := map[string]string{"Content-Type": "application/x-www-form-urlencoded", "Origin": "http://evil.example"}
	evilJSON := map[string]string{"Content-Type": "application/json", "Origin": "http://evil.example"}
	json := map[string]string{"Content-Type": "application/json"}
	rebound := strings.Replace(strings.TrimPrefix(c.url, "http://"), "127.0.0.1", "evil.example", 1)
	hiveRebound := strings.Replace(strings.TrimPrefix(hiveURL, "http://"), "127.0.0.1", "evil.example", 1)
	for _, tc := range []struct {
		name, method, url, host string
		h                       map[string]string
		body                    string
		want                    int
	}{
		{"queen shutdown as text/plain", "POST", c.url + "/api/admin/shutdown", "", plain, `{"reason":"pwned"}`, 415},
		{"queen shutdown as a form", "POST", c.url + "/api/admin/shutdown", "", form, `reason=pwned`, 403},
		{"queen shutdown from a foreign origin", "POST", c.url + "/api/admin/shutdown", "", evilJSON, `{"reason":"pwned"}`, 403},
		{"queen shutdown by rebinding", "POST", c.url + "/api/admin/shutdown", rebound, json, `{"reason":"pwned"}`, 403},
		{"start a worker as text/plain", "POST", c.url + "/api/admin/workers", "", plain, `{"action":"start","model_ref":"tiny","reason":"x"}`, 415},
		{"add an SSH node as text/plain", "POST", c.url + "/api/admin/nodes", "", plain, `{"name":"evil","ssh":"root@evil.example"}`, 415},
		{"drain a pool as text/plain", "POST", c.url + "/v2/pools/node-1/drain", "", plain, `{"reason":"x"}`, 415},
		{"read the audit log by rebinding", "GET", c.url + "/api/admin/audit", rebound, nil, "", 403},
		{"prompt from a foreign origin", "POST", c.url + "/v1/completions", "", evilJSON, `{"model":"tiny","prompt":"hi","max_tokens":2}`, 403},
		{"prompt by rebinding", "POST", c.url + "/v1/completions", rebound, json, `{"model":"tiny","prompt":"hi","max_tokens":2}`, 403},
		{"hive start as text/plain", "POST", hiveURL + "/v2/workers/start", "", plain, `{"model_ref":"tiny"}`, 415},
		{"hive shutdown from a foreign origin", "POST", hiveURL + "/v2/shutdown", "", evilJSON, `{}`, 403},
		{"hive shutdown by rebinding", "POST", hiveURL + "/v2/shutdown", hiveRebound, json, `{}`, 403},
	} {
		status, body := attack(t, tc.method, tc.url, tc.host, tc.h, tc.body)
		if status != tc.want || !strings.Contains(body, `"code":"`) {
			t.Errorf("%s: %d %s, want %d with the error shape", tc.name, status, body, tc.want)
		}
	}
	// Nothing happened: both daemons are up, the pool is not drained, no
	// worker was started.
	for _, u := range []string{c.url, hiveURL} {
		if status, _ := attack(t, "GET", u+"/health", "", nil, ""); status != 200 {
			t.Errorf("%s/health: %d after the attacks", u, status)
		}
	}
	pools, err = c.admin.Pools(t.Context(), keeper.PoolFilter{})
	if err != nil || len(pools) != 1 || pools[0].Status != "healthy" || pools[0].Drained {
		t.Errorf("pool after the attacks: %+v %v", pools, err)
	}
	if rows := c.rows(); len(rows) != 0 {
		t.Errorf("rows after the attacks: %+v", rows)
	}
	// The legitimate clients: curl without a Content-Type to the OpenAI
	// endpoint, the OpenAI client, the keeper.
	if status, body := attack(t, "POST", c.url+"/v1/completions", "", nil, `{"model":"tiny","prompt":"hi","max_tokens":2}`); status != 200 {
		t.Errorf("curl-style completion: %d %s", status, body)
	}
	if status, body := attack(t, "GET", c.url+"/v1/models", "localhost"+c.url[strings.LastIndexByte(c.url, ':'):], nil, ""); status != 200 {
		t.Errorf("GET /v1/models at localhost: %d %s", status, body)
	}
	if _, err := c.admin.DrainPool(t.Context(), "node-1", "maintenance"); err != nil {
		t.Errorf("the keeper's drain: %v", err)
	}
}

// A queen with some tokens set but not all would leave the other roles
// open: it refuses to start, naming what is missing.
func TestAttack_PartialTokensRefuseToStart(t *testing.T) {
	cmd := exec.Command(testbin.Path(t), "queen", "--addr", "127.0.0.1:0", "--data-dir", t.TempDir())
	cmd.Env = append(os.Environ(), "APIARY_ADMIN_TOKEN=admin-0123456789abcdef", "APIARY_API_TOKEN=", "APIARY_CLUSTER_TOKEN=")
	out, err := cmd.CombinedOutput()
	if code := cmd.ProcessState.ExitCode(); err == nil || code != 2 ||
		!strings.Contains(string(out), "APIARY_API_TOKEN") || !strings.Contains(string(out), "APIARY_CLUSTER_TOKEN") {
		t.Fatalf("queen with only the admin token: exit %d, %s", code, out)
	}
}

// TLS end to end with a throwaway CA: queen and hive serve HTTPS, the
// hive's workers too, the keeper answers a prompt over https; plain HTTP
// to any of them is refused, and a client without the CA gets a TLS error
// that says so.
func TestTLSEndToEnd(t *testing.T) {
	certs := testbin.MakeTLS(t, t.TempDir(), "127.0.0.1", "localhost")
	env := []string{"APIARY_CA_FILE=" + certs.CA}
	tlsArgs := []string{"--tls-cert", certs.Cert, "--tls-key", certs.Key}
	q := startProc(t, "queen", env, append([]string{"queen", "--addr", "127.0.0.1:0", "--data-dir", t.TempDir()}, tlsArgs...)...)
	rec, _ := q.logs.wait(t, 0, "queen serving", nil)
	qURL := "https://" + rec.Attrs["addr"]
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "models"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := testmodel.WriteFile(filepath.Join(dir, "models", "tiny.gguf"), testmodel.Options{}); err != nil {
		t.Fatal(err)
	}
	hive := startProc(t, "hive", env, append([]string{"hive", "--addr", "127.0.0.1:0", "--queen", qURL, "--pool-id", "node-1",
		"--data-dir", dir, "--heartbeat-interval", "500ms", "--worker-ports", "24000-24999", "--worker-threads", "1"}, tlsArgs...)...)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("queen logs:\n%s", q.logs.String())
			t.Logf("hive logs:\n%s", hive.logs.String())
		}
		_ = hive.stop(t, 15)
		_ = q.stop(t, 15)
	})
	q.logs.wait(t, 0, "pool status changed", map[string]string{"pool_id": "node-1", "to": "healthy"})

	infer := func(extraEnv ...string) (string, string, int) {
		cmd := exec.Command(testbin.Path(t), "infer", "--queen", qURL, "--model", "tiny", "--prompt", "Hello", "--max-tokens", "4")
		cmd.Env = append(os.Environ(), extraEnv...)
		var out, errOut strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &errOut
		_ = cmd.Run()
		return out.String(), errOut.String(), cmd.ProcessState.ExitCode()
	}
	if out, errOut, code := infer(env...); code != 0 || out == "" {
		t.Fatalf("infer over https: exit %d, stdout %q, stderr %s", code, out, errOut)
	}
	if _, errOut, code := infer("APIARY_CA_FILE="); code == 0 || !strings.Contains(errOut, "TLS") {
		t.Errorf("infer without the CA: exit %d, stderr %s; want a TLS error", code, errOut)
	}

	// Every URL the cluster hands out is https, and plain HTTP to it gets
	// nothing served.
	hc := &http.Client{Timeout: 5 * time.Second}
	pools := getJSON[api.PoolList](t, hc, certs, qURL+"/v2/pools")
	rows := getJSON[api.LifecycleRowList](t, hc, certs, qURL+"/api/admin/workers")
	if len(pools.Pools) != 1 || len(rows.Workers) != 1 {
		t.Fatalf("pools %+v rows %+v", pools, rows)
	}
	hiveURL, workerURI := pools.Pools[0].Endpoint, rows.Workers[0].URI
	for _, u := range []string{qURL, hiveURL, workerURI} {
		if !strings.HasPrefix(u, "https://") {
			t.Errorf("%s is not https", u)
			continue
		}
		resp, err := hc.Get("http://" + strings.TrimPrefix(u, "https://") + "/health")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 || strings.Contains(string(b), `"status"`) {
				t.Errorf("plain HTTP to %s: %d %s", u, resp.StatusCode, b)
			}
		}
	}
	// The worker over TLS still wants its own token.
	tc := tlsClient(t, certs)
	resp, err := tc.Post(workerURI+"/v1/completions", "application/json", strings.NewReader(`{"model":"tiny","prompt":"hi"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("https to the worker without its token: %d, want 401", resp.StatusCode)
	}
}

func tlsClient(t *testing.T, certs testbin.TLSFiles) *http.Client {
	t.Helper()
	pool := x509PoolFrom(t, certs.CA)
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
}

func getJSON[T any](t *testing.T, _ *http.Client, certs testbin.TLSFiles, url string) T {
	t.Helper()
	var out T
	resp, err := tlsClient(t, certs).Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d %s", url, resp.StatusCode, b)
	}
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return out
}

func x509PoolFrom(t *testing.T, caFile string) *x509.CertPool {
	t.Helper()
	pem, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		t.Fatal("no CA in " + caFile)
	}
	return pool
}
