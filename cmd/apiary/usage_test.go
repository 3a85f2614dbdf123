package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/apiary-llm/apiary/internal/api"
)

// Regression: an unknown command exited 1 while every other
// usage error exits 2.
func TestUnknownCommandExits2(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		says string
	}{
		{[]string{"bogus"}, 2, `unknown command "bogus" for "apiary"`},
		{[]string{"quen"}, 2, "did you mean queen?"},
		{[]string{"pools", "bogus"}, 2, `unknown command "bogus" for "apiary pools"`},
		{[]string{"workers", "ls", "--bogus"}, 2, "unknown flag: --bogus"},
		{nil, 0, ""},
	} {
		code, out, errOut := apiary(t, tc.args...)
		if code != tc.code || !strings.Contains(errOut, tc.says) {
			t.Errorf("apiary %v: exit %d, stderr %q; want %d and %q", tc.args, code, errOut, tc.code, tc.says)
		}
		if tc.args == nil && !strings.Contains(out, "Available Commands") {
			t.Errorf("apiary alone prints no help: %q", out)
		}
	}
}

// Regression: persistent `apiary infer --model /other/dir/small.gguf`
// silently served the pools' own, different, small. A path is refused
// with a usage error that names the ref and ephemeral mode.
func TestPersistentInferRefusesAModelPath(t *testing.T) {
	q := "--queen=" + startTestQueen(t)
	for _, model := range []string{"/other/dir/small.gguf", "./small.gguf", "small.gguf", "dir/small"} {
		code, out, errOut := apiary(t, "infer", q, "--model", model, "--prompt", "hi")
		if code != 2 || out != "" {
			t.Errorf("infer --model %s: exit %d, stdout %q; want 2 and nothing", model, code, out)
		}
		for _, s := range []string{"--model " + model + " is a path", "--model small", "pass --ephemeral", "ephemeral mode"} {
			if !strings.Contains(errOut, s) {
				t.Errorf("infer --model %s: stderr lacks %q: %s", model, s, errOut)
			}
		}
	}
}

// Regression ("a CPU shows as GPU 0"): a row on the CPU of a
// CPU-only pool shows its device as cpu; a GPU row as gpu N.
func TestWorkersLsShowsTheCPUAsCPU(t *testing.T) {
	q := "--queen=" + startTestQueen(t) // pool p1: device 0 is the CPU
	apiary(t, "workers", "start", "--model", "tiny", "--pool", "p1", "--gpu", "0", "--reason", "cpu row", q)
	code, out, errOut := apiary(t, "workers", "ls", q)
	if code != 0 {
		t.Fatalf("workers ls: exit %d %s", code, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], "DEVICE") || strings.Contains(lines[0], "GPU") ||
		!regexp.MustCompile(`\bp1\s+cpu\s`).MatchString(lines[1]) {
		t.Errorf("workers ls:\n%s", out)
	}
	_, out, _ = apiary(t, "workers", "ls", "--json", q)
	if !strings.Contains(out, `"device_kind": "cpu"`) {
		t.Errorf("workers ls --json lacks the device kind:\n%s", out)
	}
	zero := 0
	var b strings.Builder
	if err := printRows(&b, []api.LifecycleRow{
		{ID: "wk-1", GPUDevice: &zero, DeviceKind: api.DeviceCUDA},
		{ID: "wk-2", GPUDevice: &zero},
		{ID: "wk-3"},
		{ID: "wk-4", Status: "RUNNING", Strikes: &api.WorkerStrikes{Failures: 3, Limit: 3, Degraded: true}},
		{ID: "wk-5", Status: "RUNNING", Strikes: &api.WorkerStrikes{Failures: 4, Limit: 3}},
	}, time.Now()); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`wk-1 .*\s+gpu 0\s`, `wk-2 .*\s+0\s`, `wk-3 .*\s+-\s`, `wk-4\s+RUNNING \(degraded\)\s`, `wk-5\s+RUNNING\s`} {
		if !regexp.MustCompile(want).MatchString(b.String()) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
}

// A config the library refuses is reported by flag, every problem at
// once, as a usage error (exit 2): the libraries name fields, and
// cmd/apiary's tables map them.
func TestConfigProblemsNameTheFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"queen", "--queue-size", "-3", "--hive-timeout", "-1s", "--audit-retention", "5s", "--strike-limit", "-1", "--crashloop-window", "-1m"},
			[]string{"--queue-size must be at least 1, got -3", "--hive-timeout must be positive, got -1s", "--audit-retention 5s is shorter than",
				"--strike-limit must be at least 1, got -1", "--crashloop-window must be positive, got -1m0s"}},
		{[]string{"hive", "--lease-timeout", "1s", "--worker-ports", "9-3", "--queen", "http://127.0.0.1:1"},
			[]string{"--worker-ports 9-3 is not a range", "--lease-timeout 1s must be longer than --heartbeat-interval 10s"}},
		{[]string{"hive", "--cpu-memory", "24 gigs"}, []string{`--cpu-memory: "24 gigs" is not a size: want bytes, or a number with KiB`}},
		{[]string{"hive", "--cpu-memory", "0"}, []string{"--cpu-memory: 0 leaves the CPU no memory for a worker"}},
		{[]string{"hive", "--pull-stall-timeout", "-1s"}, []string{"--pull-stall-timeout must be positive, got -1s"}},
		{[]string{"hive", "--pull-stall-timeout", "0"}, []string{"--pull-stall-timeout must be positive, got 0s"}},
		{[]string{"models", "pull", "--stall-timeout", "0", "hf://org/repo:Q4_K_M"}, []string{"--stall-timeout must be positive, got 0s"}},
		{[]string{"models", "pull", "--stall-timeout", "5s", "--pool", "p1", "hf://org/repo:Q4_K_M"},
			[]string{"--stall-timeout does not go with --pool: the pool's hive has its own (apiary hive --pull-stall-timeout)"}},
		{[]string{"infer", "--model", "", "--prompt", "", "--max-tokens", "-1"},
			[]string{"--model is required", "--prompt is required", "--max-tokens must not be negative, got -1"}},
	} {
		code, _, out := apiary(t, tc.args...)
		if code != 2 {
			t.Errorf("apiary %v exited %d, want 2: %s", tc.args, code, out)
		}
		for _, w := range tc.want {
			if !strings.Contains(out, w) {
				t.Errorf("apiary %v: output lacks %q:\n%s", tc.args, w, out)
			}
		}
		for _, field := range []string{"QueueSize", "HiveTimeout", "LeaseTimeout", "PortMin", "MaxTokens"} {
			if strings.Contains(out, field) {
				t.Errorf("apiary %v names the field %s, not its flag:\n%s", tc.args, field, out)
			}
		}
	}
}

// TestQueenRefusesABadModelConfig: `apiary queen --config FILE` with a bad
// file exits 2 before it opens anything, naming every problem by its path
// in the file; --config-poll 0 is refused like any other zero.
func TestQueenRefusesABadModelConfig(t *testing.T) {
	path := filepath.Join(t.TempDir(), "models.yaml")
	if err := os.WriteFile(path, []byte("models:\n  a:\n    ctx_size: 0\n    aliases: [b]\n  b:\n    aliases: [b]\n    source: ftp://x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, out := apiary(t, "queen", "--data-dir", t.TempDir(), "--config", path)
	if code != 2 {
		t.Errorf("exit %d, want 2: %s", code, out)
	}
	for _, w := range []string{path, "models.a.ctx_size must be from 1", `models.a.aliases[0] is "b", which is the name of models.b`,
		`models.b.aliases[0] is "b", the model's own name`, `models.b.source "ftp://x" is not a source`} {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
	if code, _, out := apiary(t, "queen", "--data-dir", t.TempDir(), "--config", path, "--config-poll", "0s"); code != 2 || !strings.Contains(out, "--config-poll must be positive") {
		t.Errorf("--config-poll 0s: exit %d: %s", code, out)
	}
}

// workers ls shows the pulls under way (as GET /v2/pools carries them)
// above the rows, status PULLING with the percent: an operator who
// wonders why a request waits sees the pull of its model there.
// --status, --model and --pool select pulls too; --json prints the rows.
func TestWorkersLsShowsPullsUnderWay(t *testing.T) {
	started := time.Now().Add(-90 * time.Second)
	pools := api.PoolList{Pools: []api.Pool{
		{PoolID: "a", Pulls: []api.ModelPull{{ID: "pull-1", Ref: "hf://org/big-GGUF:Q4_K_M", Model: "big", State: api.PullRunning,
			WrittenBytes: 42 << 20, TotalBytes: 100 << 20, StartedAt: started}}},
		{PoolID: "b", Pulls: []api.ModelPull{{ID: "pull-2", Ref: "https://example.com/small.gguf", Model: "small", State: api.PullRunning,
			WrittenBytes: 3 << 20, TotalBytes: -1, StartedAt: started}}},
	}}
	row := api.LifecycleRow{ID: "wk-1", PoolID: "a", ModelRef: "tiny", Status: "RUNNING", CreatedAt: time.Now()}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/admin/workers", func(w http.ResponseWriter, r *http.Request) {
		api.WriteJSON(w, http.StatusOK, api.LifecycleRowList{Workers: []api.LifecycleRow{row}})
	})
	mux.HandleFunc("GET /v2/pools", func(w http.ResponseWriter, r *http.Request) { api.WriteJSON(w, http.StatusOK, pools) })
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	q := "--queen=" + srv.URL

	code, out, errOut := apiary(t, "workers", "ls", q)
	if code != 0 {
		t.Fatalf("workers ls: exit %d %s", code, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	want := []string{
		`^ID\s+STATUS\s+MODEL\s+POOL\s`,
		`^pull-1\s+PULLING\s+big\s+a\s+-\s+-\s+1m\s+-\s+42% of 100\.0 MiB from hf://org/big-GGUF:Q4_K_M$`,
		`^pull-2\s+PULLING\s+small\s+b\s+-\s+-\s+1m\s+-\s+3\.0 MiB from https://example\.com/small\.gguf$`,
		`^wk-1\s+RUNNING\s+tiny\s+a\s`,
	}
	if len(lines) != len(want) {
		t.Fatalf("workers ls:\n%s", out)
	}
	for i, re := range want {
		if !regexp.MustCompile(re).MatchString(lines[i]) {
			t.Errorf("line %d %q does not match %q", i, lines[i], re)
		}
	}
	for _, c := range []struct {
		args  []string
		pulls string
	}{
		{[]string{"--model", "big"}, "pull-1"},
		{[]string{"--pool", "b"}, "pull-2"},
		{[]string{"--status", "running,pulling"}, "pull-1 pull-2"},
		{[]string{"--status", "RUNNING"}, ""},
	} {
		_, out, _ := apiary(t, append([]string{"workers", "ls", q}, c.args...)...)
		var got []string
		for l := range strings.SplitSeq(out, "\n") {
			if strings.Contains(l, "PULLING") {
				got = append(got, strings.Fields(l)[0])
			}
		}
		if strings.Join(got, " ") != c.pulls {
			t.Errorf("workers ls %v shows pulls %v, want %q:\n%s", c.args, got, c.pulls, out)
		}
	}
	if _, out, _ := apiary(t, "workers", "ls", "--json", q); strings.Contains(out, "pull-1") || !strings.Contains(out, "wk-1") {
		t.Errorf("workers ls --json:\n%s", out)
	}
}

// TestHiveRefusesABadEnginesFile: `apiary hive --engines FILE` with an
// empty command and an unknown placeholder exits 2 before it serves,
// naming the file and each problem.
func TestHiveRefusesABadEnginesFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "engines.yaml")
	if err := os.WriteFile(path, []byte("engines:\n  a:\n    command: []\n  b:\n    command: [srv, '--port={prot}']\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, out := apiary(t, "hive", "--data-dir", t.TempDir(), "--queen", "", "--engines", path)
	if code != 2 {
		t.Errorf("exit %d, want 2: %s", code, out)
	}
	for _, w := range []string{path, "engines.a.command is empty", `engines.b.command[1] unknown placeholder "prot"`} {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
}

// Every command answers --help (exit 0, its usage on stdout) and refuses
// a wrong use — an unknown flag, and for a command that takes no argument
// an argument — with exit 2 and a message that names what was wrong, on
// stderr, without a package prefix (apiary checks every failure's message
// with errorStyleProblems). One exit-code rule: usage 2.
func TestEveryCommandHelpsAndRefusesAWrongUse(t *testing.T) {
	var walk func(c *cobra.Command)
	var paths [][]string
	walk = func(c *cobra.Command) {
		if c.Hidden || c.Name() == "help" || c.Name() == "completion" {
			return
		}
		path := strings.Fields(c.CommandPath())[1:]
		paths = append(paths, path)
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(newRootCmd(io.Discard, io.Discard))
	if len(paths) < 30 {
		t.Fatalf("only %d commands found", len(paths))
	}
	for _, p := range paths {
		code, out, errOut := apiary(t, append(slices.Clone(p), "--help")...)
		if code != 0 || !strings.Contains(out, "Usage:") {
			t.Errorf("apiary %s --help: exit %d, stdout %q, stderr %q", strings.Join(p, " "), code, out, errOut)
		}
		code, _, errOut = apiary(t, append(slices.Clone(p), "--no-such-flag")...)
		if code != 2 || !strings.Contains(errOut, "unknown flag: --no-such-flag") {
			t.Errorf("apiary %s --no-such-flag: exit %d, stderr %q; want 2 naming the flag", strings.Join(p, " "), code, errOut)
		}
	}
	for _, args := range [][]string{{"worker", "ls"}, {"workers", "stop", "foo", "--reason", "x"}, {"workers", "logs", "bad"},
		{"workers", "stop", "wk-123", "--reason", "x"}, {"workers", "logs", "wk-000000000000000G"},
		{"pools", "drain", "p1"}, {"audit", "--until", "soon"}} {
		code, _, errOut := apiary(t, args...)
		if code != 2 {
			t.Errorf("apiary %s: exit %d, stderr %q; want 2 (usage)", strings.Join(args, " "), code, errOut)
		}
	}
	if _, _, errOut := apiary(t, "worker", "ls"); !strings.Contains(errOut, "did you mean `apiary workers ls`") {
		t.Errorf("apiary worker ls: %q, want a pointer to apiary workers ls", errOut)
	}
}

// A malformed list of queens is a usage error (exit 2) naming the bad
// element, for every command that talks to a queen and in APIARY_QUEEN.
func TestMalformedQueenListExits2(t *testing.T) {
	const list = "http://127.0.0.1:1,,http://127.0.0.1:2"
	for _, args := range [][]string{
		{"workers", "ls", "--queen", list},
		{"pools", "drain", "p1", "--reason", "x", "--queen", list},
		{"jobs", "ls", "--queen", list},
		{"audit", "--queen", "http://127.0.0.1:1,ftp://x"},
		{"models", "pull", "hf://o/r:Q4", "--pool", "p1", "--queen", list},
		{"infer", "--model", "tiny", "--prompt", "hi", "--queen", list},
	} {
		code, _, errOut := apiary(t, args...)
		if code != 2 || !strings.Contains(errOut, "element 2") {
			t.Errorf("apiary %v: exit %d, stderr %q; want 2 and the bad element named", args, code, errOut)
		}
	}
	t.Setenv("APIARY_QUEEN", list)
	if code, _, errOut := apiary(t, "workers", "ls"); code != 2 || !strings.Contains(errOut, "element 2 is empty") {
		t.Errorf("APIARY_QUEEN=%s apiary workers ls: exit %d, stderr %q; want 2 and the bad element named", list, code, errOut)
	}
}

// `apiary queen --help` and `apiary hive --help` list their flags under
// headings (network and TLS, store, placement, routing, batches, logs …)
// instead of one alphabetical list: every flag under one heading, once,
// none left over but --help.
func TestDaemonHelpGroupsTheFlags(t *testing.T) {
	for _, tc := range []struct {
		cmd    *cobra.Command
		groups []flagGroup
	}{{newQueenCmd(), queenFlagGroups}, {newHiveCmd(), hiveFlagGroups}} {
		name := tc.cmd.Name()
		if left := ungrouped(tc.cmd, tc.groups); len(left) > 0 {
			t.Errorf("apiary %s: flags under no heading: %v", name, left)
		}
		code, out, errOut := apiary(t, name, "--help")
		if code != 0 {
			t.Fatalf("apiary %s --help: exit %d: %s", name, code, errOut)
		}
		at := 0
		for _, g := range tc.groups {
			i := strings.Index(out[at:], "\n"+g.title+":\n")
			if i < 0 {
				t.Errorf("apiary %s --help has no heading %q after byte %d:\n%s", name, g.title, at, out)
				continue
			}
			at += i + 1
		}
		tc.cmd.LocalNonPersistentFlags().VisitAll(func(f *pflag.Flag) {
			if f.Hidden {
				return
			}
			line := regexp.MustCompile(`(?m)^ +(-\w, )?--` + regexp.QuoteMeta(f.Name) + ` `)
			if n := len(line.FindAllString(out, -1)); n != 1 {
				t.Errorf("apiary %s --help lists --%s %d times, want once", name, f.Name, n)
			}
		})
		if strings.Contains(out, "\nFlags:\n") {
			t.Errorf("apiary %s --help still has one alphabetical Flags list", name)
		}
	}
}
