// Package sdnotify speaks systemd's service notification protocol: a
// datagram of newline-separated KEY=VALUE lines (READY=1, STOPPING=1,
// WATCHDOG=1, STATUS=…) written to the unix socket named by
// $NOTIFY_SOCKET (a name starting with '@' is an abstract socket), and the
// watchdog period from $WATCHDOG_USEC. Without $NOTIFY_SOCKET every call
// does nothing, so a daemon run by hand is unchanged.
package sdnotify

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
)

// Environment variables systemd sets for a Type=notify service.
const (
	SocketEnv      = "NOTIFY_SOCKET"
	WatchdogEnv    = "WATCHDOG_USEC"
	WatchdogPIDEnv = "WATCHDOG_PID"
)

// Notifier sends states to the service manager. The zero Notifier (and a
// nil one) sends nothing.
type Notifier struct {
	socket   string        // $NOTIFY_SOCKET; "" sends nothing
	watchdog time.Duration // $WATCHDOG_USEC for this process; 0 for none
}

// FromEnv reads $NOTIFY_SOCKET and $WATCHDOG_USEC (when $WATCHDOG_PID is
// unset or this process's id) and removes the three variables from the
// environment: the processes this daemon starts (a hive, workers) are not
// the service's main process and must not talk to its manager.
func FromEnv() (*Notifier, error) {
	n := &Notifier{socket: os.Getenv(SocketEnv)}
	usec, pid := os.Getenv(WatchdogEnv), os.Getenv(WatchdogPIDEnv)
	for _, v := range []string{SocketEnv, WatchdogEnv, WatchdogPIDEnv} {
		_ = os.Unsetenv(v)
	}
	if n.socket != "" && n.socket[0] != '/' && n.socket[0] != '@' {
		return nil, fmt.Errorf("$%s %q is neither a path nor an abstract socket (@name)", SocketEnv, n.socket)
	}
	if usec == "" || (pid != "" && pid != strconv.Itoa(os.Getpid())) {
		return n, nil
	}
	us, err := strconv.ParseUint(usec, 10, 63)
	if err != nil || us == 0 {
		return nil, fmt.Errorf("$%s %q is not a positive number of microseconds", WatchdogEnv, usec)
	}
	n.watchdog = time.Duration(us) * time.Microsecond
	return n, nil
}

// Enabled says whether a service manager listens.
func (n *Notifier) Enabled() bool { return n != nil && n.socket != "" }

// Watchdog is the manager's watchdog timeout (0: none); a daemon pings it
// at half of it.
func (n *Notifier) Watchdog() time.Duration {
	if !n.Enabled() {
		return 0
	}
	return n.watchdog
}

// Send writes the states, one KEY=VALUE each, in one datagram. A state
// must not hold a newline (STATUS= text is cut at the first one).
func (n *Notifier) Send(states ...string) error {
	if !n.Enabled() || len(states) == 0 {
		return nil
	}
	lines := make([]string, len(states))
	for i, s := range states {
		lines[i], _, _ = strings.Cut(s, "\n")
	}
	conn, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: n.socket, Net: "unixgram"})
	if err != nil {
		return err
	}
	defer conn.Close()
	if _, err := conn.Write([]byte(strings.Join(lines, "\n") + "\n")); err != nil {
		return err
	}
	return nil
}

// Daemon is what Run reports on.
type Daemon struct {
	// Serving is closed once the daemon serves: READY=1 is sent then.
	Serving <-chan struct{}
	// Done is closed once the daemon has stopped.
	Done <-chan struct{}
	// Alive answers nil while the daemon's main loop works (e.g. its HTTP
	// server answers its own /health); a watchdog ping is sent only then.
	Alive func(context.Context) error
	// Status is a line for STATUS= (counts of pools, workers, …).
	Status func() string
}

// StatusInterval is how often STATUS= is sent when there is no watchdog.
const StatusInterval = 30 * time.Second

// Run reports d to the manager until d is done: READY=1 with a STATUS=
// once it serves, WATCHDOG=1 every half watchdog period while Alive
// answers, STATUS= at each tick, and STOPPING=1 as soon as ctx ends (the
// daemon's shutdown has begun) or d stops on its own. Errors of the socket
// are logged, never fatal: a daemon does not stop because its manager is
// gone.
func Run(ctx context.Context, n *Notifier, d Daemon, log *slog.Logger) {
	if !n.Enabled() {
		return
	}
	send := func(states ...string) {
		if err := n.Send(states...); err != nil {
			log.Warn("could not notify the service manager", "err", err)
		}
	}
	select {
	case <-d.Serving:
		send("READY=1", "STATUS="+d.Status())
	case <-ctx.Done():
		send("STOPPING=1")
		return
	case <-d.Done:
		send("STOPPING=1")
		return
	}
	every := StatusInterval
	if wd := n.Watchdog(); wd > 0 {
		every = wd / 2
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			send("STOPPING=1", "STATUS=stopping")
			return
		case <-d.Done:
			send("STOPPING=1", "STATUS=stopped")
			return
		case <-t.C:
		}
		states := []string{"STATUS=" + d.Status()}
		if n.Watchdog() > 0 {
			actx, cancel := context.WithTimeout(ctx, every)
			err := d.Alive(actx)
			cancel()
			switch {
			case err == nil:
				states = append(states, "WATCHDOG=1")
			case ctx.Err() != nil:
				continue // shutting down: the next loop says so
			default:
				log.Warn("liveness check failed; no watchdog ping", "err", err)
			}
		}
		send(states...)
	}
}
