package queen

import (
	"os"
	"path/filepath"
	"regexp"
	"syscall"
	"testing"

	"github.com/apiary-llm/apiary/internal/hive"
	"github.com/apiary-llm/apiary/internal/testmodel"
	"gopkg.in/yaml.v3"
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

// startEngineCluster runs a queen with the model config models and a hive
// of pool node-1 with the engines file engines and a test model of each
// name in files; the queen is stopped at the end, the hive is the test's
// to stop (or kill).
func startEngineCluster(t testing.TB, engines, models string, files ...string) (q, hive *proc, qURL string) {
	t.Helper()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "models.yaml")
	writeConfig(t, cfg, models)
	q, qURL = startQueenProc(t, t.TempDir(), "", "--config", cfg)
	hdir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(hdir, "models"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range files {
		if err := testmodel.WriteFile(filepath.Join(hdir, "models", name+".gguf"), testmodel.Options{}); err != nil {
			t.Fatal(err)
		}
	}
	hive = startProc(t, "hive node-1", nil, "hive", "--addr", "127.0.0.1:0", "--queen", qURL, "--pool-id", "node-1",
		"--data-dir", hdir, "--heartbeat-interval", "500ms", "--health-interval", "200ms", "--worker-ports", "24000-24999",
		"--worker-threads", "1", "--worker-ctx-size", "2048", "--engines", engines)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("queen logs:\n%s", q.logs.String())
			t.Logf("hive logs:\n%s", hive.logs.String())
		}
		if err := q.stop(t, syscall.SIGTERM); err != nil {
			t.Errorf("queen exit: %v", err)
		}
	})
	q.logs.wait(t, 0, "pool status changed", map[string]string{"pool_id": "node-1", "to": "healthy"})
	return q, hive, qURL
}
