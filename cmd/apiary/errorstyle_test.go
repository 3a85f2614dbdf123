package main

import (
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// The CLI's error style (issue #34): an error a person sees says what was
// wrong and what to do, in words, with no Go package name in front of it
// ("store: …", "hive: …", "strconv.ParseInt: …") and no Go formatting
// ("[A B]" slices, "!!str", "%!d(string=…)"). apiary (the helper every
// test of this package runs the CLI with) checks each failure's message
// with errorStyleProblems, so no command's error can bring a prefix back
// unnoticed.

// goPackageNames are the names that must not start an error or a part of
// it: every package under internal/ (read from the tree, so a new package
// is covered the day it is added) and the standard and third-party
// packages whose errors start with their name.
var goPackageNames = sync.OnceValues(func() ([]string, error) {
	entries, err := os.ReadDir(filepath.Join("..", "..", "internal"))
	if err != nil {
		return nil, err
	}
	names := []string{"yaml", "json", "strconv", "strconv.ParseInt", "strconv.ParseBool", "strconv.ParseFloat", "time", "pgx", "pgconn", "modernc"}
	for _, e := range entries {
		if e.IsDir() && e.Name() != "testdata" {
			names = append(names, e.Name())
		}
	}
	return names, nil
})

var (
	// goLeaks are Go's formatting showing through: a slice printed with
	// %v ("[APIARY_API_TOKEN APIARY_ADMIN_TOKEN]"), a YAML tag, a bad verb.
	goLeaks = regexp.MustCompile(`\[[A-Z][A-Z0-9_]+( [A-Z][A-Z0-9_]+)+\]|!!(str|int|map|seq|bool|float|null)\b|%!`)
)

// errorStyleProblems lists what is wrong with the error that apiary
// printed last on stderr: from its last line that starts with "apiary: "
// to the end (an error may have several lines; log lines of an
// in-process daemon come before it).
func errorStyleProblems(stderr string) []string {
	i := strings.LastIndex("\n"+stderr, "\napiary: ")
	if i < 0 {
		return nil
	}
	msg := stderr[i:]
	names, err := goPackageNames()
	if err != nil {
		return []string{"cannot list the internal packages: " + err.Error()}
	}
	quoted := make([]string, len(names))
	for i, n := range names {
		quoted[i] = regexp.QuoteMeta(n)
	}
	prefix := regexp.MustCompile(`(?m)(^|apiary: |: )(` + strings.Join(quoted, "|") + `): `)
	var problems []string
	for _, m := range prefix.FindAllStringSubmatch(msg, -1) {
		problems = append(problems, "the Go package prefix "+m[2]+":")
	}
	for _, m := range goLeaks.FindAllString(msg, -1) {
		problems = append(problems, "Go formatting "+m)
	}
	return problems
}

// TestErrorStyleCatchesPrefixes: the check itself finds what it must and
// passes a clean message, so that the tests that rely on it prove
// something.
func TestErrorStyleCatchesPrefixes(t *testing.T) {
	for _, bad := range []string{
		"apiary: store: create data dir: mkdir /x: not a directory\n",
		"apiary: --engines: hive: engines file: open /nope: no such file or directory\n",
		"apiary: the model config is not valid:\nmodelconfig: yaml: line 1: did not find expected node content\n",
		"apiary: invalid argument \"x\" for \"--n\" flag: strconv.ParseInt: parsing \"x\": invalid syntax\n",
		"apiary: set [APIARY_ADMIN_TOKEN APIARY_API_TOKEN] to serve on it\n",
		"apiary: got %!d(string=x)\n",
		"time=… level=INFO msg=x\napiary: queen: listen on 127.0.0.1:8080: bind: address already in use\n",
	} {
		if len(errorStyleProblems(bad)) == 0 {
			t.Errorf("errorStyleProblems finds nothing in %q", bad)
		}
	}
	for _, good := range []string{
		"apiary: listen on 127.0.0.1:8080: bind: address already in use: another process listens there; stop it, or choose another --addr\n",
		"apiary: pools rm: --reason is required\n",
		"apiary: infer: --model x: no such file\n",
		"level=INFO msg=x component=store\napiary: worker_not_found: no such lifecycle row\n",
	} {
		if p := errorStyleProblems(good); len(p) != 0 {
			t.Errorf("errorStyleProblems(%q) = %q, want nothing", good, p)
		}
	}
}

// Regression (issue #34 item 6): a daemon that could not start said
// "apiary: queen: listen on …" or "apiary: store: create data dir: …",
// naming a Go package and not what to do. Each representative start-up
// failure names what was wrong and the flag that changes it, without a
// prefix (checked by apiary for every failure), and exits 1 for a failure
// of the machine, 2 for a wrong command line.
func TestDaemonStartFailuresSayWhatToDo(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	busy := ln.Addr().String()
	dir := t.TempDir()
	file := filepath.Join(dir, "a-file")
	badYAML := filepath.Join(dir, "bad.yaml")
	for p, body := range map[string]string{file: "x", badYAML: "models: [\n"} {
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		args []string
		code int
		says []string
	}{
		{[]string{"queen", "--addr", busy, "--data-dir", t.TempDir()}, 1,
			[]string{"listen on " + busy, "address already in use", "choose another --addr"}},
		{[]string{"hive", "--addr", busy, "--data-dir", t.TempDir(), "--queen", ""}, 1,
			[]string{"listen on " + busy, "address already in use", "choose another --addr"}},
		{[]string{"queen", "--data-dir", filepath.Join(file, "sub")}, 1,
			[]string{"cannot use the data directory " + file, "not a directory", "give --data-dir a directory this user can create and write"}},
		{[]string{"hive", "--data-dir", filepath.Join(file, "sub"), "--queen", ""}, 1,
			[]string{"cannot use the data directory " + file, "not a directory", "give --data-dir a directory"}},
		{[]string{"queen", "--data-dir", t.TempDir(), "--database-url", "postgres://nobody@127.0.0.1:1/apiary"}, 1,
			[]string{"cannot connect to PostgreSQL at 127.0.0.1:1 (user nobody, database apiary): connection refused", "check that the server runs"}},
		{[]string{"queen", "--data-dir", t.TempDir(), "--database-url", "mysql://x"}, 2, []string{"--database-url must be a postgres://"}},
		{[]string{"queen", "--data-dir", t.TempDir(), "--config", filepath.Join(dir, "none.yaml")}, 2,
			[]string{"the model config", "none.yaml: no such file or directory"}},
		{[]string{"queen", "--data-dir", t.TempDir(), "--config", badYAML}, 2,
			[]string{"the model config " + badYAML + " is not valid", "line 1: did not find expected node content"}},
		{[]string{"hive", "--data-dir", t.TempDir(), "--queen", "", "--engines", badYAML}, 2,
			[]string{"engines file " + badYAML, "line 1: did not find expected node content"}},
		{[]string{"queen", "--data-dir", t.TempDir(), "--addr", "0.0.0.0:0"}, 2,
			[]string{`--addr "0.0.0.0:0" is not a loopback address: set APIARY_ADMIN_TOKEN, APIARY_API_TOKEN, APIARY_CLUSTER_TOKEN to serve on it`}},
		{[]string{"hive", "--data-dir", t.TempDir(), "--queen", "queen-host:8080"}, 2, []string{`--queen "queen-host:8080"`}},
		{[]string{"hive", "--data-dir", t.TempDir(), "--queen", "ftp://queen"}, 2, []string{`--queen "ftp://queen": scheme must be http or https`}},
		{[]string{"queen", "--heartbeat-timeout", "30"}, 2, []string{`--heartbeat-timeout "30" is not a duration (Go syntax: 500ms, 2s, 5m, 1h30m)`}},
		{[]string{"worker", "--worker-id", "w", "--model", filepath.Join(dir, "none.gguf"), "--port", "0"}, 1,
			[]string{"none.gguf does not exist"}},
		{[]string{"models", "pull", "ftp://x/m.gguf"}, 2, []string{"ftp://x/m.gguf", "only http and https URLs"}},
	} {
		code, _, errOut := apiary(t, tc.args...)
		if code != tc.code {
			t.Errorf("apiary %s: exit %d, want %d:\n%s", strings.Join(tc.args, " "), code, tc.code, errOut)
		}
		for _, s := range tc.says {
			if !strings.Contains(errOut, s) {
				t.Errorf("apiary %s: stderr lacks %q:\n%s", strings.Join(tc.args, " "), s, errOut)
			}
		}
	}
}

// Every flag that takes a number, a duration or a boolean refuses a word
// as what it takes, naming the flag: pflag's own message named the Go
// function that refused it ("strconv.ParseInt: parsing …").
func TestEveryTypedFlagRefusesAWordInWords(t *testing.T) {
	var walk func(c *cobra.Command)
	n := 0
	walk = func(c *cobra.Command) {
		if c.Hidden || c.Name() == "help" || c.Name() == "completion" {
			return
		}
		path := strings.Fields(c.CommandPath())[1:]
		c.LocalFlags().VisitAll(func(f *pflag.Flag) {
			want, ok := flagKinds[f.Value.Type()]
			if !ok {
				return
			}
			n++
			code, _, errOut := apiary(t, append(slices.Clone(path), "--"+f.Name+"=x")...)
			if says := `--` + f.Name + ` "x" is not ` + want; code != 2 || !strings.Contains(errOut, says) {
				t.Errorf("apiary %s --%s=x: exit %d, stderr %q; want 2 and %q", strings.Join(path, " "), f.Name, code, errOut, says)
			}
		})
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(newRootCmd(nil, nil))
	if n < 50 {
		t.Errorf("only %d typed flags found", n)
	}
}
