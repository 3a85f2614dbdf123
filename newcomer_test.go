// The first hour of a newcomer (issue #34), tested as the newcomer meets
// it: what `make demo` installs and runs, and every block of README.md,
// run as written.
package apiary_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"go.uber.org/goleak"

	"github.com/apiary-llm/apiary/internal/testbin"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		testbin.Cleanup()
		os.Exit(code)
	}))
}

// words is an answer of the test model that `apiary models testmodel`
// writes by default: its words (each after a space), "," and ".", and
// nothing else; empty when its first token ends the text.
var words = regexp.MustCompile(`^(?: [a-z]{2,}|[,.])*$`)

// checkWords fails t unless answer (one line, its newline cut) is words.
func checkWords(t *testing.T, what, answer string) {
	t.Helper()
	switch {
	case !utf8.ValidString(answer):
		t.Errorf("%s: the answer %q is not UTF-8", what, answer)
	case strings.ContainsRune(answer, utf8.RuneError):
		t.Errorf("%s: the answer %q holds U+FFFD: bytes that are no text", what, answer)
	case !words.MatchString(answer):
		t.Errorf("%s: the answer %q is not the test model's words", what, answer)
	case answer == "":
		t.Logf("%s: the answer is empty (the model ended it at once)", what)
	}
}

// command is name with args in its own process group, killed with the
// group when ctx ends or the test does.
func command(t *testing.T, ctx context.Context, name string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	t.Cleanup(func() {
		if cmd.Process != nil {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		}
	})
	return cmd
}

// TestDemoAnswersInWords runs scripts/demo.sh, what `make demo` runs once
// bin/apiary is built, while a queen somebody else runs answers at the
// default address ($APIARY_QUEEN here): the answer is words, valid UTF-8
// without U+FFFD (it was "�I��W7": the test model wrote byte tokens), the
// other queen is never asked (the demo ran `apiary infer` without
// --ephemeral, so it asked such a queen and failed on its token), and
// nothing the demo started is left.
func TestDemoAnswersInWords(t *testing.T) {
	other := testbin.StartOtherQueen(t)
	marker := t.TempDir() // TMPDIR: the throwaway data dir of the demo's queen is made in it
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := command(t, ctx, "scripts/demo.sh")
	cmd.Env = append(os.Environ(), "APIARY_BIN="+testbin.Path(t), "APIARY_DEMO_DIR="+t.TempDir(), "APIARY_QUEEN="+other.URL, "TMPDIR="+marker)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("scripts/demo.sh: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	out := strings.TrimSuffix(stdout.String(), "\n")
	if strings.Contains(out, "\n") {
		t.Errorf("the demo's stdout is more than the answer's line:\n%s", out)
	}
	checkWords(t, "make demo", out)
	if !strings.Contains(stderr.String(), "expect random words") {
		t.Errorf("stderr does not say what to expect:\n%s", stderr.String())
	}
	if got := other.Requests(); len(got) != 0 {
		t.Errorf("the queen at the default address got %q; the demo must start its own", got)
	}
	testbin.AwaitGone(t, marker, 30*time.Second)
}

// TestDemoInstallsOnlyWhatTheBuildNeeds: `make demo` installs the build's
// packages (scripts/deps.sh build), never the tests' (a browser, an
// emulator, an SSH server, a database, an init system), and of the build's
// only the compiler once llama.cpp's libraries are in the cache.
func TestDemoInstallsOnlyWhatTheBuildNeeds(t *testing.T) {
	dry, err := exec.Command("make", "-n", "demo").CombinedOutput()
	if err != nil {
		t.Fatalf("make -n demo: %v\n%s", err, dry)
	}
	calls := 0
	for line := range strings.Lines(string(dry)) {
		if strings.Contains(line, "scripts/deps.sh") {
			calls++
			if strings.TrimSpace(line) != "./scripts/deps.sh build" {
				t.Errorf("make demo runs %q, want ./scripts/deps.sh build", strings.TrimSpace(line))
			}
		}
	}
	if calls != 1 {
		t.Errorf("make demo runs scripts/deps.sh %d times, want once:\n%s", calls, dry)
	}

	list := func(cache string, args ...string) []string {
		t.Helper()
		cmd := exec.Command("scripts/deps.sh", append(args, "--list")...)
		cmd.Env = os.Environ()
		if cache != "" {
			cmd.Env = append(cmd.Env, "XDG_CACHE_HOME="+cache)
		}
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("scripts/deps.sh %s --list: %v", strings.Join(args, " "), err)
		}
		return strings.Fields(string(out))
	}
	testOnly := []string{"chromium", "qemu-user", "openssh-server", "postgresql-15", "systemd", "systemd-container", "curl"}
	tests := list("")
	for _, p := range testOnly {
		if !slices.Contains(tests, p) {
			t.Errorf("scripts/deps.sh --list lacks %s: %q", p, tests)
		}
	}

	cold := list(t.TempDir(), "build")
	if want := []string{"gcc", "g++", "make", "git", "nodejs", "npm", "cmake"}; !sameSet(cold, want) {
		t.Errorf("with an empty cache, make demo installs %q, want %q", cold, want)
	}
	if needs, err := exec.Command("scripts/llamacpp.sh", "needs").Output(); err != nil || len(bytes.TrimSpace(needs)) > 0 {
		t.Fatalf("this test needs llama.cpp built in the cache (make build builds it): scripts/llamacpp.sh needs = %q, %v", needs, err)
	}
	if warm, want := list("", "build"), []string{"gcc", "g++", "make"}; !sameSet(warm, want) {
		t.Errorf("with llama.cpp built, make demo installs %q, want %q", warm, want)
	}
}

func sameSet(a, b []string) bool {
	a, b = slices.Sorted(slices.Values(a)), slices.Sorted(slices.Values(b))
	return slices.Equal(a, b)
}

// block is one fenced block of README.md.
type block struct {
	lang string // the info string: sh, text, …
	line int    // of its opening fence
	body string
}

func readmeBlocks(t *testing.T) []block {
	t.Helper()
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	var blocks []block
	var cur *block
	for i, line := range strings.Split(string(b), "\n") {
		switch {
		case cur == nil && strings.HasPrefix(line, "```"):
			cur = &block{lang: strings.TrimPrefix(line, "```"), line: i + 1}
		case cur != nil && line == "```":
			blocks = append(blocks, *cur)
			cur = nil
		case cur != nil:
			cur.body += line + "\n"
		}
	}
	if cur != nil {
		t.Fatalf("README.md:%d: a block is never closed", cur.line)
	}
	return blocks
}

// TestREADMERunsAsWritten runs every block of README.md but the first
// (make demo and make test, which TestDemoAnswersInWords and CI run) as
// written, in order, in one bash, as a newcomer pastes them: sh blocks are
// run, the URLs of text blocks are opened (GET). It runs them in a network
// namespace of their own, so that the blocks' fixed default ports (queen
// 8080, hive 9200, worker 8001) are free whatever else runs on this
// machine, with a fresh HOME and bin/apiary in a fresh directory, and
// XDG_DATA_HOME set elsewhere than ~/.local/share (the blocks once wrote
// the model there, where apiary did not look): everything goes there.
func TestREADMERunsAsWritten(t *testing.T) {
	blocks := readmeBlocks(t)
	if len(blocks) < 2 || !strings.Contains(blocks[0].body, "make demo") || !strings.Contains(blocks[0].body, "make test") {
		t.Fatalf("README.md's first block is not make demo and make test: %+v", blocks)
	}
	work, home := t.TempDir(), t.TempDir()
	data := filepath.Join(home, "xdg-data")
	if err := os.Mkdir(filepath.Join(work, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(testbin.Path(t), filepath.Join(work, "bin", "apiary")); err != nil {
		t.Fatal(err)
	}

	// The script: the test's own lines set up the namespace's loopback
	// and mark where each block's output begins; the blocks are as
	// written.
	var script strings.Builder
	script.WriteString("set -eo pipefail\nip link set lo up\n")
	var urls []string
	for i, b := range blocks[1:] {
		fmt.Fprintf(&script, "echo '=== %d'\n", i)
		switch b.lang {
		case "sh":
			script.WriteString(b.body)
		case "text":
			for _, u := range strings.Fields(b.body) {
				if !strings.HasPrefix(u, "http://") {
					t.Fatalf("README.md:%d: text block holds %q, which is no URL: what does a newcomer do with it?", b.line, u)
				}
				fmt.Fprintf(&script, "curl -fsS --max-time 10 %q -o url-%d.html\n", u, len(urls))
				urls = append(urls, u)
			}
		default:
			t.Fatalf("README.md:%d: a %q block: this test runs sh and opens the URLs of text blocks", b.line, b.lang)
		}
	}
	script.WriteString("echo '=== end'\n")

	unshare := []string{"--net"}
	if os.Getuid() != 0 {
		unshare = append(unshare, "--map-root-user")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	cmd := command(t, ctx, "unshare", append(unshare, "bash", "-c", script.String())...)
	cmd.Dir = work
	cmd.Env = []string{"HOME=" + home, "XDG_DATA_HOME=" + data, "PATH=" + os.Getenv("PATH"), "LANG=C.UTF-8"} // no APIARY_*, no other XDG_*
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	logs := func() string {
		var b strings.Builder
		for _, f := range []string{"queen.log", "hive.log"} {
			if data, err := os.ReadFile(filepath.Join(work, f)); err == nil {
				fmt.Fprintf(&b, "\n%s:\n%s", f, data)
			}
		}
		return fmt.Sprintf("stdout:\n%s\nstderr:\n%s%s", stdout.String(), stderr.String(), b.String())
	}
	if err != nil {
		t.Fatalf("README.md's blocks: %v\n%s\nscript:\n%s", err, logs(), script.String())
	}

	// What each block wrote.
	outs := strings.Split(stdout.String(), "=== ")
	if len(outs) != len(blocks)+1 || !strings.HasPrefix(outs[len(outs)-1], "end") {
		t.Fatalf("the blocks' output is not in %d parts:\n%s", len(blocks), logs())
	}
	outOf := func(i int) []string {
		_, rest, _ := strings.Cut(outs[i+1], "\n")
		return strings.Split(strings.TrimSuffix(rest, "\n"), "\n")
	}
	answers := 0
	for i, b := range blocks[1:] {
		lines := outOf(i)
		where := fmt.Sprintf("README.md:%d", b.line)
		switch {
		case strings.Contains(b.body, "bin/apiary infer"):
			// The answer is the line infer writes (none when the model
			// ended it at once), after what models testmodel writes and
			// before the workers table.
			if j := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, "ID ") }); j >= 0 {
				table := strings.Join(lines[j:], "\n")
				if !strings.Contains(table, "RUNNING") || !strings.Contains(table, "tiny") {
					t.Errorf("%s: workers ls shows no running worker of tiny:\n%s", where, table)
				}
				// The model by the name the config gives it, its file beside.
				if strings.Contains(b.body, "models ls --config") &&
					(!strings.Contains(table, "bees (tiny)") || !regexp.MustCompile(`(?m)^bees\s+tiny\s`).MatchString(table)) {
					t.Errorf("%s: workers ls and models ls --config do not show bees with its file tiny:\n%s", where, table)
				}
				lines = lines[:j]
			}
			lines = slices.DeleteFunc(lines, func(l string) bool { return l == "" || strings.HasPrefix(l, "wrote ") })
			if len(lines) > 1 {
				t.Errorf("%s: more than the answer's line: %q", where, lines)
			}
			checkWords(t, where, strings.Join(lines, ""))
			answers++
		case strings.Contains(b.body, "/v1/completions"):
			text := regexp.MustCompile(`"text":"([^"]*)"`).FindStringSubmatch(strings.Join(lines, "\n"))
			if text == nil {
				t.Errorf("%s: no completion in %q", where, lines)
				continue
			}
			checkWords(t, where, text[1])
			answers++
		}
	}
	if _, err := os.Stat(filepath.Join(data, "apiary", "models", "tiny.gguf")); err != nil {
		t.Errorf("the blocks' model is not in $XDG_DATA_HOME/apiary/models: %v", err)
	}
	if _, err := os.Stat(filepath.Join(home, ".local", "share", "apiary")); err == nil {
		t.Errorf("the blocks wrote into ~/.local/share/apiary although XDG_DATA_HOME is set")
	}
	if answers != 3 {
		t.Errorf("%d blocks answered a prompt, want 3 (two apiary infer, one curl)", answers)
	}
	for i, u := range urls {
		page, err := os.ReadFile(filepath.Join(work, "url-"+strconv.Itoa(i)+".html"))
		if err != nil || !bytes.Contains(page, []byte("<title>apiary</title>")) {
			t.Errorf("%s is not the dashboard: %v\n%.300s", u, err, page)
		}
	}

	// The blocks stop what they start: nothing of the shell's process
	// group (the daemons the blocks start in the background) and no
	// worker (its own group, its model under HOME) is left.
	deadline := time.Now().Add(30 * time.Second)
	for {
		left := append(inGroup(cmd.Process.Pid), testbin.Matching(home)...)
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("processes left 30s after the last block: %v\n%s", cmdlines(left), logs())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// inGroup lists the processes of process group pgid.
func inGroup(pgid int) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp …; comm may hold anything, so
		// fields are counted after its closing parenthesis.
		i := bytes.LastIndexByte(stat, ')')
		if f := strings.Fields(string(stat[i+1:])); len(f) > 2 && f[2] == strconv.Itoa(pgid) && f[0] != "Z" {
			pids = append(pids, pid)
		}
	}
	return pids
}

func cmdlines(pids []int) []string {
	var out []string
	for _, p := range pids {
		out = append(out, fmt.Sprintf("%d %s", p, testbin.Cmdline(p)))
	}
	return out
}
