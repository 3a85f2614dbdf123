package main

import (
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/hive"
	"github.com/apiary-llm/apiary/internal/queen"
	"github.com/apiary-llm/apiary/internal/testbin"
)

// bootLimit bounds each step of the systemd test: the boot, one systemctl
// call, the queen's start.
const bootLimit = 60 * time.Second

// TestProcessServiceInstallBootsUnderSystemd (issue #34): `apiary service
// install`, run from a binary under /tmp, works under a real systemd as
// PID 1. systemd-nspawn boots this machine's own root (a private bind of
// /, with --volatile=overlay: every write lands in a tmpfs that goes with
// the container, so the host's /etc, /usr/local and /var/lib stay as they
// are) in a network namespace of its own (the units' 127.0.0.1:8080 and
// :9200 are the container's). In it:
//
//  1. `apiary service install queen --watchdog 2s`, then the systemctl
//     line it prints: the unit is active as its own user and GET /health
//     answers 200 at its address.
//  2. `apiary service install hive --now`: active, registered at the
//     queen; restarted with a model in its models directory, `apiary
//     infer` gets an answer from a CPU worker that the sandboxed hive
//     started; `systemctl stop` stops the hive with
//     success and its worker with it (the row STOPPED, no process left).
//  3. The queen stopped with SIGSTOP misses its watchdog pings: systemd
//     kills it and starts it again, and it answers.
//  4. `systemctl stop` leaves the queen inactive, not failed.
//
// It found that the data directory's parent was created 0750 root:root,
// which kept the queen out of its data directory.
//
// Needs root (systemd-nspawn) and systemd-nspawn, nsenter, unshare and
// curl (scripts/deps.sh installs systemd-container and curl).
func TestProcessServiceInstallBootsUnderSystemd(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test boots systemd in a container with systemd-nspawn, which needs root: run it as root (CI does)")
	}
	nspawn, err := exec.LookPath("systemd-nspawn")
	if err != nil {
		t.Fatalf("this test boots systemd with systemd-nspawn (scripts/deps.sh installs systemd-container): %v", err)
	}
	for _, tool := range []string{"unshare", "nsenter", "curl"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("this test needs %s (util-linux; curl: scripts/deps.sh): %v", tool, err)
		}
	}

	// The binary and its libraries, under /tmp as in a checkout there; the
	// container sees this directory at the same path (--bind-ro), since
	// its own /tmp is a fresh tmpfs.
	bin, err := filepath.EvalSymlinks(testbin.Path(t))
	if err != nil {
		t.Fatal(err)
	}
	checkout := tmpDir(t, "apiary-service-boot-")
	libs, _ := filepath.Glob(filepath.Join(filepath.Dir(bin), "lib*.so"))
	for _, src := range append(libs, bin) {
		copyFile(t, src, filepath.Join(checkout, filepath.Base(src)))
	}
	apiaryIn := filepath.Join(checkout, "apiary")

	c := bootSystemd(t, nspawn, checkout)
	must := func(args ...string) string {
		t.Helper()
		out, err := c.run("-a", args...)
		if err != nil {
			t.Fatalf("%s: %v\n%s\n%s", strings.Join(args, " "), err, out, c.journal("apiary-queen.service", "apiary-hive.service"))
		}
		return out
	}
	active := func(unit, want string) {
		t.Helper()
		if state, _ := c.run("-a", "systemctl", "is-active", unit); state != want {
			t.Fatalf("systemctl is-active %s: %q, want %s\n%s", unit, state, want, c.journal(unit))
		}
	}
	// Type=notify: systemctl start returns once the daemon said READY=1,
	// so it answers then; no retry.
	health := func(addr string) {
		t.Helper()
		url := "http://" + addr + "/health"
		out, err := c.run("-n", "curl", "-sS", "-m", "10", "-w", "\n%{http_code}", url)
		if err != nil || !strings.HasSuffix(out, "\n200") || !strings.Contains(out, `"status":"ok"`) {
			t.Fatalf("GET %s in the container: %v\n%s\n%s", url, err, out, c.journal("apiary-queen.service", "apiary-hive.service"))
		}
	}

	// 1. The queen, as the install tells a person to start it.
	out := must(apiaryIn, "service", "install", "queen", "--watchdog", "2s")
	line := ""
	for l := range strings.Lines(out) {
		if strings.Contains(l, "systemctl enable --now") {
			line = strings.TrimSpace(l)
		}
	}
	if line != "systemctl daemon-reload && systemctl enable --now apiary-queen.service" {
		t.Fatalf("install printed no systemctl line to run (or another one: %q):\n%s", line, out)
	}
	must("sh", "-c", line)
	active("apiary-queen.service", "active")
	if user := must("systemctl", "show", "-P", "User", "apiary-queen.service"); user != "apiary" {
		t.Errorf("the queen runs as %q, want the user apiary", user)
	}
	health(queen.DefaultAddr)

	// 2. The hive with --now, a worker it starts in its sandbox, its stop.
	must(apiaryIn, "service", "install", "hive", "--now")
	active("apiary-hive.service", "active")
	health(hive.DefaultAddr)
	if pools := must(apiaryIn, "pools", "ls"); !strings.Contains(pools, "healthy") {
		t.Fatalf("the hive is not registered at the queen:\n%s", pools)
	}
	// A model in the hive's models directory; the restart has the hive
	// register again with it in its list.
	must("sh", "-c", apiaryIn+" models testmodel /var/lib/apiary/models/tiny.gguf && chown apiary:apiary /var/lib/apiary/models/tiny.gguf")
	must("systemctl", "restart", "apiary-hive.service")
	if answer := must(apiaryIn, "infer", "--model", "tiny", "--prompt", "hi", "--max-tokens", "4"); strings.TrimSpace(answer) == "" {
		t.Fatal("apiary infer under systemd: no answer")
	}
	must("systemctl", "stop", "apiary-hive.service")
	active("apiary-hive.service", "inactive")
	if result := must("systemctl", "show", "-P", "Result", "apiary-hive.service"); result != "success" {
		t.Errorf("the hive's stop: Result=%s, want success\n%s", result, c.journal("apiary-hive.service"))
	}
	if rows := must(apiaryIn, "workers", "ls"); !strings.Contains(rows, "STOPPED") || strings.Contains(rows, "RUNNING") {
		t.Errorf("after the hive's stop its worker's row is not STOPPED:\n%s", rows)
	}
	// The container's processes from its /proc (procps may be missing).
	procs := must("sh", "-c", `for p in /proc/[0-9]*; do tr '\0' ' ' < $p/cmdline; echo; done`)
	for l := range strings.Lines(procs) {
		if strings.Contains(l, "apiary worker") {
			t.Errorf("a worker outlived its hive's stop: %s", l)
		}
	}

	// 3. The watchdog: a queen that stops answering is killed and started
	// again (WatchdogSec=2, RestartSec=5).
	pid := must("systemctl", "show", "-P", "MainPID", "apiary-queen.service")
	must("kill", "-STOP", pid)
	deadline := time.Now().Add(bootLimit)
	for {
		now := must("systemctl", "show", "-P", "MainPID", "apiary-queen.service")
		state, _ := c.run("-a", "systemctl", "is-active", "apiary-queen.service")
		if now != pid && now != "0" && state == "active" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the stopped queen (pid %s) was not restarted within %s:\n%s", pid, bootLimit, c.journal("apiary-queen.service"))
		}
		time.Sleep(200 * time.Millisecond) // systemd's own timers: no event reaches the test
	}
	// The killed queen's goroutine dump (SIGABRT) fills the journal's
	// tail: grep it for systemd's own line.
	if out, err := c.run("-a", "journalctl", "--no-pager", "-u", "apiary-queen.service", "--grep", "Watchdog timeout"); err != nil {
		t.Errorf("the restart was not the watchdog's: %v %s\n%s", err, out, c.journal("apiary-queen.service"))
	}
	if n := must("systemctl", "show", "-P", "NRestarts", "apiary-queen.service"); n != "1" {
		t.Errorf("NRestarts=%s, want 1", n)
	}
	health(queen.DefaultAddr)

	// 4. A clean stop.
	must("systemctl", "stop", "apiary-queen.service")
	active("apiary-queen.service", "inactive")
}

// container is a systemd booted by systemd-nspawn; pid is its PID 1 as
// this machine sees it.
type container struct {
	t   *testing.T
	pid string
}

// run runs a command in the container's namespaces: ns "-a" all of them
// (systemctl talks to the container's systemd), "-n" its network alone
// (a tool of this machine on the container's loopback).
func (c *container) run(ns string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(c.t.Context(), bootLimit)
	defer cancel()
	out, err := exec.CommandContext(ctx, "nsenter", append([]string{"-t", c.pid, ns, "--"}, args...)...).CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// journal is what the container's journal holds of the units, for a
// failure.
func (c *container) journal(units ...string) string {
	args := []string{"journalctl", "--no-pager", "-n", "60"}
	for _, u := range units {
		args = append(args, "-u", u)
	}
	out, _ := c.run("-a", args...)
	return out
}

// bootSystemd boots systemd as PID 1 of a container over this machine's
// root and waits until it is running; the test's end powers it off.
// basic.target: the services this machine enables (a database, sshd) stay
// off, the unit under test is started by hand.
func bootSystemd(t *testing.T, nspawn, bindRO string) *container {
	t.Helper()
	// root is where / is bound, in the mount namespace of the container
	// alone; it is removed with os.Remove, which takes an empty directory
	// only (never RemoveAll: were the bind ever seen here, that would
	// remove this machine's files).
	root, err := os.MkdirTemp("/tmp", "apiary-nspawn-root-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.Remove(root); err != nil {
			t.Errorf("remove the container's root mount point: %v", err)
		}
	})
	name := "apiary-test-" + strconv.Itoa(os.Getpid())
	logPath := filepath.Join(t.TempDir(), "console")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	console := func() string {
		b, _ := os.ReadFile(logPath)
		if len(b) > 4000 {
			b = b[len(b)-4000:]
		}
		return string(b)
	}
	// The container's cgroups go under one of its own in each hierarchy
	// systemd uses: with --keep-unit nspawn makes payload/ and supervisor/
	// where it starts, which two containers started from one cgroup would
	// share.
	cgroups := ownCgroups(t, name)
	// unshare gives the bind of / a mount namespace of its own (gone with
	// the container); sh moves itself into the cgroups and execs nspawn,
	// so cmd's pid is nspawn's.
	script := `for d in $CGROUPS; do echo $$ > "$d/cgroup.procs" || exit 1; done; mount --bind / "$0" && exec "$@"`
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c", script, root,
		nspawn, "--directory", root, "--volatile=overlay", "--private-network", "--bind-ro="+bindRO,
		"--machine", name, "--register=no", "--keep-unit", "--console=passive", "--boot", "--", "systemd.unit=basic.target")
	cmd.Env = append(os.Environ(), "CGROUPS="+strings.Join(cgroups, " "))
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		// SIGTERM: nspawn asks the container's systemd to power off.
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(bootLimit):
			_ = cmd.Process.Kill()
			<-exited
			t.Errorf("the container did not power off within %s:\n%s", bootLimit, console())
		}
		// nspawn leaves its propagation directory behind when it runs
		// without a systemd of its own.
		os.RemoveAll(filepath.Join("/run/systemd/nspawn/propagate", name))
	})

	deadline := time.Now().Add(bootLimit)
	c := &container{t: t}
	for c.pid == "" {
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("systemd-nspawn exited before systemd booted: %v\n%s", err, console())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no systemd in the container within %s:\n%s", bootLimit, console())
		}
		// Up when its private socket is there (systemctl's way in); no
		// event says when nspawn has forked or systemd has bound it.
		if pid := childNamed(cmd.Process.Pid, "systemd"); pid != "" {
			if _, err := os.Stat(filepath.Join("/proc", pid, "root", "run", "systemd", "private")); err == nil {
				c.pid = pid
				break
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	state, err := c.run("-a", "systemctl", "is-system-running", "--wait")
	if state != "running" && state != "degraded" {
		failed, _ := c.run("-a", "systemctl", "--failed", "--no-pager")
		t.Fatalf("the container's systemd: %q (%v)\n%s\n%s", state, err, failed, console())
	}
	return c
}

// ownCgroups creates a cgroup named name below this process's own in the
// unified hierarchy and in systemd's named v1 one (where mounted), and
// removes them, with what the container left in them, at the test's end.
func ownCgroups(t *testing.T, name string) []string {
	t.Helper()
	mountinfo, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	paths := map[string]string{} // hierarchy ("" unified, "name=systemd") → this process's path
	for l := range strings.Lines(string(self)) {
		f := strings.SplitN(strings.TrimSpace(l), ":", 3)
		if len(f) == 3 && (f[1] == "" || f[1] == "name=systemd") {
			paths[f[1]] = f[2]
		}
	}
	var dirs []string
	for l := range strings.Lines(string(mountinfo)) {
		pre, post, ok := strings.Cut(l, " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 5 || len(g) < 3 {
			continue
		}
		hier := ""
		switch {
		case g[0] == "cgroup2":
		case g[0] == "cgroup" && strings.Contains(","+g[2]+",", ",name=systemd,"):
			hier = "name=systemd"
		default:
			continue
		}
		own, ok := paths[hier]
		if !ok {
			continue
		}
		d := filepath.Join(f[4], strings.TrimPrefix(own, f[3]), name)
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatalf("a cgroup of the container's own: %v", err)
		}
		dirs = append(dirs, d)
		t.Cleanup(func() { removeCgroup(t, d) })
	}
	if len(dirs) == 0 {
		t.Fatal("no cgroup hierarchy for the container (no cgroup2 mount and no name=systemd one in /proc/self/mountinfo)")
	}
	return dirs
}

// removeCgroup removes the cgroup d and the empty ones below it, deepest
// first (a cgroup is removed with rmdir, never by removing its files).
func removeCgroup(t *testing.T, d string) {
	entries, _ := os.ReadDir(d)
	for _, e := range entries {
		if e.IsDir() {
			removeCgroup(t, filepath.Join(d, e.Name()))
		}
	}
	if err := syscall.Rmdir(d); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Errorf("remove the container's cgroup %s: %v", d, err)
	}
}

// childNamed is the pid of a child of pid whose command is comm, or "".
func childNamed(pid int, comm string) string {
	p := strconv.Itoa(pid)
	kids, err := os.ReadFile(filepath.Join("/proc", p, "task", p, "children"))
	if err != nil {
		return ""
	}
	for _, k := range strings.Fields(string(kids)) {
		if c, err := os.ReadFile(filepath.Join("/proc", k, "comm")); err == nil && strings.TrimSpace(string(c)) == comm {
			return k
		}
	}
	return ""
}

// tmpDir is a directory under /tmp itself (not $TMPDIR), removed at the
// test's end.
func tmpDir(t *testing.T, pattern string) string {
	t.Helper()
	d, err := os.MkdirTemp("/tmp", pattern)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.RemoveAll(d); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Errorf("remove %s: %v", d, err)
		}
	})
	return d
}

func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}
