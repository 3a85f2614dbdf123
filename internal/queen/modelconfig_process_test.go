//go:build !race

package queen

import (
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	oai "github.com/openai/openai-go"
	"github.com/openai/openai-go/option"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/keeper"
	"github.com/apiary-llm/apiary/internal/openai"
)

// aliasesOf returns the queen's GET /v1/models as id → alias_of.
func aliasesOf(t *testing.T, url string) map[string]string {
	t.Helper()
	resp, err := http.Get(url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list openai.ModelList
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, m := range list.Data {
		out[m.ID] = m.AliasOf
	}
	return out
}

func configAudit(t *testing.T, c *keeper.Client, path string) []api.AuditEntry {
	t.Helper()
	var out []api.AuditEntry
	for _, action := range []string{"config.reloaded", "config.reload_failed"} {
		out = append(out, auditActions(t, c, "config:"+path, action)...)
	}
	return out
}

// TestProcessModelConfig runs a real queen with --config, a hive and
// llama.cpp workers on the test model: the file's min_workers brings a
// worker up with no request, a request naming the alias is served by it
// with the file's max_tokens default, and the file is reloaded when it
// changes (a bad one refused, the one in force kept) and on SIGHUP.
func TestProcessModelConfig(t *testing.T) {
	path := filepath.Join(t.TempDir(), "models.yaml")
	writeConfig(t, path, `
models:
  small:
    file: tiny
    aliases: [gpt-4o-mini]
    min_workers: 1
    pools: [node-1]
    ctx_size: 256
    defaults: {max_tokens: 3}
`)
	c := startCluster(t, []string{"--config", path, "--config-poll", "200ms"})

	rec, _ := c.queen.logs.wait(t, 0, "worker placed on demand", map[string]string{"model_ref": "tiny", "kind": "replica"})
	replica := rec.Attrs["lifecycle_id"]
	// From the start: the worker may call back ready before its placement is logged.
	c.queen.logs.wait(t, 0, "lifecycle row changed", map[string]string{"lifecycle_id": replica, "to": "RUNNING"})
	if n := c.queen.logs.Count("request queued", nil); n != 0 {
		t.Errorf("%d requests queued; the file's min_workers must bring the worker with none", n)
	}
	// A person sees the model by the name clients send, beside its file.
	if rows := c.rows(); len(rows) != 1 || rows[0].ModelName != "small" || rows[0].ModelRef != "tiny" {
		t.Errorf("rows: %+v, want the replica's model_name small, model_ref tiny", rows)
	}

	ask := func(model string) (*oai.Completion, string) {
		t.Helper()
		var resp *http.Response
		out, err := c.client.Completions.New(t.Context(), oai.CompletionNewParams{Model: oai.CompletionNewParamsModel(model),
			Prompt: oai.CompletionNewParamsPromptUnion{OfString: oai.String("Once upon a time")}, Temperature: oai.Float(0)},
			ignoreEOS, option.WithResponseInto(&resp))
		if err != nil {
			t.Fatalf("completion for %s: %v", model, err)
		}
		return out, resp.Header.Get(api.WorkerHeader)
	}
	out, by := ask("gpt-4o-mini")
	if by != replica || out.Usage.CompletionTokens != 3 {
		t.Errorf("gpt-4o-mini: %d tokens from %s; want 3 (the file's max_tokens) from the replica %s", out.Usage.CompletionTokens, by, replica)
	}
	// The answer names the model as the client did (clients match on it),
	// not the worker's file.
	if out.Model != "gpt-4o-mini" {
		t.Errorf("the answer to gpt-4o-mini names model %q", out.Model)
	}
	// A configured name has its file's time, in the list and on its own.
	var one struct{ Created int64 }
	getPlainJSON(t, c.url+"/v1/models/small", &one)
	var list struct {
		Data []struct {
			ID      string
			Created int64
		}
	}
	getPlainJSON(t, c.url+"/v1/models", &list)
	for _, m := range list.Data {
		if m.ID == "small" && (m.Created != one.Created || m.Created == 0) {
			t.Errorf("small: created %d in the list, %d on its own; want its file's time in both", m.Created, one.Created)
		}
	}
	if got := aliasesOf(t, c.url); got["gpt-4o-mini"] != "small" || !has(got, "small") {
		t.Errorf("/v1/models = %v", got)
	}

	// A good change: the new alias serves at once.
	writeConfig(t, path, "models:\n  small:\n    file: tiny\n    aliases: [gpt-4o-mini, chat]\n    min_workers: 1\n    defaults: {max_tokens: 2}\n")
	rec, next := c.queen.logs.wait(t, 0, "model config reloaded", map[string]string{"trigger": "file changed"})
	if !strings.Contains(rec.Attrs["changes"], "changed models.small: aliases, ctx_size, pools, defaults") {
		t.Errorf("reload changes = %q", rec.Attrs["changes"])
	}
	if out, by := ask("chat"); by != replica || out.Usage.CompletionTokens != 2 {
		t.Errorf("chat: %d tokens from %s; want 2 from %s", out.Usage.CompletionTokens, by, replica)
	}

	// A bad change, then SIGHUP: refused twice, the config in force stays.
	writeConfig(t, path, "models:\n  small:\n    file: tiny\n    aliases: [chat]\n    ctx_size: 0\n  other:\n    aliases: [chat]\n")
	rec, next = c.queen.logs.wait(t, next, "model config refused; the one in force stays", map[string]string{"trigger": "file changed"})
	for _, w := range []string{"models.small.ctx_size must be from 1", `models.small.aliases[0] is "chat", which is already an alias of models.other`} {
		if !strings.Contains(rec.Attrs["err"], w) {
			t.Errorf("refusal %q lacks %q", rec.Attrs["err"], w)
		}
	}
	c.queen.Signal(syscall.SIGHUP)
	c.queen.logs.wait(t, next, "model config refused; the one in force stays", map[string]string{"trigger": "SIGHUP"})
	if out, by := ask("chat"); by != replica || out.Usage.CompletionTokens != 2 {
		t.Errorf("chat with a bad file: %d tokens from %s", out.Usage.CompletionTokens, by)
	}
	var actions []string
	for _, e := range configAudit(t, c.admin, path) {
		actions = append(actions, fmt.Sprintf("%s %v", e.Action, e.Metadata["trigger"]))
	}
	slices.Sort(actions)
	if want := []string{"config.reload_failed SIGHUP", "config.reload_failed file changed", "config.reloaded file changed"}; !slices.Equal(actions, want) {
		t.Errorf("config audit = %q, want %q", actions, want)
	}
}

// TestProcessModelConfigSIGHUP: a queen that looks at its file only
// hourly takes a change on SIGHUP, audited with what changed, and keeps
// it when a bad file follows.
func TestProcessModelConfigSIGHUP(t *testing.T) {
	path := filepath.Join(t.TempDir(), "models.yaml")
	writeConfig(t, path, "models:\n  small:\n    file: tiny\n    aliases: [one]\n")
	q, url := startQueenProc(t, t.TempDir(), "", "--config", path, "--config-poll", "1h")
	t.Cleanup(func() {
		if err := q.stop(t, syscall.SIGTERM); err != nil {
			t.Errorf("queen exit: %v", err)
		}
	})
	writeConfig(t, path, "models:\n  small:\n    file: tiny\n    aliases: [two]\n  big: {}\n")
	q.Signal(syscall.SIGHUP)
	q.logs.wait(t, 0, "model config reloaded", map[string]string{"trigger": "SIGHUP"})
	if got := aliasesOf(t, url); got["two"] != "small" || has(got, "one") || !has(got, "big") {
		t.Errorf("/v1/models after SIGHUP = %v", got)
	}
	admin := keeper.NewClient(url, "", "")
	entries := configAudit(t, admin, path)
	if len(entries) != 1 || entries[0].Action != "config.reloaded" {
		t.Fatalf("config audit = %+v", entries)
	}
	changes, _ := json.Marshal(entries[0].Metadata["changes"])
	if string(changes) != `["added models.big","changed models.small: aliases"]` {
		t.Errorf("config.reloaded changes = %s", changes)
	}

	writeConfig(t, path, "models:\n  small:\n    file: ../x\n")
	q.Signal(syscall.SIGHUP)
	q.logs.wait(t, 0, "model config refused; the one in force stays", map[string]string{"trigger": "SIGHUP"})
	if got := aliasesOf(t, url); got["two"] != "small" {
		t.Errorf("/v1/models after a bad SIGHUP = %v", got)
	}
	if entries := auditActions(t, admin, "config:"+path, "config.reload_failed"); len(entries) != 1 || !strings.Contains(entries[0].Reason, `models.small.file "../x" is not a model ref`) {
		t.Errorf("config.reload_failed = %+v", entries)
	}
}

func has(m map[string]string, k string) bool { _, ok := m[k]; return ok }

func getPlainJSON(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatal(err)
	}
}
