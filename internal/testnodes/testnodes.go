// Package testnodes gives the multi-node tests other machines on this one:
// network namespaces on a bridge, each running Debian's sshd
// (scripts/netns.sh), which the root namespace (where the queen runs)
// reaches over SSH with the system ssh. The namespaces share the file
// system, so each node gets a directory of its own (Dir): its data dir
// (sshd sets XDG_DATA_HOME, with the test model tiny.gguf in its models
// dir) and room for an install dir.
//
// Each test package that uses them has its own prefix and subnet, so that
// packages tested in parallel do not meet; they need root, iproute2,
// openssh-server and openssh-client (scripts/deps.sh).
package testnodes

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/apiary-llm/apiary/internal/testbin"
	"github.com/apiary-llm/apiary/internal/testmodel"
)

// Nodes are n nodes that scripts/netns.sh set up.
type Nodes struct {
	prefix, subnet string
	n              int
	state          string // scripts/netns.sh's state dir
}

// Lazy sets the nodes up on the first Get of a test binary and takes them
// down on Close (from TestMain).
type Lazy struct {
	Prefix string // 1-6 lowercase letters or digits: names namespaces and links
	Subnet string // e.g. "10.78.0": the bridge is .1, node i is .(i+1)
	N      int

	once  sync.Once
	nodes *Nodes
	err   error
}

// Get returns the nodes, setting them up on the first call; a setup that
// failed fails t. At the end of t, whatever t left running on the nodes
// (besides sshd) is killed and every link is up again.
func (l *Lazy) Get(t testing.TB) *Nodes {
	t.Helper()
	l.once.Do(func() { l.nodes, l.err = up(l.Prefix, l.Subnet, l.N) })
	if l.err != nil {
		t.Fatalf("multi-node setup: %v (needs iproute2, openssh-server, openssh-client; see scripts/deps.sh)", l.err)
	}
	t.Cleanup(l.nodes.KillProcesses)
	return l.nodes
}

// Close takes the nodes down if Get set them up.
func (l *Lazy) Close() error {
	if l.nodes == nil {
		return nil
	}
	out, err := exec.Command("bash", script(), "down", l.nodes.prefix, l.nodes.state).CombinedOutput()
	os.RemoveAll(l.nodes.state)
	if err != nil {
		return fmt.Errorf("netns.sh down: %w\n%s", err, out)
	}
	return nil
}

// script is scripts/netns.sh from a test's package directory
// (internal/<package>).
func script() string { return filepath.Join("..", "..", "scripts", "netns.sh") }

func up(prefix, subnet string, n int) (*Nodes, error) {
	if os.Getuid() != 0 {
		return nil, errors.New("the multi-node tests need root for ip netns and sshd (CI runs as root)")
	}
	dir, err := os.MkdirTemp("", "apiary-netns-")
	if err != nil {
		return nil, err
	}
	nodes := &Nodes{prefix: prefix, subnet: subnet, n: n, state: dir}
	// A previous run killed midway may have left its namespaces.
	_ = exec.Command("bash", script(), "down", prefix, dir).Run()
	if out, err := exec.Command("bash", script(), "up", prefix, strconv.Itoa(n), dir, subnet).CombinedOutput(); err != nil {
		return nodes, fmt.Errorf("scripts/netns.sh up: %w\n%s", err, out)
	}
	for i := 1; i <= n; i++ {
		models := filepath.Join(nodes.Dir(i), "data", "apiary", "models")
		if err := os.MkdirAll(models, 0o755); err != nil {
			return nodes, err
		}
		if err := testmodel.WriteFile(filepath.Join(models, "tiny.gguf"), testmodel.Options{}); err != nil {
			return nodes, err
		}
	}
	return nodes, nil
}

// HostIP is the root namespace's address on the bridge: where a queen
// listens that the nodes reach.
func (c *Nodes) HostIP() string { return c.subnet + ".1" }

// Addr is node i's address (i from 1).
func (c *Nodes) Addr(i int) string { return fmt.Sprintf("%s.%d", c.subnet, i+1) }

// Namespace is node i's network namespace.
func (c *Nodes) Namespace(i int) string { return fmt.Sprintf("%s%d", c.prefix, i) }

// Link is the root side of node i's link: down, the node is cut off.
func (c *Nodes) Link(i int) string { return fmt.Sprintf("%sh%d", c.prefix, i) }

// Dir is node i's own directory.
func (c *Nodes) Dir(i int) string { return filepath.Join(c.state, fmt.Sprintf("node%d", i)) }

// Marker is in the command line of every process run from node i's
// directory (its install dir and data dir are in it), and of the ssh
// clients that start them.
func (c *Nodes) Marker(i int) string { return c.Dir(i) + "/" }

// SSHConfig is one of scripts/netns.sh's client configurations:
// ssh_config, ssh_config_nohostkeys or ssh_config_wrongkey.
func (c *Nodes) SSHConfig(name string) string { return filepath.Join(c.state, name) }

// SSHDPID is the pid of node i's sshd.
func (c *Nodes) SSHDPID(i int) (int, error) {
	b, err := os.ReadFile(filepath.Join(c.Dir(i), "sshd.pid"))
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

// Leftovers lists the command lines of what still runs of apiary on node
// i (ssh clients to it included: their command lines name its install
// dir).
func (c *Nodes) Leftovers(i int) []string {
	var cmds []string
	for _, m := range []string{c.Marker(i) + "bin/", c.Marker(i) + "data/"} {
		for _, pid := range testbin.Matching(m) {
			cmds = append(cmds, testbin.Cmdline(pid))
		}
	}
	return cmds
}

// Proc is an apiary process that runs on a node.
type Proc struct {
	PID  int
	Role string // argv[1]: "hive" or "worker"
	Cmd  string // its command line
}

// Apiary lists the apiary processes (hives, workers) that run in node
// i's namespace, by pid; sshd and its sessions are left out.
func (c *Nodes) Apiary(i int) ([]Proc, error) {
	out, err := exec.Command("ip", "netns", "pids", c.Namespace(i)).Output()
	if err != nil {
		return nil, fmt.Errorf("ip netns pids %s: %w", c.Namespace(i), err)
	}
	var procs []Proc
	for _, f := range strings.Fields(string(out)) {
		pid, err := strconv.Atoi(f)
		if err != nil || !testbin.Alive(pid) {
			continue
		}
		b, err := os.ReadFile("/proc/" + f + "/cmdline")
		if err != nil {
			continue // gone meanwhile
		}
		argv := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if len(argv) < 2 || filepath.Base(argv[0]) != "apiary" {
			continue
		}
		procs = append(procs, Proc{PID: pid, Role: argv[1], Cmd: strings.Join(argv, " ")})
	}
	slices.SortFunc(procs, func(a, b Proc) int { return a.PID - b.PID })
	return procs, nil
}

// KillProcesses ends whatever a test left on the nodes besides sshd, so
// the next test finds the hive ports free, and sets every link up again.
func (c *Nodes) KillProcesses() {
	for i := 1; i <= c.n; i++ {
		for _, pid := range testbin.Matching(c.Marker(i)) {
			if !strings.Contains(testbin.Cmdline(pid), "sshd") {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
	for i := 1; i <= c.n; i++ {
		_ = exec.Command("ip", "link", "set", c.Link(i), "up").Run()
	}
}
