// The first hour of a newcomer (issue #34), tested as the newcomer meets
// it: what `make demo` installs and runs.
package apiary_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"
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

// standin is an HTTP server that answers GET /health as a queen does and
// every other request with 401: a queen somebody else runs, with tokens.
// It counts what it is asked.
type standin struct {
	url string
	mu  sync.Mutex
	got []string // guarded by mu
}

func startStandin(t *testing.T) *standin {
	t.Helper()
	s := &standin{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.got = append(s.got, r.Method+" "+r.URL.Path)
		s.mu.Unlock()
		if r.URL.Path == "/health" {
			fmt.Fprint(w, `{"status":"ok","version":"someone else's"}`)
			return
		}
		http.Error(w, `{"error":{"code":"unauthorized","message":"missing or invalid bearer token"}}`, http.StatusUnauthorized)
	}))
	t.Cleanup(srv.Close)
	s.url = srv.URL
	return s
}

func (s *standin) requests() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.got)
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
	other := startStandin(t)
	marker := t.TempDir() // TMPDIR: the throwaway data dir of the demo's queen is made in it
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := command(t, ctx, "scripts/demo.sh")
	cmd.Env = append(os.Environ(), "APIARY_BIN="+testbin.Path(t), "APIARY_DEMO_DIR="+t.TempDir(), "APIARY_QUEEN="+other.url, "TMPDIR="+marker)
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
	if got := other.requests(); len(got) != 0 {
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
	testOnly := []string{"chromium", "qemu-user", "openssh-server", "postgresql-15", "systemd"}
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
