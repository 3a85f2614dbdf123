package sshnode

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/apiary-llm/apiary/internal/secret"
)

// The kinds of failure a probe tells apart; each *Error wraps one.
var (
	ErrNoClient      = errors.New("no ssh client")
	ErrTimeout       = errors.New("connection timed out")
	ErrUnreachable   = errors.New("node unreachable")
	ErrHostKey       = errors.New("host key not trusted")
	ErrAuth          = errors.New("authentication failed")
	ErrMissingBinary = errors.New("no usable apiary binary on the node")
	ErrRemote        = errors.New("remote command failed")
)

// Error is a failed ssh run: its kind (one of the Err… above), the target,
// what to do, and ssh's own words.
type Error struct {
	Kind   error
	Target Target
	Hint   string
	Stderr string
}

func (e *Error) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %s", e.Target, e.Kind.Error())
	if e.Hint != "" {
		b.WriteString(": ")
		b.WriteString(e.Hint)
	}
	if s := lastLine(e.Stderr); s != "" {
		// ssh's own lines mostly start with "ssh: " already.
		fmt.Fprintf(&b, " (ssh: %s)", strings.TrimPrefix(s, "ssh: "))
	}
	return b.String()
}

func (e *Error) Unwrap() error { return e.Kind }

// Client runs the system ssh. The zero value uses "ssh" from PATH with the
// user's own configuration.
type Client struct {
	// Path of the ssh binary; default "ssh" looked up in PATH.
	Path string
	// ConfigFile is passed as -F (the queen's --ssh-config); empty: the
	// user's ~/.ssh/config, found by ssh from the password database.
	ConfigFile string
	// ConnectTimeout bounds the TCP connect and the SSH handshake;
	// default 10s.
	ConnectTimeout time.Duration
	// AliveInterval is how often a long session checks the peer is still
	// there (ServerAliveInterval; 3 misses end it); default 10s.
	AliveInterval time.Duration
}

// options are the -o settings apiary insists on: no prompt ever, host keys
// checked against known_hosts (an unknown or changed key is an error, not a
// question), and a dead peer noticed.
func (c Client) options() []string {
	connect := c.ConnectTimeout
	if connect <= 0 {
		connect = 10 * time.Second
	}
	alive := c.AliveInterval
	if alive <= 0 {
		alive = 10 * time.Second
	}
	args := []string{}
	if c.ConfigFile != "" {
		args = append(args, "-F", c.ConfigFile)
	}
	return append(args,
		"-T",
		"-o", "BatchMode=yes",
		"-o", "StrictHostKeyChecking=yes",
		"-o", "ConnectTimeout="+strconv.Itoa(max(1, int(connect.Round(time.Second)/time.Second))),
		"-o", "ServerAliveInterval="+strconv.Itoa(max(1, int(alive.Round(time.Second)/time.Second))),
		"-o", "ServerAliveCountMax=3",
		"-o", "LogLevel=ERROR",
	)
}

// Command is the argv (without argv[0]) and the binary that run remote (a
// RemoteCommand string) on t.
func (c Client) Command(t Target, remote string) (path string, args []string) {
	path = c.Path
	if path == "" {
		path = "ssh"
	}
	args = c.options()
	if t.Port != 0 {
		args = append(args, "-p", strconv.Itoa(t.Port))
	}
	if t.User != "" {
		args = append(args, "-l", t.User)
	}
	// "--" ends ssh's options: the host can never be read as one.
	return path, append(args, "--", t.Host, remote)
}

// LookPath finds the ssh binary, or says to install it.
func (c Client) LookPath() (string, error) {
	path, _ := c.Command(Target{}, "")
	p, err := exec.LookPath(path)
	if err != nil {
		return "", &Error{Kind: ErrNoClient, Hint: "install the OpenSSH client (Debian: apt-get install openssh-client)"}
	}
	return p, nil
}

// Run runs remote on t with stdin and returns its stdout. Failures are an
// *Error of the kind ssh's exit status and message say.
func (c Client) Run(ctx context.Context, t Target, remote string, stdin io.Reader) ([]byte, error) {
	path, err := c.LookPath()
	if err != nil {
		e := err.(*Error)
		e.Target = t
		return nil, e
	}
	_, args := c.Command(t, remote)
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Env = secret.Scrub(os.Environ()) // an ssh config's SendEnv must find no secret
	cmd.Stdin = stdin
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = time.Second
	err = cmd.Run()
	if err == nil {
		return stdout.Bytes(), nil
	}
	if ctx.Err() != nil {
		return nil, &Error{Kind: ErrTimeout, Target: t, Hint: "no answer in time: " + ctx.Err().Error(), Stderr: stderr.String()}
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ExitCode() != 255 {
		// The remote command ran and failed; 255 is ssh's own failure.
		return stdout.Bytes(), &Error{Kind: ErrRemote, Target: t, Hint: "exit code " + strconv.Itoa(ee.ExitCode()), Stderr: stderr.String()}
	}
	return nil, Classify(t, stderr.String())
}

// Classify names an ssh failure (exit status 255) from ssh's message.
func Classify(t Target, stderr string) *Error {
	s := strings.ToLower(stderr)
	e := &Error{Target: t, Stderr: stderr}
	switch {
	case strings.Contains(s, "host key verification failed"), strings.Contains(s, "host key is known"),
		strings.Contains(s, "remote host identification has changed"):
		e.Kind, e.Hint = ErrHostKey, "the node's host key is not in known_hosts (or changed); check it, then add it with ssh-keyscan or one interactive ssh"
	case strings.Contains(s, "permission denied"), strings.Contains(s, "too many authentication failures"):
		e.Kind, e.Hint = ErrAuth, "the node refused every key; add this machine's public key to the node's authorized_keys (ssh runs with BatchMode, no passwords)"
	case strings.Contains(s, "timed out"):
		e.Kind, e.Hint = ErrTimeout, "no answer from the node's sshd; check the address, the port and the network"
	case strings.Contains(s, "could not resolve hostname"), strings.Contains(s, "connection refused"),
		strings.Contains(s, "no route to host"), strings.Contains(s, "network is unreachable"),
		strings.Contains(s, "connection closed"), strings.Contains(s, "connection reset"):
		e.Kind, e.Hint = ErrUnreachable, "check the host name, the port and that sshd runs there"
	default:
		e.Kind, e.Hint = ErrUnreachable, "ssh failed"
	}
	return e
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(strings.ReplaceAll(s, "\r", "")), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if l := strings.TrimSpace(lines[i]); l != "" {
			if len(l) > 300 {
				l = l[:300] + "…"
			}
			return l
		}
	}
	return ""
}
