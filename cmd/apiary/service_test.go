package main

import (
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/testbin"
)

// notifySocket is a real unixgram socket a test hands a daemon as
// $NOTIFY_SOCKET; its datagrams arrive on a channel.
type notifySocket struct {
	path string
	msgs chan string
}

func newNotifySocket(t *testing.T) *notifySocket {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify")
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	s := &notifySocket{path: path, msgs: make(chan string, 1024)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 4096)
		for {
			n, err := c.Read(buf)
			if err != nil {
				return
			}
			select {
			case s.msgs <- string(buf[:n]):
			default:
			}
		}
	}()
	t.Cleanup(func() { c.Close(); <-done })
	return s
}

// next is the next datagram.
func (s *notifySocket) next(t *testing.T, what string) string {
	t.Helper()
	select {
	case m := <-s.msgs:
		return m
	case <-time.After(testbin.WaitLimit):
		t.Fatalf("no notification (%s) within %s", what, testbin.WaitLimit)
		return ""
	}
}

// until reads datagrams until one holds want, and returns it.
func (s *notifySocket) until(t *testing.T, want string) string {
	t.Helper()
	for {
		if m := s.next(t, want); strings.Contains(m, want) {
			return m
		}
	}
}

// status is the STATUS= text of a datagram.
func status(m string) string {
	for _, l := range strings.Split(m, "\n") {
		if s, ok := strings.CutPrefix(l, "STATUS="); ok {
			return s
		}
	}
	return ""
}

// The daemons speak systemd's notify protocol to a real socket: READY=1
// first, once each serves (the queen's /health answers then; the hive has
// registered), WATCHDOG=1 every half WATCHDOG_USEC, STATUS= lines with
// their counts, STOPPING=1 on SIGTERM, and a clean exit.
func TestProcessNotifyProtocol(t *testing.T) {
	env := func(s *notifySocket) []string {
		return []string{"NOTIFY_SOCKET=" + s.path, "WATCHDOG_USEC=200000", "APIARY_API_TOKEN=", "APIARY_ADMIN_TOKEN=", "APIARY_CLUSTER_TOKEN="}
	}
	qs := newNotifySocket(t)
	q := testbin.Start(t, "queen", env(qs), "queen", "--addr", "127.0.0.1:0", "--data-dir", t.TempDir(), "--heartbeat-timeout", "5s")
	first := qs.next(t, "queen READY=1")
	if !strings.HasPrefix(first, "READY=1\n") {
		t.Fatalf("the queen's first notification is %q, want READY=1", first)
	}
	url, _, ok := strings.Cut(strings.TrimPrefix(status(first), "serving at "), ";")
	if !ok || !strings.HasPrefix(url, "http://127.0.0.1:") {
		t.Fatalf("queen STATUS %q does not say where it serves", status(first))
	}
	resp, err := http.Get(url + "/health")
	if err != nil {
		t.Fatalf("READY=1 came, but the queen does not serve: %v", err)
	}
	resp.Body.Close()
	for range 3 {
		if m := qs.next(t, "queen WATCHDOG=1"); !strings.Contains(m, "WATCHDOG=1") || !strings.Contains(status(m), "pools: ") {
			t.Fatalf("queen ping %q: want WATCHDOG=1 and a STATUS with the pools", m)
		}
	}

	for _, tc := range []struct {
		name, queen, says string
	}{
		{"registered", url, "queen: registered at " + url},
		{"standalone", "http://127.0.0.1:1", "queen: standalone"},
	} {
		t.Run("hive "+tc.name, func(t *testing.T) {
			hs := newNotifySocket(t)
			h := testbin.Start(t, "hive", env(hs), "hive", "--addr", "127.0.0.1:0", "--data-dir", t.TempDir(), "--queen", tc.queen,
				"--pool-id", "p-"+tc.name, "--heartbeat-interval", "1s")
			m := hs.next(t, "hive READY=1")
			if !strings.HasPrefix(m, "READY=1\n") || !strings.Contains(status(m), tc.says) || !strings.Contains(status(m), "workers: 0 live") {
				t.Fatalf("the hive's first notification is %q, want READY=1 and a STATUS with %q", m, tc.says)
			}
			for range 3 {
				if m := hs.next(t, "hive WATCHDOG=1"); !strings.Contains(m, "WATCHDOG=1") {
					t.Fatalf("hive ping %q", m)
				}
			}
			if tc.name == "registered" {
				qs.until(t, "pools: 1 healthy")
			}
			h.Signal(syscall.SIGTERM)
			hs.until(t, "STOPPING=1")
			if code := h.Wait(t); code != 0 {
				t.Errorf("hive exit %d after SIGTERM", code)
			}
		})
	}

	q.Signal(syscall.SIGTERM)
	qs.until(t, "STOPPING=1")
	if code := q.Wait(t); code != 0 {
		t.Errorf("queen exit %d after SIGTERM", code)
	}
}

// The real binary, run from wherever it was built (here a copy under
// /tmp, which the unit's PrivateTmp hides), prints a unit whose ExecStart
// is the copy it would install in /usr/local/lib/apiary, says so, and
// refuses a daemon flag it would not take and a file the sandbox hides.
func TestProcessServiceInstallDryRun(t *testing.T) {
	bin := testbin.Path(t)
	abs, err := filepath.EvalSymlinks(bin)
	if err != nil {
		t.Fatal(err)
	}
	tmp, err := os.MkdirTemp("/tmp", "apiary-service-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tmp) })
	data, err := os.ReadFile(abs)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tmp, "apiary"), data, 0o755); err != nil {
		t.Fatal(err)
	}
	libs, _ := filepath.Glob(filepath.Join(filepath.Dir(abs), "lib*.so"))
	for _, l := range libs {
		if err := os.Symlink(l, filepath.Join(tmp, filepath.Base(l))); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(filepath.Join(tmp, "apiary"), "service", "install", "queen", "--dry-run", "--", "--config", "/etc/apiary/models.yaml")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%v: %s", err, stderr.String())
	}
	if want := "ExecStart=/usr/local/lib/apiary/apiary queen --data-dir /var/lib/apiary/queen --config /etc/apiary/models.yaml\n"; !strings.Contains(string(out), want) {
		t.Errorf("dry run:\n%s\nwant the line %q", out, want)
	}
	if want := "would copy " + filepath.Join(tmp, "apiary") + " and its libraries to /usr/local/lib/apiary"; !strings.Contains(stderr.String(), want) {
		t.Errorf("dry run said %q, want %q", stderr.String(), want)
	}
	if !strings.Contains(string(out), "ExecReload=") {
		t.Error("a queen with --config reloads on SIGHUP: ExecReload= missing")
	}
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"service", "install", "hive", "--dry-run", "--", "--no-such-flag"}, "unknown flag: --no-such-flag"},
		{[]string{"service", "install", "hive", "--dry-run", "--", "--data-dir", "/x"}, "--data-dir goes before --"},
		{[]string{"service", "install", "worker", "--dry-run"}, "not a service role"},
		{[]string{"service", "install", "hive", "--dry-run", "--data-dir", "/a b"}, "--data-dir"},
		{[]string{"service", "install", "queen", "--dry-run", "--", "--config", "/home/me/models.yaml"}, "--config \"/home/me/models.yaml\" is under /home, which the service cannot see (ProtectHome=yes"},
		{[]string{"service", "install", "hive", "--dry-run", "--env-file", "/tmp/hive.env"}, "is under /tmp, which the service cannot see (PrivateTmp=yes"},
	} {
		code, _, errOut := apiary(t, tc.args...)
		if code != 2 || !strings.Contains(errOut, tc.says) {
			t.Errorf("%v: exit %d, %q; want 2 and %q", tc.args, code, errOut, tc.says)
		}
	}
}

// Without root, writing to the system unit directory fails with a clear
// error naming --dry-run and --unit-dir (run as nobody when the test is
// root).
func TestProcessServiceInstallNeedsRoot(t *testing.T) {
	cmd := exec.Command(testbin.Path(t), "service", "install", "hive", "--user", "nobody")
	if os.Geteuid() == 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	}
	out, err := cmd.CombinedOutput()
	if err == nil || cmd.ProcessState.ExitCode() != 1 {
		t.Fatalf("install without root: %v\n%s", err, out)
	}
	for _, want := range []string{"needs root", "/etc/systemd/system", "--dry-run", "--unit-dir"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("error %q does not say %q", out, want)
		}
	}
}
