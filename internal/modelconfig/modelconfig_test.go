package modelconfig

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/apiary-llm/apiary/internal/config"
)

const full = `
models:
  qwen:
    source: hf://Qwen/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M
    file: qwen2.5-0.5b-instruct-q4_k_m
    engine: builtin
    aliases: [gpt-4o-mini, "qwen2.5:0.5b"]
    ctx_size: 8192
    slots: 4
    threads: 8
    min_workers: 1
    max_workers: 3
    idle_timeout: 10m
    pools: [gpu-a, gpu-b]
    defaults:
      temperature: 0.2
      top_p: 0.9
      top_k: 40
      min_p: 0.05
      max_tokens: 512
      presence_penalty: 0.1
      frequency_penalty: 0.2
      seed: 7
      stop: ["</s>"]
  tiny:
`

func TestParseFullFile(t *testing.T) {
	f, err := Parse([]byte(full))
	if err != nil {
		t.Fatal(err)
	}
	name, m, ok := f.Resolve("gpt-4o-mini")
	if !ok || name != "qwen" || m.File != "qwen2.5-0.5b-instruct-q4_k_m" || *m.CtxSize != 8192 || *m.Slots != 4 || *m.Threads != 8 ||
		*m.MinWorkers != 1 || *m.MaxWorkers != 3 || m.IdleTimeout != 10*time.Minute || *m.Defaults.TopK != 40 || m.Engine != EngineBuiltin {
		t.Fatalf("Resolve(gpt-4o-mini) = %q %+v %v", name, m, ok)
	}
	if name, _, ok := f.Resolve("qwen2.5:0.5b"); !ok || name != "qwen" {
		t.Errorf("Resolve(qwen2.5:0.5b) = %q %v", name, ok)
	}
	if name, m, ok := f.Resolve("tiny"); !ok || name != "tiny" || m.File != "tiny" {
		t.Errorf("Resolve(tiny) = %q %+v %v: a model without file is served by the file of its name", name, m, ok)
	}
	if name, _, ok := f.ByFile("qwen2.5-0.5b-instruct-q4_k_m"); !ok || name != "qwen" {
		t.Errorf("ByFile = %q %v", name, ok)
	}
	if _, _, ok := f.Resolve("qwen2.5-0.5b-instruct-q4_k_m"); ok {
		t.Error("a file resolves as a name")
	}
	src, err := ParseSource(m.Source)
	if err != nil || src.Kind != SourceHF || src.Repo != "Qwen/Qwen2.5-0.5B-Instruct-GGUF" || src.Quant != "Q4_K_M" {
		t.Errorf("ParseSource = %+v, %v", src, err)
	}
	if _, _, ok := (*File)(nil).Resolve("qwen"); ok {
		t.Error("a nil file resolves")
	}
}

func TestParseSource(t *testing.T) {
	for _, c := range []struct {
		in   string
		want Source
		err  string
	}{
		{in: "hf://org/repo:Q4_K_M", want: Source{Kind: SourceHF, Repo: "org/repo", Quant: "Q4_K_M"}},
		{in: "hf://org/repo/sub/model-Q8_0.gguf", want: Source{Kind: SourceHF, Repo: "org/repo", File: "sub/model-Q8_0.gguf"}},
		{in: "hf.co/org/repo:Q8_0", want: Source{Kind: SourceHF, Repo: "org/repo", Quant: "Q8_0"}},
		{in: "hf.co/org/repo/m.gguf", want: Source{Kind: SourceHF, Repo: "org/repo", File: "m.gguf"}},
		{in: "https://example.com/m.gguf", want: Source{Kind: SourceURL, URL: "https://example.com/m.gguf"}},
		{in: "http://host:8000/m.gguf", want: Source{Kind: SourceURL, URL: "http://host:8000/m.gguf"}},
		{in: "hf://org/repo", err: "names no quantization"},
		{in: "hf://org/repo/readme.md", err: "not a .gguf"},
		{in: "hf://org", err: "not a Hugging Face source"},
		{in: "hf://org/../x.gguf", err: "not a Hugging Face source"},
		{in: "ftp://x/y.gguf", err: "not a source"},
		{in: "https://user:pw@host/m.gguf", err: "not a download URL"},
		{in: "https:///m.gguf", err: "not a download URL"},
	} {
		got, err := ParseSource(c.in)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("ParseSource(%q) = %v, want an error with %q", c.in, err, c.err)
			}
			continue
		}
		c.want.Raw = c.in
		if err != nil || got != c.want {
			t.Errorf("ParseSource(%q) = %+v, %v; want %+v", c.in, got, err, c.want)
		}
	}
}

// TestValidationNamesEveryProblemByPath: each bad file gets every one
// of its problems, each named by its path in the file.
func TestValidationNamesEveryProblemByPath(t *testing.T) {
	for _, c := range []struct {
		name string
		yaml string
		want []string // "path: part of the problem"
	}{
		{"unknown top key", "model:\n  a: {}\n", []string{"model: is not a known key (line 1); the keys are models, groups"}},
		{"unknown model key", "models:\n  a:\n    ctx_sise: 5\n    enigne: x\n", []string{
			"models.a.ctx_sise: is not a known key (line 3)", "models.a.enigne: is not a known key (line 4)"}},
		{"unknown defaults key", "models:\n  a:\n    defaults: {temp: 1}\n", []string{"models.a.defaults.temp: is not a known key"}},
		{"model twice", "models:\n  a: {}\n  a: {}\n", []string{"models.a: is given twice (lines 2 and 3)"}},
		{"key twice", "models:\n  a:\n    slots: 1\n    slots: 2\n", []string{"models.a.slots: is given twice (lines 3 and 4)"}},
		{"wrong types", "models:\n  a:\n    ctx_size: big\n    aliases: x\n    pools: {a: 1}\n", []string{
			"models.a.ctx_size: has the wrong type", "models.a.aliases: has the wrong type", "models.a.pools: has the wrong type"}},
		{"not a mapping", "models: [a]\n", []string{"models: must be a mapping of names (line 1)"}},
		{"model not a mapping", "models:\n  a: 3\n", []string{"models.a: must be a mapping of keys (line 2)"}},
		{"bounds", "models:\n  a:\n    ctx_size: 0\n    slots: -1\n    threads: 5000\n    min_workers: -1\n    idle_timeout: 10ms\n", []string{
			"models.a.ctx_size: must be from 1 to 2097152, got 0", "models.a.slots: must be from 1 to 1024, got -1",
			"models.a.threads: must be from 1 to 4096, got 5000", "models.a.min_workers: must be from 0 to 1000, got -1",
			"models.a.idle_timeout: must be at least 1s, got 10ms"}},
		{"max below min", "models:\n  a:\n    min_workers: 3\n    max_workers: 2\n", []string{"models.a.max_workers: must be from min_workers (3) to 1000, got 2"}},
		{"duration without unit", "models:\n  a:\n    idle_timeout: 30\n", []string{"models.a.idle_timeout: is 30 without a unit (line 3)"}},
		{"bad duration", "models:\n  a:\n    idle_timeout: soon\n", []string{"models.a.idle_timeout: has the wrong type"}},
		{"bad names", "models:\n  -x:\n    file: a/b\n    aliases: ['', 'ok', '..x']\n", []string{
			`models.-x: "-x" is not a model name`, `models.-x.file: "a/b" is not a model ref`,
			`models.-x.aliases[0]: "" is not a model name`, `models.-x.aliases[2]: "..x" is not a model name`}},
		{"aliases", "models:\n  a:\n    aliases: [x, a, x, b]\n  b:\n    aliases: [x]\n", []string{
			`models.a.aliases[1]: is "a", the model's own name`, `models.a.aliases[2]: is "x" again`,
			`models.a.aliases[3]: is "b", which is the name of models.b`, `models.b.aliases[0]: is "x", which is already an alias of models.a`}},
		{"files", "models:\n  a:\n    file: f\n  b:\n    file: f\n  f:\n    file: g\n", []string{
			`models.b.file: is "f", which is already the file of models.a`, "models.f: is the file of models.a"}},
		{"groups", "models:\n  a:\n    aliases: [x]\n  b: {}\ngroups:\n  g1:\n    models: [a, nosuch, a]\n  g2:\n    models: [x]\n  g3: {}\n  -g:\n    models: [b]\n", []string{
			`groups.g1.models[1]: is "nosuch", which is not a model of models`, `groups.g1.models[2]: is "a" again`,
			`groups.g2.models[0]: is "x", which is already in groups.g1`, "groups.g3.models: names no model",
			`groups.-g: "-g" is not a model name`}},
		{"group types", "models:\n  a: {}\ngroups:\n  g:\n    models: a\n    exclusive: maybe\n", []string{
			"groups.g.models: has the wrong type", "groups.g.exclusive: has the wrong type"}},
		{"pin", "models:\n  a:\n    pin: yes please\n", []string{"models.a.pin: has the wrong type"}},
		{"source and engine", "models:\n  a:\n    source: s3://x/y\n    engine: v/llm\n", []string{
			`models.a.source: "s3://x/y" is not a source`, `models.a.engine: engine "v/llm" is not valid`}},
		{"pools", "models:\n  a:\n    pools: [p, 'bad pool', p]\n", []string{
			`models.a.pools[1]: "bad pool" is not a pool id`, `models.a.pools[2]: is "p" again`}},
		{"defaults out of range", "models:\n  a:\n    defaults: {temperature: 3}\n  b:\n    defaults: {max_tokens: 0}\n", []string{
			"models.a.defaults: temperature", "models.b.defaults: max_tokens"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse([]byte(c.yaml))
			if err == nil {
				t.Fatal("parsed")
			}
			fields := config.Fields(err)
			if len(fields) != len(c.want) {
				t.Errorf("%d problems, want %d:\n%v", len(fields), len(c.want), err)
			}
			for _, w := range c.want {
				path, problem, _ := strings.Cut(w, ": ")
				found := false
				for _, fe := range fields {
					if fe.Field == path && strings.Contains(fe.Problem, problem) {
						found = true
					}
				}
				if !found {
					t.Errorf("no problem %q in:\n%v", w, err)
				}
			}
		})
	}
}

func TestYAMLSyntaxErrorAndEmptyFile(t *testing.T) {
	if _, err := Parse([]byte("models:\n  a: [\n")); err == nil || !strings.Contains(err.Error(), "line") {
		t.Errorf("syntax error: %v", err)
	}
	for _, empty := range []string{"", "models:\n", "# nothing\n"} {
		f, err := Parse([]byte(empty))
		if err != nil || len(f.Names()) != 0 {
			t.Errorf("Parse(%q) = %v, %v", empty, f.Names(), err)
		}
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "models.yaml")
	if err := os.WriteFile(path, []byte(full), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := Load(path)
	if err != nil || len(f.Names()) != 2 {
		t.Fatalf("Load = %v, %v", f, err)
	}
	if _, err := Load(filepath.Join(dir, "missing.yaml")); err == nil {
		t.Error("a missing file loaded")
	}
	if err := os.WriteFile(path, make([]byte, MaxFileBytes+1), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(path); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("a huge file: %v", err)
	}
}

func TestDiff(t *testing.T) {
	old, err := Parse([]byte("models:\n  a: {ctx_size: 1}\n  b: {}\n  c: {aliases: [x]}\n"))
	if err != nil {
		t.Fatal(err)
	}
	next, err := Parse([]byte("models:\n  a: {ctx_size: 2, slots: 2}\n  c: {aliases: [x]}\n  d: {}\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"removed models.b", "changed models.a: ctx_size, slots", "added models.d"}
	if d := cmp.Diff(want, next.Diff(old)); d != "" {
		t.Errorf("Diff (-want +got):\n%s", d)
	}
	if d := next.Diff(next); len(d) != 0 {
		t.Errorf("Diff of itself = %v", d)
	}
}

// TestApart: models of one group share a device, as do models in no
// group; two groups never do, and an exclusive group shares with nothing
// outside it.
func TestApart(t *testing.T) {
	f, err := Parse([]byte("models:\n  a: {pin: true}\n  b: {aliases: [bee]}\n  c: {}\n  d: {}\n  e: {}\n" +
		"groups:\n  small:\n    models: [a, bee]\n  big:\n    models: [c]\n    exclusive: true\n  other:\n    models: [d]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if _, m, _ := f.Resolve("a"); !m.Pin {
		t.Error("pin: true was not kept")
	}
	for _, c := range []struct {
		a, b string
		want string // part of why; "" they may share
	}{
		{"a", "b", ""}, {"a", "e", ""}, {"e", "e", ""},
		{"a", "d", "models of two groups"}, {"c", "a", "models of two groups"},
		{"c", "e", "group big, which is exclusive"}, {"e", "c", "group big, which is exclusive"},
		{"d", "e", ""},
	} {
		got := f.Apart(c.a, c.b)
		if c.want == "" && got != "" || c.want != "" && !strings.Contains(got, c.want) {
			t.Errorf("Apart(%s, %s) = %q, want %q", c.a, c.b, got, c.want)
		}
	}
	if got := (*File)(nil).Apart("a", "b"); got != "" {
		t.Errorf("a nil file keeps models apart: %q", got)
	}
}
