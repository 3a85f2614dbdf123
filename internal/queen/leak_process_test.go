//go:build !race

package queen

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/apiary-llm/apiary/internal/testmodel"
)

// apiCall is one request of one of the four APIs, for model.
type apiCall struct {
	name, path string
	body       func(model string) string
}

var fourAPIs = []apiCall{
	{"openai chat", "/v1/chat/completions", func(m string) string {
		return `{"model":"` + m + `","messages":[{"role":"user","content":"hi"}],"max_tokens":4}`
	}},
	{"openai completions", "/v1/completions", func(m string) string { return `{"model":"` + m + `","prompt":"hi","max_tokens":4}` }},
	{"anthropic", "/v1/messages", func(m string) string {
		return `{"model":"` + m + `","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`
	}},
	{"ollama", "/api/chat", func(m string) string {
		return `{"model":"` + m + `","messages":[{"role":"user","content":"hi"}],"stream":false}`
	}},
	{"responses", "/v1/responses", func(m string) string { return `{"model":"` + m + `","input":"hi","max_output_tokens":16}` }},
}

// Each way the queen refuses a request, on each of the four APIs, says
// why in words: no answer holds a file path (of the test's directories),
// an internal address or a lifecycle id. The details are in the queen's
// log. The refusals: a model no pool has (said once); a pinned pool that
// is not registered; a model whose file the hive no longer has (the hive
// refuses the start naming its models directory); a pool whose hive does
// not answer (killed). `apiary infer` of a model no pool has says so
// before it waits for a worker. Clients that go away (mid-wait) leave no
// ERROR in the queen's log.
func TestProcessRefusalsSayWhyWithoutInternals(t *testing.T) {
	c := startClusterWith(t, clusterOptions{apiToken: "api-token-0123456789", more: map[string]testmodel.Options{"extra": {}}},
		[]string{"--hive-timeout", "1s"})
	tmp := filepath.Dir(c.dir) // the test's temp directories are beside it
	pathRE := regexp.MustCompile(regexp.QuoteMeta(tmp) + `|/tmp/|/home/|` + regexp.QuoteMeta(os.TempDir()+"/"))
	send := func(ctx context.Context, call apiCall, model string, header map[string]string) (int, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, "POST", c.url+call.path, strings.NewReader(call.body(model)))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer api-token-0123456789")
		req.Header.Set("Content-Type", "application/json")
		for k, v := range header {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			if ctx.Err() != nil {
				return 0, ""
			}
			t.Fatalf("%s: %v", call.name, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	clean := func(what string, call apiCall, status int, body string) {
		t.Helper()
		t.Logf("%s, %s: %d %s", what, call.name, status, strings.TrimSpace(body))
		for _, bad := range []struct {
			re   *regexp.Regexp
			what string
		}{{pathRE, "a file path"}, {regexp.MustCompile(`127\.0\.0\.1|localhost:|https?://`), "an internal address"}, {regexp.MustCompile(`wk-[0-9a-f]`), "a lifecycle id"}} {
			if m := bad.re.FindString(body); m != "" {
				t.Errorf("%s, %s: %d %s holds %s (%q)", what, call.name, status, body, bad.what, m)
			}
		}
	}

	// A model no pool has: 404, said once.
	for _, call := range fourAPIs {
		status, body := send(t.Context(), call, "llama3", nil)
		clean("unknown model", call, status, body)
		if status != http.StatusNotFound || strings.Count(body, "no pool has") != 1 || !strings.Contains(body, "llama3") {
			t.Errorf("unknown model, %s: %d %s, want 404 saying once that no pool has llama3", call.name, status, body)
		}
	}
	// `apiary infer` says it before any wait.
	out, err := apiaryWith(t, []string{"APIARY_API_TOKEN=api-token-0123456789", "APIARY_ADMIN_TOKEN=admin-api-token-0123456789",
		"APIARY_CLUSTER_TOKEN=cluster-api-token-0123456789"}, "infer", "--queen", c.url, "--model", "llama3", "--prompt", "hi")
	if err == nil || strings.Contains(err.Error(), "waiting for a worker") || !strings.Contains(err.Error(), `no pool has model "llama3"`) ||
		strings.Count(err.Error(), "no pool has") != 1 {
		t.Errorf("apiary infer --model llama3: %q, %v; want the unknown model said once, before any wait", out, err)
	}

	// A pinned pool that is not registered.
	for _, call := range fourAPIs {
		status, body := send(t.Context(), call, "tiny", map[string]string{"X-Apiary-Pool": "nope"})
		clean("pinned pool", call, status, body)
		if status != http.StatusNotFound {
			t.Errorf("pinned to an unknown pool, %s: %d %s, want 404", call.name, status, body)
		}
	}

	// The hive listed extra.gguf; it is gone now: the hive refuses the
	// start naming its models directory, the client reads that its hive
	// does not have the model's file.
	if err := os.Remove(filepath.Join(c.dir, "models", "extra.gguf")); err != nil {
		t.Fatal(err)
	}
	for i, call := range fourAPIs {
		status, body := send(t.Context(), call, "extra", nil)
		clean("model file missing", call, status, body)
		if status != http.StatusServiceUnavailable || i == 0 && !strings.Contains(body, "does not have the model's file") {
			t.Errorf("model file missing, %s: %d %s, want 503 saying the hive does not have the model's file", call.name, status, body)
		}
	}
	c.queen.logs.wait(t, 0, "placement refused; placing again without the pool", map[string]string{"pool_id": "node-1"})

	// Clients that go away while they wait (for a worker of a model whose
	// placement backs off) are no error.
	for _, call := range fourAPIs {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		send(ctx, call, "extra", nil)
	}

	// The hive is frozen: the start is not answered (the queen's call
	// times out, naming the hive's address in its log).
	c.hive.Signal(syscall.SIGSTOP)
	for _, call := range fourAPIs {
		status, body := send(t.Context(), call, "tiny", nil)
		clean("hive not answering", call, status, body)
		if status < 400 {
			t.Errorf("hive frozen, %s: %d %s, want a refusal", call.name, status, body)
		}
	}
	c.hive.Signal(syscall.SIGCONT)
	if logs := c.queen.logs.String(); strings.Contains(logs, `"level":"ERROR"`) || strings.Contains(logs, "level=ERROR") {
		t.Errorf("the queen logged an ERROR:\n%s", logs)
	}
}
