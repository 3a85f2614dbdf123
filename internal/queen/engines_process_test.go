//go:build !race

package queen

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	oai "github.com/openai/openai-go"
	"github.com/openai/openai-go/option"
	"gopkg.in/yaml.v3"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/hive"
	"github.com/apiary-llm/apiary/internal/procs"
	"github.com/apiary-llm/apiary/internal/testbin"
	"github.com/apiary-llm/apiary/internal/testmodel"
)

// docsEngines writes an engines file made of the example block of
// docs/engines.md, each engine's program replaced as progs says (the
// engines progs leaves out are dropped), and returns its path: the tests
// run the very configuration the doc shows.
func docsEngines(t testing.TB, progs map[string]string) string {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "engines.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)## Examples.*?```yaml\n(.*?)```").FindSubmatch(doc)
	if m == nil {
		t.Fatal("docs/engines.md has no yaml block under ## Examples")
	}
	dir := t.TempDir()
	orig := filepath.Join(dir, "docs-engines.yaml")
	if err := os.WriteFile(orig, m[1], 0o600); err != nil {
		t.Fatal(err)
	}
	engines, err := hive.LoadEngines(orig)
	if err != nil {
		t.Fatalf("the doc's example does not load: %v", err)
	}
	out := map[string]hive.Engine{}
	for name, prog := range progs {
		e, ok := engines[name]
		if !ok {
			t.Fatalf("the doc's example has no engine %q", name)
		}
		e.Command[0] = prog
		out[name] = e
	}
	b, err := yaml.Marshal(map[string]any{"engines": out})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "engines.yaml")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// enginePID is the engine its front (pid front) started: the other
// member of the front's process group.
func enginePID(t testing.TB, front int) int {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for {
		members, _ := procs.GroupMembers(front)
		for _, p := range members {
			if p != front {
				return p
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("front %d has no engine in its group (%v)", front, members)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// alive says whether pid is a living process.
func alive(pid int) bool {
	s, err := procs.ReadStat(pid)
	return err == nil && s.Alive()
}

// fakeAnswer is what the fake engine echoes beside its answer.
type fakeAnswer struct {
	ReceivedBody string `json:"received_body"`
	ReceivedAuth string `json:"received_authorization"`
}

// TestProcessEngineExamplesFromTheDocs runs a real queen and hive with
// the vllm engine of docs/engines.md's example, then with its generic
// one, each as the scripted fake engine: a chat through the queen with the official
// OpenAI client reaches each engine with the client's body unchanged but
// for the model (the model file's name) and without the worker's token;
// a stream arrives chunk by chunk; a SIGKILL of the engine makes its row
// FAILED naming the signal, and the next request is served by a new
// worker.
func TestProcessEngineExamplesFromTheDocs(t *testing.T) {
	for _, engine := range []string{"vllm", "generic"} {
		t.Run(engine, func(t *testing.T) { testDocsEngine(t, engine) })
	}
}

func testDocsEngine(t *testing.T, engine string) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "models.yaml")
	writeConfig(t, cfg, "models:\n  chat:\n    file: tiny\n    engine: "+engine+"\n")
	engines := docsEngines(t, map[string]string{engine: testbin.FakeEngine(t)})
	c := startCluster(t, []string{"--config", cfg}, "--engines", engines)
	ctx := t.Context()

	var raw []byte
	if _, err := c.client.Chat.Completions.New(ctx, oai.ChatCompletionNewParams{Model: "chat",
		Messages: []oai.ChatCompletionMessageParamUnion{oai.UserMessage("hi")}}, option.WithResponseBodyInto(&raw)); err != nil {
		t.Fatal(err)
	}
	var got fakeAnswer
	var answer oai.ChatCompletion
	if err := json.Unmarshal(raw, &got); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &answer); err != nil || len(answer.Choices) != 1 || answer.Choices[0].Message.Content != "fake engine answer" {
		t.Errorf("answer %s (%v)", raw, err)
	}
	var body, want any
	if err := json.Unmarshal([]byte(got.ReceivedBody), &body); err != nil {
		t.Fatalf("the engine received %q: %v", got.ReceivedBody, err)
	}
	_ = json.Unmarshal([]byte(`{"model":"tiny","messages":[{"role":"user","content":"hi"}]}`), &want)
	if d := cmp.Diff(want, body); d != "" {
		t.Errorf("the engine received %s (-want +got):\n%s", got.ReceivedBody, d)
	}
	if got.ReceivedAuth != "" {
		t.Errorf("the engine received a bearer: %q", got.ReceivedAuth)
	}

	s := c.client.Chat.Completions.NewStreaming(ctx, oai.ChatCompletionNewParams{Model: "chat",
		Messages: []oai.ChatCompletionMessageParamUnion{oai.UserMessage("hi")}})
	var text strings.Builder
	chunks := 0
	for s.Next() {
		for _, ch := range s.Current().Choices {
			text.WriteString(ch.Delta.Content)
		}
		chunks++
	}
	if err := s.Err(); err != nil || text.String() != "fake engine answer" || chunks != 3 {
		t.Errorf("stream: %d chunks %q, %v", chunks, text.String(), err)
	}

	placed, _ := c.queen.logs.wait(t, 0, "worker placed on demand", map[string]string{"model_ref": "tiny"})
	id := placed.Attrs["lifecycle_id"]
	c.queen.logs.wait(t, 0, "lifecycle row changed", map[string]string{"lifecycle_id": id, "to": "RUNNING"})
	spawned, n := c.hive.logs.wait(t, 0, "worker spawned", map[string]string{"engine": engine})
	front, err := strconv.Atoi(spawned.Attrs["pid"])
	if err != nil {
		t.Fatalf("spawn record without a pid: %v", spawned)
	}
	pid := enginePID(t, front)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	rec, _ := c.queen.logs.wait(t, 0, "lifecycle row changed", map[string]string{"lifecycle_id": id, "to": "FAILED"})
	if !strings.Contains(rec.Attrs["reason"], "killed by signal 9") {
		t.Errorf("FAILED reason = %q", rec.Attrs["reason"])
	}
	if alive(front) {
		t.Errorf("the front %d outlived its engine", front)
	}
	if _, err := c.client.Chat.Completions.New(ctx, oai.ChatCompletionNewParams{Model: "chat",
		Messages: []oai.ChatCompletionMessageParamUnion{oai.UserMessage("again")}}); err != nil {
		t.Fatalf("the request after the crash: %v", err)
	}
	c.hive.logs.wait(t, n, "worker spawned", map[string]string{"engine": engine}) // the replacement
}

// On a TLS cluster an engine's front serves HTTPS on the worker's port
// with the hive's certificate (plain HTTP gets nothing), calls back over
// HTTPS, and a chat through the queen reaches the engine.
func TestProcessEngineOverTLS(t *testing.T) {
	certs := testbin.MakeTLS(t, t.TempDir(), "127.0.0.1", "localhost")
	env := []string{"APIARY_CA_FILE=" + certs.CA}
	tlsArgs := []string{"--tls-cert", certs.Cert, "--tls-key", certs.Key}
	dir := t.TempDir()
	cfg := filepath.Join(dir, "models.yaml")
	writeConfig(t, cfg, "models:\n  chat:\n    file: tiny\n    engine: generic\n")
	engines := docsEngines(t, map[string]string{"generic": testbin.FakeEngine(t)})
	q := startProc(t, "queen", env, append([]string{"queen", "--addr", "127.0.0.1:0", "--data-dir", t.TempDir(), "--config", cfg}, tlsArgs...)...)
	rec, _ := q.logs.wait(t, 0, "queen serving", nil)
	qURL := "https://" + rec.Attrs["addr"]
	if err := os.MkdirAll(filepath.Join(dir, "models"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := testmodel.WriteFile(filepath.Join(dir, "models", "tiny.gguf"), testmodel.Options{}); err != nil {
		t.Fatal(err)
	}
	hive := startProc(t, "hive", env, append([]string{"hive", "--addr", "127.0.0.1:0", "--queen", qURL, "--pool-id", "node-1",
		"--data-dir", dir, "--heartbeat-interval", "500ms", "--worker-ports", "24000-24999", "--engines", engines}, tlsArgs...)...)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("queen logs:\n%s", q.logs.String())
			t.Logf("hive logs:\n%s", hive.logs.String())
		}
		_ = hive.stop(t, syscall.SIGTERM)
		_ = q.stop(t, syscall.SIGTERM)
	})
	q.logs.wait(t, 0, "pool status changed", map[string]string{"pool_id": "node-1", "to": "healthy"})
	client := oai.NewClient(option.WithBaseURL(qURL+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0),
		option.WithHTTPClient(tlsClient(t, certs)))
	resp, err := client.Chat.Completions.New(t.Context(), oai.ChatCompletionNewParams{Model: "chat",
		Messages: []oai.ChatCompletionMessageParamUnion{oai.UserMessage("hi")}})
	if err != nil || len(resp.Choices) != 1 || resp.Choices[0].Message.Content != "fake engine answer" {
		t.Fatalf("chat over https: %+v, %v", resp, err)
	}
	rows := getJSON[api.LifecycleRowList](t, nil, certs, qURL+"/api/admin/workers")
	if len(rows.Workers) != 1 || !strings.HasPrefix(rows.Workers[0].URI, "https://") {
		t.Fatalf("rows %+v, want one https worker", rows)
	}
	plain, err := http.Get("http://" + strings.TrimPrefix(rows.Workers[0].URI, "https://") + "/health")
	if err == nil {
		b, _ := io.ReadAll(plain.Body)
		plain.Body.Close()
		if plain.StatusCode == http.StatusOK || strings.Contains(string(b), `"status"`) {
			t.Errorf("plain HTTP to the front: %d %s", plain.StatusCode, b)
		}
	}
}
