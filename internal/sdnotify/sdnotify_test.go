package sdnotify

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// listen binds a unixgram socket (an abstract one for a name starting
// with '@') and returns it with its name for $NOTIFY_SOCKET.
func listen(t *testing.T, name string) *net.UnixConn {
	t.Helper()
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: name, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func read(t *testing.T, c *net.UnixConn) string {
	t.Helper()
	buf := make([]byte, 4096)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, err := c.Read(buf)
	if err != nil {
		t.Fatalf("no notification: %v", err)
	}
	return string(buf[:n])
}

func TestFromEnv(t *testing.T) {
	pid := strconv.Itoa(os.Getpid())
	for _, tc := range []struct {
		name, socket, usec, wdPID string
		want                      time.Duration
		enabled, fails            bool
	}{
		{name: "unset"},
		{name: "socket only", socket: "/run/x", enabled: true},
		{name: "abstract", socket: "@x", enabled: true},
		{name: "watchdog", socket: "/run/x", usec: "30000000", enabled: true, want: 30 * time.Second},
		{name: "watchdog of this pid", socket: "/run/x", usec: "1000", wdPID: pid, enabled: true, want: time.Millisecond},
		{name: "watchdog of another pid", socket: "/run/x", usec: "1000", wdPID: "1", enabled: true},
		{name: "bad usec", socket: "/run/x", usec: "soon", fails: true},
		{name: "zero usec", socket: "/run/x", usec: "0", fails: true},
		{name: "relative socket", socket: "run/x", fails: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(SocketEnv, tc.socket)
			t.Setenv(WatchdogEnv, tc.usec)
			t.Setenv(WatchdogPIDEnv, tc.wdPID)
			n, err := FromEnv()
			if (err != nil) != tc.fails {
				t.Fatalf("err %v, want failure %v", err, tc.fails)
			}
			for _, v := range []string{SocketEnv, WatchdogEnv, WatchdogPIDEnv} {
				if _, set := os.LookupEnv(v); set {
					t.Errorf("$%s still set: children would inherit it", v)
				}
			}
			if tc.fails {
				return
			}
			if n.Enabled() != tc.enabled || n.Watchdog() != tc.want {
				t.Errorf("enabled %v watchdog %s; want %v %s", n.Enabled(), n.Watchdog(), tc.enabled, tc.want)
			}
		})
	}
}

// Send reaches a socket by path and an abstract one; a newline in a
// STATUS text cannot add a state.
func TestSend(t *testing.T) {
	for _, name := range []string{filepath.Join(t.TempDir(), "notify"), "@apiary-sdnotify-test-" + strconv.Itoa(os.Getpid())} {
		c := listen(t, name)
		n := &Notifier{socket: name}
		if err := n.Send("READY=1", "STATUS=a\nWATCHDOG=1"); err != nil {
			t.Fatal(err)
		}
		if got, want := read(t, c), "READY=1\nSTATUS=a\n"; got != want {
			t.Errorf("%s: got %q, want %q", name, got, want)
		}
	}
	var none *Notifier
	if err := none.Send("READY=1"); err != nil {
		t.Errorf("a nil notifier sends nothing, got %v", err)
	}
}

// Run: READY=1 only once serving, WATCHDOG=1 only while Alive holds (the
// STATUS goes on), STOPPING=1 when the context ends.
func TestRun(t *testing.T) {
	name := filepath.Join(t.TempDir(), "notify")
	c := listen(t, name)
	n := &Notifier{socket: name, watchdog: 20 * time.Millisecond}
	serving, done := make(chan struct{}), make(chan struct{})
	var alive atomic.Bool
	alive.Store(true)
	d := Daemon{Serving: serving, Done: done, Status: func() string { return "3 pools" },
		Alive: func(context.Context) error {
			if alive.Load() {
				return nil
			}
			return errors.New("stuck")
		}}
	ctx, cancel := context.WithCancel(t.Context())
	ran := make(chan struct{})
	go func() { Run(ctx, n, d, slog.New(slog.NewTextHandler(io.Discard, nil))); close(ran) }()

	_ = c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if _, err := c.Read(make([]byte, 64)); err == nil {
		t.Fatal("a notification before the daemon serves")
	}
	close(serving)
	if got := read(t, c); got != "READY=1\nSTATUS=3 pools\n" {
		t.Fatalf("first notification %q", got)
	}
	for range 3 {
		if got := read(t, c); got != "STATUS=3 pools\nWATCHDOG=1\n" {
			t.Fatalf("ping %q", got)
		}
	}
	alive.Store(false)
	for seen := 0; seen < 3; {
		switch got := read(t, c); got {
		case "STATUS=3 pools\n":
			seen++
		case "STATUS=3 pools\nWATCHDOG=1\n":
			if seen > 0 {
				t.Fatal("a watchdog ping while the daemon is not alive")
			}
		default:
			t.Fatalf("got %q", got)
		}
	}
	cancel()
	for {
		got := read(t, c)
		if strings.HasPrefix(got, "STOPPING=1\n") {
			break
		}
		if strings.Contains(got, "WATCHDOG=1") {
			t.Fatalf("ping after the daemon stopped being alive: %q", got)
		}
	}
	<-ran
	close(done)
}
