//go:build !race

package queen

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
	oai "github.com/openai/openai-go"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/testbin"
	"github.com/apiary-llm/apiary/internal/testmodel"
)

// One name for each model (issue #41): with a config that names tiny.gguf
// "bees" (alias "swarm") and b.gguf "wasps", every command, listing, audit
// entry, error and the dashboard (its JSON and the page in headless
// Chromium) says bees and wasps, the file beside the name at most; an
// evicted worker's row says why it stopped ("evicted for wasps"); the
// dashboard's worker page shows a running worker's last heartbeat and the
// pool card's beat agrees with `pools ls`.
func TestProcessOneNameEverywhere(t *testing.T) {
	config := filepath.Join(t.TempDir(), "apiary.yaml")
	if err := os.WriteFile(config, []byte("models:\n  bees: {file: tiny, aliases: [swarm]}\n  wasps: {file: b}\n  moths: {file: nofile}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// One worker at a time on the hive: wasps evicts bees.
	c := startClusterWith(t, clusterOptions{more: map[string]testmodel.Options{"b": {Seed: 2}}}, []string{"--config", config}, "--max-loaded", "1")
	cli := func(args ...string) (code int, stdout, stderr string) {
		t.Helper()
		if args[0] != "models" || args[1] == "scale" || args[len(args)-1] == "--all" {
			args = append(args, "--queen", c.url) // the commands that ask the queen
		}
		p := testbin.Start(t, "apiary "+strings.Join(args, " "), nil, args...)
		code = p.Wait(t)
		return code, p.Stdout(), p.Lines.String()
	}
	must := func(args ...string) string {
		t.Helper()
		code, out, errOut := cli(args...)
		if code != 0 {
			t.Fatalf("apiary %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, out, errOut)
		}
		return out + errOut
	}
	// noBareFile fails when out names file other than beside its name,
	// "NAME (FILE)".
	noBareFile := func(what, out, name, file string) {
		t.Helper()
		if re := regexp.MustCompile(`\b` + regexp.QuoteMeta(file) + `\b`); re.MatchString(strings.ReplaceAll(out, name+" ("+file+")", name)) {
			t.Errorf("%s names the file %s where the config names it %s:\n%s", what, file, name, out)
		}
	}

	// workers start by an alias.
	out := must("workers", "start", "--model", "swarm", "--reason", "names test")
	id := strings.Fields(out)[0]
	if !api.IsLifecycleID(id) || !strings.Contains(out, "bees (tiny)") {
		t.Fatalf("workers start --model swarm: %q, want the lifecycle id and bees (tiny)", out)
	}
	c.queen.logs.wait(t, 0, "lifecycle row changed", map[string]string{"lifecycle_id": id, "to": "RUNNING"})
	for _, sel := range []string{"bees", "swarm", "tiny"} {
		if out := must("workers", "ls", "--model", sel); !strings.Contains(out, id) || !strings.Contains(out, "bees (tiny)") {
			t.Errorf("workers ls --model %s:\n%s", sel, out)
		}
	}
	ask := func(model string) {
		t.Helper()
		if _, err := c.client.Chat.Completions.New(t.Context(), oai.ChatCompletionNewParams{Model: model, MaxTokens: oai.Int(2), Temperature: oai.Float(0),
			Messages: []oai.ChatCompletionMessageParamUnion{oai.UserMessage("Say hello to the bees.")}}); err != nil {
			t.Fatalf("request for %s: %v", model, err)
		}
	}
	ask("swarm")
	ask("wasps") // evicts bees
	c.queen.logs.wait(t, 0, "lifecycle row changed", map[string]string{"lifecycle_id": id, "to": "STOPPED"})
	var wasps string
	for _, r := range c.rows() {
		if r.ModelRef == "b" && r.Status == "RUNNING" {
			wasps = r.ID
		}
		if r.ID == id && !strings.HasPrefix(r.Reason, "evicted for wasps") {
			t.Errorf("the evicted row's reason is %q, want evicted for wasps first", r.Reason)
		}
	}
	if wasps == "" {
		t.Fatalf("no RUNNING worker of wasps: %+v", c.rows())
	}

	// workers ls: both by name, the evicted one with why.
	out = must("workers", "ls")
	for _, want := range []string{"bees (tiny)", "wasps (b)", "evicted for wasps"} {
		if !strings.Contains(out, want) {
			t.Errorf("workers ls lacks %q:\n%s", want, out)
		}
	}
	noBareFile("workers ls", out, "bees", "tiny")
	noBareFile("workers ls", out, "wasps", "b")

	// pools ls: LOADED and LAST EVICTION.
	out = must("pools", "ls")
	for _, want := range []string{"wasps ", "bees for wasps "} {
		if !strings.Contains(out, want) {
			t.Errorf("pools ls lacks %q:\n%s", want, out)
		}
	}
	noBareFile("pools ls", out, "bees", "tiny")
	noBareFile("pools ls", out, "wasps", "b")
	var pools api.PoolList
	if err := json.Unmarshal([]byte(must("pools", "ls", "--json")), &pools); err != nil || len(pools.Pools) != 1 || len(pools.Pools[0].Evictions) == 0 {
		t.Fatalf("pools ls --json: %+v, %v", pools, err)
	}
	if e := pools.Pools[0].Evictions[0]; e.ModelName != "bees" || e.ForName != "wasps" || e.Model != "tiny" || e.For != "b" {
		t.Errorf("pools ls --json: eviction %+v, want bees (tiny) for wasps (b)", e)
	}

	// The audit entry of the eviction.
	out = must("audit", "--action", "worker.evicted")
	if !strings.Contains(out, "evicted for wasps") {
		t.Errorf("audit --action worker.evicted:\n%s", out)
	}
	noBareFile("audit", out, "wasps", "b")

	// models ls: through the queen (--all) and of a directory with the
	// config (--config).
	out = must("models", "ls", "--all")
	for _, want := range []string{"bees", "wasps"} {
		if !regexp.MustCompile(`node-1\s+` + want + `\s+`).MatchString(out) {
			t.Errorf("models ls --all does not name %s:\n%s", want, out)
		}
	}
	dir := t.TempDir()
	must("models", "testmodel", "--models-dir", dir, "tiny")
	code, out, errOut := cli("models", "ls", "--models-dir", dir, "--config", config)
	if code != 0 || !regexp.MustCompile(`(?m)^bees\s+tiny\s+llama\s.*swarm`).MatchString(out) || !regexp.MustCompile(`(?m)^wasps\s+b\s.*no b\.gguf in`).MatchString(out) {
		t.Errorf("models ls --config: exit %d\n%s%s", code, out, errOut)
	}

	// models scale by an alias.
	out = must("models", "scale", "swarm", "--min", "0", "--max", "2", "--reason", "names test")
	if !strings.Contains(out, "bees (tiny)") {
		t.Errorf("models scale swarm:\n%s", out)
	}

	// Errors name what the user gave.
	code, _, errOut = cli("workers", "start", "--model", "moths", "--reason", "names test")
	if code == 0 || !strings.Contains(errOut, "no pool has model moths (its file nofile.gguf)") || strings.Count(errOut, "nofile") != 1 {
		t.Errorf("workers start --model moths: exit %d, %q; want no pool has model moths, its file beside it", code, errOut)
	}

	// The dashboard's JSON.
	var snap map[string]json.RawMessage
	resp, err := http.Get(c.url + "/api/admin/ui/snapshot") // a queen without tokens: loopback only, no sign-in
	if err != nil {
		t.Fatal(err)
	}
	err = json.NewDecoder(resp.Body).Decode(&snap)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	var pool uiPool
	if err := json.Unmarshal(snap["pool/node-1"], &pool); err != nil {
		t.Fatal(err)
	}
	if len(pool.Loaded) != 1 || pool.Loaded[0].Model != "wasps" || len(pool.Evictions) == 0 ||
		pool.Evictions[0].ModelName != "bees" || pool.Evictions[0].ForName != "wasps" {
		t.Errorf("the dashboard's pool: loaded %+v, evictions %+v", pool.Loaded, pool.Evictions)
	}
	for _, w := range []struct{ id, name string }{{id, "bees"}, {wasps, "wasps"}} {
		var row api.LifecycleRow
		if err := json.Unmarshal(snap["worker/"+w.id], &row); err != nil || row.ModelName != w.name {
			t.Errorf("the dashboard's worker %s: %+v (%v), want model_name %s", w.id, row, err, w.name)
		}
	}
	var stats struct {
		Models map[string]json.RawMessage `json:"models"`
	}
	if err := json.Unmarshal(snap["stats"], &stats); err != nil {
		t.Fatal(err)
	}
	for name := range stats.Models {
		if name == "tiny" || name == "b" {
			t.Errorf("the dashboard's rates are by the file %s: %v", name, keys(stats.Models))
		}
	}
	var beats uiBeats
	if err := json.Unmarshal(snap["beats"], &beats); err != nil || beats.Pools["node-1"].IsZero() {
		t.Errorf("the dashboard's beats: %s (%v)", snap["beats"], err)
	}

	// The page.
	b := newBrowser(t)
	b.run("open the dashboard", chromedp.Navigate(c.url+"/ui/"))
	b.waitText("what is loaded", `[data-pool="node-1"] [data-loaded]`, func(s string) bool { return strings.Contains(s, "wasps") })
	if got := b.text(`[data-pool="node-1"] [data-evictions]`); !strings.Contains(got, "bees for wasps") {
		t.Errorf("the pool card's evictions: %q", got)
	}
	b.wait("the models", `tr[data-model="bees"]`)
	row := b.waitText("the evicted row", fmt.Sprintf(`tr[data-worker=%q]`, id), func(s string) bool { return strings.Contains(s, "STOPPED") })
	if !strings.Contains(row, "bees (tiny)") || !strings.Contains(row, "evicted for wasps") {
		t.Errorf("the workers table's row of the evicted worker: %q", row)
	}
	// The pool card's beat and `pools ls`'s LAST BEAT: the hive beats
	// every 500 ms, so both are a second or two at most.
	beatRe := regexp.MustCompile(`beat (\d+)s ago`)
	card := b.waitText("the pool card's beat", `[data-pool="node-1"] [data-beat-kind]`, func(s string) bool { return beatRe.MatchString(s) })
	lastBeat := regexp.MustCompile(`\s(\d+)s ago\s`).FindStringSubmatch(must("pools", "ls"))
	cardAge, _ := strconv.Atoi(beatRe.FindStringSubmatch(card)[1])
	if lastBeat == nil || cardAge > 2 {
		t.Errorf("the pool card says %q, pools ls %v: want both within the hive's beat", card, lastBeat)
	}
	b.run("the running worker's page", chromedp.Navigate(c.url+"/ui/#/worker/"+wasps))
	b.wait("its row", fmt.Sprintf(`dl[data-worker=%q][data-status="RUNNING"]`, wasps))
	if got := b.waitText("its model", fmt.Sprintf(`dl[data-worker=%q]`, wasps), func(s string) bool { return strings.Contains(s, "wasps (b)") }); !regexp.MustCompile(`last heartbeat\s*\d+s ago`).MatchString(got) {
		t.Errorf("the running worker's page: %q, want its last heartbeat", got)
	}
	b.checkClean()

	// An operator's stop: the row says who stopped it, and why.
	must("workers", "stop", wasps, "--reason", "names test done")
	c.queen.logs.wait(t, 0, "lifecycle row changed", map[string]string{"lifecycle_id": wasps, "to": "STOPPED"})
	if out := must("workers", "ls", "--model", "wasps"); !strings.Contains(out, "stopped by admin: names test done") {
		t.Errorf("workers ls after workers stop:\n%s", out)
	}
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
