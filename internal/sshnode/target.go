// Package sshnode runs apiary on other machines through the system's `ssh`
// client, so that the user's configuration (~/.ssh/config or --ssh-config,
// keys, agent, ProxyJump) applies as it does to their own ssh sessions:
// it probes a node, copies the apiary binary there when it is missing or
// another build, and builds the command that starts a hive there whose
// lifeline is the SSH session itself.
//
// Nothing user-given reaches a remote shell unquoted: every remote command
// is a constant `sh -c` script whose inputs are positional parameters,
// each single-quoted, and the inputs are validated before that.
package sshnode

import (
	"errors"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"
)

// Target is where a node's sshd listens and who to log in as.
type Target struct {
	User string // empty: ssh's configured or default user
	Host string // a host name, an alias of the ssh config, or an IP address
	Port int    // 0: ssh's configured or default port
}

// Patterns use * and leave the length to the code: a counted repetition
// such as {0,199} compiles into a regexp program of that many copies,
// which cost every process start milliseconds.
var (
	userPattern = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]*$`) // at most 64 bytes
	hostPattern = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]*$`) // at most 253 bytes
)

// ErrBadTarget is a malformed USER@HOST[:PORT].
var ErrBadTarget = errors.New("invalid ssh target")

// ParseTarget reads USER@HOST[:PORT] (USER@ optional; an IPv6 address in
// brackets). Nothing that ssh could read as an option is accepted.
func ParseTarget(s string) (Target, error) {
	bad := func(why string) (Target, error) {
		return Target{}, fmt.Errorf("%w %q: %s (want USER@HOST[:PORT])", ErrBadTarget, s, why)
	}
	var t Target
	rest := s
	if u, h, ok := strings.Cut(s, "@"); ok {
		if len(u) > 64 || !userPattern.MatchString(u) {
			return bad("the user must be letters, digits, '_', '.' or '-', not starting with '-' or '.'")
		}
		t.User, rest = u, h
	}
	host, port := rest, ""
	switch {
	case strings.HasPrefix(rest, "["):
		end := strings.Index(rest, "]")
		if end < 0 {
			return bad("unclosed '['")
		}
		host = rest[1:end]
		if after := rest[end+1:]; after != "" {
			p, ok := strings.CutPrefix(after, ":")
			if !ok {
				return bad("junk after ']'")
			}
			port = p
		}
		if ip := net.ParseIP(host); ip == nil || ip.To4() != nil {
			return bad("brackets hold an IPv6 address")
		}
	case strings.Count(rest, ":") == 1:
		host, port, _ = strings.Cut(rest, ":")
	case strings.Count(rest, ":") > 1:
		if net.ParseIP(rest) == nil {
			return bad("an IPv6 address with a port goes in brackets: [ADDR]:PORT")
		}
	}
	if net.ParseIP(host) == nil && (len(host) > 253 || !hostPattern.MatchString(host)) {
		return bad("the host must be a name or an IP address")
	}
	t.Host = host
	if port != "" {
		n, err := strconv.Atoi(port)
		if err != nil || n < 1 || n > 65535 {
			return bad("the port must be a number from 1 to 65535")
		}
		t.Port = n
	}
	return t, nil
}

// String is the target as ParseTarget reads it.
func (t Target) String() string {
	var b strings.Builder
	if t.User != "" {
		b.WriteString(t.User)
		b.WriteByte('@')
	}
	host := t.Host
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	b.WriteString(host)
	if t.Port != 0 {
		b.WriteByte(':')
		b.WriteString(strconv.Itoa(t.Port))
	}
	return b.String()
}

// installDirPattern: an absolute path or one under ~, of plain characters.
var installDirPattern = regexp.MustCompile(`^(~|~/[A-Za-z0-9_./+-]*|/[A-Za-z0-9_./+-]*)$`)

// DefaultInstallDir is where apiary is copied on a node unless told.
const DefaultInstallDir = "~/.local/bin"

// CheckInstallDir validates an --install-dir: absolute or under ~, plain
// characters, no "..".
func CheckInstallDir(dir string) error { return CheckPath("install dir", dir) }

// CheckPath checks a path on a node that goes into its command line (an
// install dir, a certificate file): absolute or under ~/, of letters,
// digits and _ . / + -, without "..". what names it in the error.
func CheckPath(what, p string) error {
	if len(p) > 512 || !installDirPattern.MatchString(p) {
		return fmt.Errorf("%s %q must be an absolute path or start with ~/, of letters, digits and _ . / + -", what, p)
	}
	for _, part := range strings.Split(p, "/") {
		if part == ".." {
			return fmt.Errorf("%s %q must not contain a \"..\" part", what, p)
		}
	}
	return nil
}

// Quote makes s one word for a POSIX shell: s in single quotes, each
// single quote inside it closed, escaped with a backslash and reopened.
func Quote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// RemoteCommand is the command line ssh hands the login shell on the
// node: the constant script run by sh with args as its positional
// parameters $1…, every word quoted.
func RemoteCommand(script string, args ...string) string {
	words := []string{"sh", "-c", Quote(script), "sh"}
	for _, a := range args {
		words = append(words, Quote(a))
	}
	return strings.Join(words, " ")
}
