// Package service installs apiary's daemons as systemd services: the unit
// file of a queen or a hive (a dedicated user, hardening, the notify
// protocol and its watchdog, the stop that lets a hive stop its own
// workers), its environment file for the tokens, and its removal.
package service

import (
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/apiary-llm/apiary/internal/config"
)

// Role is the daemon a unit runs.
type Role string

// The roles that run as services.
const (
	Queen Role = "queen"
	Hive  Role = "hive"
)

// ParseRole accepts "queen" or "hive".
func ParseRole(s string) (Role, error) {
	switch r := Role(s); r {
	case Queen, Hive:
		return r, nil
	}
	return "", fmt.Errorf("%q is not a service role: want queen or hive", s)
}

// UnitName is the unit's file name: apiary-queen.service, apiary-hive.service.
func (r Role) UnitName() string { return "apiary-" + string(r) + ".service" }

// Defaults of a Unit.
const (
	DefaultUser     = "apiary"
	DefaultUnitDir  = "/etc/systemd/system"
	DefaultWatchdog = 60 * time.Second
)

// DefaultDataDir is a role's data directory: /var/lib/apiary/ROLE.
func DefaultDataDir(r Role) string { return filepath.Join("/var/lib/apiary", string(r)) }

// DefaultModelsDir is the hive's models directory.
const DefaultModelsDir = "/var/lib/apiary/models"

// DefaultEnvFile is a role's environment file: /etc/apiary/ROLE.env.
func DefaultEnvFile(r Role) string { return filepath.Join("/etc/apiary", string(r)+".env") }

// Unit is what a unit file says. Render writes it.
type Unit struct {
	Role Role
	// Binary is the absolute path of the apiary binary ExecStart runs.
	Binary string
	// User runs the daemon (and its group of the same name). Default
	// DefaultUser.
	User string
	// DataDir is the daemon's --data-dir, writable. Default DefaultDataDir.
	DataDir string
	// ModelsDir is the hive's --models-dir, writable (pulls write there);
	// the queen has none. Default DefaultModelsDir for a hive.
	ModelsDir string
	// EnvFile holds the tokens (KEY=VALUE lines), read by systemd as
	// root; the unit names it and never holds a secret. Default
	// DefaultEnvFile.
	EnvFile string
	// Args are the daemon's other flags, after --data-dir (and
	// --models-dir).
	Args []string
	// StopTimeout is TimeoutStopSec: how long the main process has after
	// SIGTERM before everything left in the unit is SIGKILLed. It must
	// exceed the daemon's own stop (a hive's cascade). Required.
	StopTimeout time.Duration
	// Reload gives the unit ExecReload= (SIGHUP): a queen with --config
	// reads its models file again on SIGHUP; a daemon without it would
	// die of the signal.
	Reload bool
	// Watchdog is WatchdogSec; the daemon pings at half of it. Default
	// DefaultWatchdog; negative: none.
	Watchdog time.Duration
}

// WithDefaults fills the zero fields.
func (u Unit) WithDefaults() Unit {
	config.Default(&u.User, DefaultUser)
	config.Default(&u.DataDir, DefaultDataDir(u.Role))
	if u.Role == Hive {
		config.Default(&u.ModelsDir, DefaultModelsDir)
	}
	config.Default(&u.EnvFile, DefaultEnvFile(u.Role))
	config.Default(&u.Watchdog, DefaultWatchdog)
	return u
}

// Validate reports every problem by field.
func (u Unit) Validate() error {
	var p config.Problems
	bad := p.Add
	if _, err := ParseRole(string(u.Role)); err != nil {
		bad("Role", "%q is not queen or hive", u.Role)
	}
	for field, p := range map[string]string{"Binary": u.Binary, "DataDir": u.DataDir, "ModelsDir": u.ModelsDir, "EnvFile": u.EnvFile} {
		switch {
		case p == "" && field == "ModelsDir" && u.Role != Hive:
		case p == "" && field == "ModelsDir":
			bad(field, "a hive needs a models directory")
		case field == "ModelsDir" && u.Role != Hive:
			bad(field, "only a hive has a models directory")
		case !filepath.IsAbs(p) || filepath.Clean(p) != p:
			bad(field, "%q is not a clean absolute path", p)
		case strings.ContainsAny(p, " \t\n\r\"'\\%$;"):
			bad(field, "%q holds a space, quote, backslash, %%, $ or ; (unit files would need them escaped)", p)
		}
	}
	if !validUser(u.User) {
		bad("User", "%q is not a user name (lower-case letters, digits, _ and -, starting with a letter or _)", u.User)
	}
	if u.Reload && u.Role != Queen {
		bad("Reload", "only a queen reloads (its --config) on SIGHUP")
	}
	if u.StopTimeout < time.Second {
		bad("StopTimeout", "must be at least 1s, got %s", u.StopTimeout)
	}
	if u.Watchdog > 0 && u.Watchdog < 2*time.Second {
		bad("Watchdog", "must be at least 2s (or negative for none), got %s", u.Watchdog)
	}
	for _, a := range u.Args {
		if strings.ContainsAny(a, "\n\r\x00") {
			bad("Args", "%q holds a line break or NUL", a)
		}
	}
	return p.Err()
}

// CheckSandbox reports every path of u that the unit's sandbox hides from
// the service (Hidden): the binary, the directories, the environment file
// and the files the daemon's flags name. A unit systemd runs must pass.
func (u Unit) CheckSandbox() error {
	var p config.Problems
	bad := p.Add
	for field, path := range map[string]string{"Binary": u.Binary, "DataDir": u.DataDir, "ModelsDir": u.ModelsDir, "EnvFile": u.EnvFile} {
		if why := Hidden(path); why != "" {
			bad(field, "%s", why)
		}
	}
	for i, a := range u.Args {
		for _, f := range pathFlags {
			v, ok := strings.CutPrefix(a, f+"=")
			if !ok && a == f && i+1 < len(u.Args) {
				v, ok = u.Args[i+1], true
			}
			if ok && filepath.IsAbs(v) {
				if why := Hidden(v); why != "" {
					bad("Args", "%s %s", f, why)
				}
			}
		}
	}
	return p.Err()
}

// pathFlags are the daemons' flags that name a file the service reads.
var pathFlags = []string{"--config", "--engines", "--tls-cert", "--tls-key", "--ssh-config"}

// Hidden says why the unit's sandbox keeps the service from path ("":
// it does not): ProtectHome=yes hides /home, /root and /run/user;
// PrivateTmp=yes gives the service a /tmp and /var/tmp of its own.
func Hidden(path string) string {
	for _, h := range []struct{ dir, how string }{
		{"/home", "ProtectHome=yes hides /home"}, {"/root", "ProtectHome=yes hides /root"}, {"/run/user", "ProtectHome=yes hides /run/user"},
		{"/tmp", "PrivateTmp=yes gives the service a /tmp of its own"}, {"/var/tmp", "PrivateTmp=yes gives the service a /var/tmp of its own"},
	} {
		if path == h.dir || strings.HasPrefix(path, h.dir+"/") {
			return fmt.Sprintf("%q is under %s, which the service cannot see (%s): put it elsewhere (e.g. under /etc/apiary or /var/lib/apiary)", path, h.dir, h.how)
		}
	}
	return ""
}

func validUser(s string) bool {
	if s == "" || len(s) > 32 {
		return false
	}
	for i, c := range s {
		switch {
		case c >= 'a' && c <= 'z', c == '_':
		case (c >= '0' && c <= '9') || c == '-':
			if i == 0 {
				return false
			}
		default:
			return false
		}
	}
	return true
}

// ExecArgs is the command line ExecStart runs: the binary, the role, the
// directories, then Args.
func (u Unit) ExecArgs() []string {
	args := []string{u.Binary, string(u.Role), "--data-dir", u.DataDir}
	if u.ModelsDir != "" {
		args = append(args, "--models-dir", u.ModelsDir)
	}
	return append(args, u.Args...)
}

// Render is the unit file's text. u must be valid (Validate).
func (u Unit) Render() string {
	var b strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&b, format+"\n", a...) }
	writable := u.DataDir
	if u.ModelsDir != "" {
		writable += " " + u.ModelsDir
	}
	w("# Written by `apiary service install %s`; `apiary service uninstall %s` removes it.", u.Role, u.Role)
	w("# Tokens go in %s (mode 0600), never in this file.", u.EnvFile)
	w("[Unit]")
	switch u.Role {
	case Queen:
		w("Description=apiary queen (orchestrator: pool registry, worker lifecycle, OpenAI endpoint)")
	case Hive:
		w("Description=apiary hive (pool manager: this node's workers)")
	}
	w("Documentation=https://github.com/apiary-llm/apiary/blob/main/docs/deploy.md")
	w("Wants=network-online.target")
	w("After=network-online.target")
	w("")
	w("[Service]")
	w("Type=notify")
	w("NotifyAccess=main")
	if u.Watchdog > 0 {
		w("WatchdogSec=%d", seconds(u.Watchdog))
	}
	w("ExecStart=%s", execLine(u.ExecArgs()))
	if u.Reload {
		w("ExecReload=/bin/kill -HUP $MAINPID")
	}
	w("EnvironmentFile=%s", u.EnvFile)
	w("User=%s", u.User)
	w("Group=%s", u.User)
	w("Restart=on-failure")
	w("RestartSec=5")
	w("# SIGTERM to the main process alone: it stops its own children (a hive")
	w("# its workers, a queen the hives it started) in order; what is left")
	w("# when TimeoutStopSec ends is SIGKILLed.")
	w("KillMode=mixed")
	w("KillSignal=SIGTERM")
	w("TimeoutStopSec=%d", seconds(u.StopTimeout))
	w("LimitNOFILE=65536")
	w("")
	w("NoNewPrivileges=yes")
	w("ProtectSystem=strict")
	w("ProtectHome=yes")
	w("PrivateTmp=yes")
	w("ReadWritePaths=%s", writable)
	w("ProtectKernelTunables=yes")
	w("ProtectKernelModules=yes")
	w("ProtectKernelLogs=yes")
	w("ProtectControlGroups=yes")
	w("ProtectClock=yes")
	w("ProtectHostname=yes")
	w("RestrictSUIDSGID=yes")
	w("RestrictRealtime=yes")
	w("RestrictNamespaces=yes")
	w("LockPersonality=yes")
	w("RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK")
	w("CapabilityBoundingSet=")
	w("AmbientCapabilities=")
	w("UMask=0027")
	if u.Role == Hive {
		w("# Workers use the GPUs: the hive keeps the host's /dev (no PrivateDevices).")
	}
	w("")
	w("[Install]")
	w("WantedBy=multi-user.target")
	return b.String()
}

func seconds(d time.Duration) int64 { return int64((d + time.Second - 1) / time.Second) }

// execLine quotes args for ExecStart: a word of safe characters stays as
// it is, any other in double quotes with \ and " escaped; % and $ are
// doubled everywhere (systemd's specifiers and variables).
func execLine(args []string) string {
	out := make([]string, len(args))
	for i, a := range args {
		a = strings.NewReplacer("%", "%%", "$", "$$").Replace(a)
		if a != "" && strings.Trim(a, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=:,@+%$") == "" {
			out[i] = a
			continue
		}
		out[i] = `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(a) + `"`
	}
	return strings.Join(out, " ")
}
