package queen

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	oai "github.com/openai/openai-go"
	"github.com/openai/openai-go/option"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/openai"
)

// configWorker is a worker that answers every completion and keeps the
// bodies it was sent.
type configWorker struct {
	*httptest.Server
	mu     sync.Mutex
	bodies []map[string]any // guarded by mu
}

func newConfigWorker(t *testing.T) *configWorker {
	cw := &configWorker{}
	cw.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			openai.WriteJSON(w, http.StatusOK, api.WorkerHealth{Status: "ready", Model: "tiny"})
			return
		}
		var body map[string]any
		data, _ := io.ReadAll(r.Body)
		_ = json.Unmarshal(data, &body)
		cw.mu.Lock()
		cw.bodies = append(cw.bodies, body)
		cw.mu.Unlock()
		openai.WriteJSON(w, http.StatusOK, map[string]any{"object": "text_completion", "choices": []any{map[string]any{"text": "whole"}}})
	}))
	t.Cleanup(cw.Close)
	return cw
}

func (cw *configWorker) last() map[string]any {
	cw.mu.Lock()
	defer cw.mu.Unlock()
	if len(cw.bodies) == 0 {
		return nil
	}
	return cw.bodies[len(cw.bodies)-1]
}

// modelIDs returns GET /v1/models as id → alias_of.
func (x *tq) modelIDs() map[string]string {
	x.t.Helper()
	var list openai.ModelList
	x.ok("GET", "/v1/models", nil, http.StatusOK, &list)
	out := map[string]string{}
	for _, m := range list.Data {
		out[m.ID] = m.AliasOf
	}
	return out
}

func writeConfig(t testing.TB, path, yaml string) {
	t.Helper()
	// Through a temporary file and a rename, as editors and config
	// management write: the watcher never reads half a file.
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

const smallConfig = `
models:
  small:
    source: hf://org/tiny-GGUF:Q8_0
    file: tiny
    aliases: [gpt-4o-mini]
    ctx_size: 512
    slots: 2
    threads: 3
    idle_timeout: 90s
    min_workers: 1
    max_workers: 2
    pools: [b]
    defaults: {max_tokens: 7, temperature: 0.5}
`

// TestModelConfigInProcess: the model config's min_workers places a
// worker with no request, on the pool its pools allow, started with its
// worker options; its alias is listed and routed to its file with its
// sampling defaults; the admin endpoint refuses to scale it; a changed
// file takes effect and a bad one is refused, keeping the one in force.
func TestModelConfigInProcess(t *testing.T) {
	path := filepath.Join(t.TempDir(), "models.yaml")
	writeConfig(t, path, smallConfig)
	hives := map[string][]api.Model{"http://hive-a": {tinyModel}, "http://hive-b": {tinyModel}}
	x, mh := routeQueen(t, hives, func(c *Config) { c.ModelsFile, c.ModelsPoll = path, 20*time.Millisecond })
	x.registerAt("a", "http://hive-a")
	x.registerAt("b", "http://hive-b")

	var start api.StartWorkerRequest
	select {
	case start = <-mh.started:
	case <-time.After(waitLimit):
		t.Fatal("min_workers 1 of the file placed no worker")
	}
	rec, _ := x.logs.wait(t, 0, "worker placed on demand", map[string]string{"lifecycle_id": start.LifecycleID, "kind": "replica"})
	if rec.Attrs["pool_id"] != "b" || start.ModelRef != "tiny" {
		t.Errorf("placed %s on %s, want tiny on b (the model's pools)", start.ModelRef, rec.Attrs["pool_id"])
	}
	if want := (api.WorkerOptions{CtxSize: 512, Slots: 2, Threads: 3, IdleTimeoutMS: 90_000}); start.WorkerOptions != want {
		t.Errorf("start options %+v, want %+v", start.WorkerOptions, want)
	}
	cw := newConfigWorker(t)
	x.workerReady("b", start.LifecycleID, x.row(start.LifecycleID).WorkerID, cw.URL)

	// The alias goes to the file, with the defaults the request leaves out.
	resp := x.post(t.Context(), "/v1/completions", `{"model":"gpt-4o-mini","prompt":"hi","temperature":0}`)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get(api.WorkerHeader) != start.LifecycleID {
		t.Fatalf("request for the alias: %d from %q", resp.StatusCode, resp.Header.Get(api.WorkerHeader))
	}
	want := map[string]any{"model": "tiny", "prompt": "hi", "temperature": 0.0, "max_tokens": 7.0}
	if d := cmp.Diff(want, cw.last()); d != "" {
		t.Errorf("body the worker got (-want +got):\n%s", d)
	}
	// A batch request naming the alias goes the same way.
	client := oai.NewClient(option.WithBaseURL(x.url+"/v1/"), option.WithAPIKey("none"))
	f, err := upload(t, client, `{"custom_id":"a","method":"POST","url":"/v1/completions","body":{"model":"gpt-4o-mini","prompt":"batch"}}`+"\n")
	if err != nil {
		t.Fatal(err)
	}
	b, err := client.Batches.New(t.Context(), oai.BatchNewParams{InputFileID: f.ID, Endpoint: oai.BatchNewParamsEndpointV1Completions,
		CompletionWindow: oai.BatchNewParamsCompletionWindow24h})
	if err != nil {
		t.Fatal(err)
	}
	x.logs.wait(t, 0, "batch ended", map[string]string{"batch_id": b.ID})
	if b, err = client.Batches.Get(t.Context(), b.ID); err != nil || b.RequestCounts.Completed != 1 {
		t.Fatalf("the batch naming the alias: %+v %v", b, err)
	}
	want = map[string]any{"model": "tiny", "prompt": "batch", "max_tokens": 7.0, "temperature": 0.5}
	if d := cmp.Diff(want, cw.last()); d != "" {
		t.Errorf("body the worker got from the batch (-want +got):\n%s", d)
	}
	if d := cmp.Diff(map[string]string{"small": "", "gpt-4o-mini": "small", "tiny": ""}, x.modelIDs()); d != "" {
		t.Errorf("/v1/models (-want +got):\n%s", d)
	}
	var one openai.Model
	x.ok("GET", "/v1/models/gpt-4o-mini", nil, http.StatusOK, &one)
	if one.AliasOf != "small" {
		t.Errorf("GET /v1/models/gpt-4o-mini = %+v", one)
	}

	// The file's replicas: PUT refuses them, GET says where they come from.
	for _, name := range []string{"small", "gpt-4o-mini", "tiny"} {
		status, data := x.do("PUT", "/api/admin/models/"+name, "", `{"min_workers":3,"reason":"more"}`)
		if status != http.StatusConflict || !strings.Contains(string(data), "model_configured") || !strings.Contains(string(data), "models.small in "+path) {
			t.Errorf("PUT %s: %d %s, want 409 model_configured", name, status, data)
		}
	}
	got := x.models()
	if len(got) != 1 || got[0].Model != "tiny" || got[0].MinWorkers != 1 || *got[0].MaxWorkers != 2 || got[0].From != "config" || got[0].Running != 1 {
		t.Errorf("GET /api/admin/models = %+v", got)
	}

	// A changed file: the new alias, no replicas (the admin endpoint may
	// scale it again).
	writeConfig(t, path, "models:\n  small:\n    file: tiny\n    aliases: [chat]\n")
	x.logs.wait(t, 0, "model config reloaded", map[string]string{"trigger": "file changed"})
	if d := cmp.Diff(map[string]string{"small": "", "chat": "small", "tiny": ""}, x.modelIDs()); d != "" {
		t.Errorf("/v1/models after the reload (-want +got):\n%s", d)
	}
	x.scale("small", api.ModelScaleRequest{MinWorkers: intp(1), Reason: "now by hand"}, http.StatusOK)
	if got := x.models(); len(got) != 1 || got[0].From != "" || got[0].Reason != "now by hand" {
		t.Errorf("GET /api/admin/models after the reload = %+v", got)
	}

	// A bad file is refused with every problem; the one in force stays.
	writeConfig(t, path, "models:\n  small:\n    file: tiny\n    ctx_size: -1\n    aliases: [small]\n")
	rec, _ = x.logs.wait(t, 0, "model config refused; the one in force stays", map[string]string{"trigger": "file changed"})
	for _, w := range []string{"models.small.ctx_size must be from 1", `models.small.aliases[0] is "small", the model's own name`} {
		if !strings.Contains(rec.Attrs["err"], w) {
			t.Errorf("refusal %q lacks %q", rec.Attrs["err"], w)
		}
	}
	if _, ok := x.modelIDs()["chat"]; !ok {
		t.Error("the alias of the config in force went away with a bad file")
	}
	// SIGHUP's path (Reload) reads it again, refused again.
	if err := x.q.Reload(t.Context()); err == nil || !strings.Contains(err.Error(), "models.small.ctx_size") {
		t.Errorf("Reload of the bad file: %v", err)
	}
	acts := x.audit("config:" + path)
	if d := cmp.Diff([]string{"config.reloaded", "config.reload_failed", "config.reload_failed"}, acts); d != "" {
		t.Errorf("audit of the config, oldest first (-want +got):\n%s", d)
	}
	// The file back as it was: nothing changes, nothing is audited.
	writeConfig(t, path, "models:\n  small:\n    file: tiny\n    aliases: [chat]\n")
	if err := x.q.Reload(t.Context()); err != nil {
		t.Errorf("Reload of the file in force: %v", err)
	}
	if got := x.audit("config:" + path); len(got) != 3 {
		t.Errorf("audit after a reload that changed nothing: %v", got)
	}
}

// TestModelConfigRefusedAtStart: New refuses a bad file with every
// problem, by its path in the file.
func TestModelConfigRefusedAtStart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "models.yaml")
	writeConfig(t, path, "models:\n  a:\n    slots: 0\n    aliases: [b]\n    bogus: 1\n  b:\n    min_workers: 5\n    max_workers: 1\n")
	_, err := New(Config{DataDir: t.TempDir(), ModelsFile: path})
	if err == nil {
		t.Fatal("New took a bad model config")
	}
	// Decoding problems come first: an unknown key is reported with the
	// others of its kind.
	if !strings.Contains(err.Error(), "models.a.bogus is not a known key (line 5)") || !strings.Contains(err.Error(), path) {
		t.Errorf("New: %v", err)
	}
	writeConfig(t, path, "models:\n  a:\n    slots: 0\n    aliases: [b]\n  b:\n    min_workers: 5\n    max_workers: 1\n")
	_, err = New(Config{DataDir: t.TempDir(), ModelsFile: path})
	var lines []string
	if err != nil {
		lines = strings.Split(err.Error(), "\n")
	}
	want := []string{"models.a.aliases[0] is \"b\", which is the name of models.b", "models.a.slots must be from 1 to 1024, got 0",
		"models.b.max_workers must be from min_workers (5) to 1000, got 1"}
	for _, w := range want {
		if !slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, w) }) {
			t.Errorf("New: no line %q in:\n%v", w, err)
		}
	}
	if _, err := New(Config{DataDir: t.TempDir(), ModelsFile: filepath.Join(t.TempDir(), "none.yaml")}); err == nil {
		t.Error("New took a missing model config")
	}
}
