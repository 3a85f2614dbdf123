//go:build !race

package sshnode_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/keeper"
	"github.com/apiary-llm/apiary/internal/sshnode"
	"github.com/apiary-llm/apiary/internal/testbin"
	"github.com/apiary-llm/apiary/internal/testnodes"
)

// A real multi-node cluster on one machine: three network namespaces on a
// bridge, each running Debian's sshd (internal/testnodes), the queen in
// the root namespace starting hives there over SSH with the system ssh.

const (
	subnet  = "10.78.0"
	queenIP = subnet + ".1"
	timeout = 3 * time.Second // the queen's --heartbeat-timeout
)

var tokens = []string{"APIARY_API_TOKEN=test-api-0123456789", "APIARY_ADMIN_TOKEN=test-admin-0123456789", "APIARY_CLUSTER_TOKEN=test-cluster-0123456789"}

var (
	lazyNodes = testnodes.Lazy{Prefix: "apn", Subnet: subnet, N: 3}
	cluster   *testnodes.Nodes // set by nodes
)

func TestMain(m *testing.M) {
	code := m.Run()
	if err := lazyNodes.Close(); err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
	testbin.Cleanup()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// nodes sets up the namespaces once per test binary (they need root).
func nodes(t *testing.T) *testnodes.Nodes {
	t.Helper()
	cluster = lazyNodes.Get(t)
	return cluster
}

func nodeAddr(i int) string   { return cluster.Addr(i) }
func nodeDir(i int) string    { return cluster.Dir(i) }
func nodeMarker(i int) string { return cluster.Marker(i) }

// freePort is a free TCP port on the queen's address.
func freePort(t *testing.T) int {
	t.Helper()
	return testbin.FreePortOn(t, queenIP)
}

type queen struct {
	*testbin.Proc
	url    string
	c      *keeper.Client
	caFile string // the CA of a queen serving TLS, for the apiary CLI (--ca-file)
}

func startQueen(t *testing.T, sshConfig string, env []string, extra ...string) *queen {
	t.Helper()
	return startQueenFrom(t, testbin.Path(t), sshConfig, env, extra...)
}

// startQueenFrom starts the queen from the apiary at bin: the one it
// copies to nodes.
func startQueenFrom(t *testing.T, bin, sshConfig string, env []string, extra ...string) *queen {
	t.Helper()
	state := nodes(t)
	addr := net.JoinHostPort(queenIP, strconv.Itoa(freePort(t)))
	args := []string{"queen", "--addr", addr, "--data-dir", filepath.Join(t.TempDir(), "queen"),
		"--ssh-config", state.SSHConfig(sshConfig), "--ssh-timeout", "2s",
		"--heartbeat-timeout", timeout.String(), "--flush-interval", "100ms", "--hive-stop-timeout", "20s",
		"--hive-arg=--worker-threads=1", "--hive-arg=--stop-grace=2s", "--hive-arg=--shutdown-ack=1s", "--log-json"}
	p := testbin.StartCmd(t, "queen", append(append([]string{}, tokens...), env...), bin, append(args, extra...)...)
	rec, _ := p.Lines.Wait(t, 0, "queen serving", nil)
	url := rec.Attrs["url"] // https:// with --tls-cert
	c := keeper.NewClient(url, "test-admin-0123456789", "test-cluster-0123456789")
	c.SetTimeout(2 * time.Minute)
	return &queen{Proc: p, url: url, c: c}
}

// addNode adds node i as name and waits until its hive registered.
func (q *queen) addNode(t *testing.T, name string, i int) {
	t.Helper()
	n, err := q.c.AddNode(t.Context(), api.AddNodeRequest{Name: name, SSH: "root@" + nodeAddr(i), InstallDir: filepath.Join(nodeDir(i), "bin")})
	if err != nil {
		t.Fatalf("add node %s: %v", name, err)
	}
	if n.Name != name || n.SSH != "root@"+nodeAddr(i) {
		t.Errorf("added node %+v", n)
	}
	q.Lines.Wait(t, 0, "pool status changed", map[string]string{"pool_id": name, "to": "healthy"})
}

// infer runs `apiary infer` against the queen and returns the lifecycle
// rows of the model afterwards.
func (q *queen) infer(t *testing.T, node string) {
	t.Helper()
	args := []string{"infer", "--model", "tiny", "--prompt", "hello", "--max-tokens", "8", "--queen", q.url}
	if node != "" {
		args = append(args, "--node", node)
	}
	if q.caFile != "" {
		args = append(args, "--ca-file", q.caFile)
	}
	k := testbin.Start(t, "keeper", tokens, args...)
	if code := k.Wait(t); code != 0 {
		t.Fatalf("apiary infer --node %q: exit %d; stderr:\n%s", node, code, k.Lines.String())
	}
	if k.Stdout() == "" {
		t.Errorf("apiary infer --node %q: no answer", node)
	}
}

func (q *queen) runningPools(t *testing.T) map[string]int {
	t.Helper()
	rows, err := q.c.Workers(t.Context(), keeper.WorkerFilter{Status: "RUNNING"})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, r := range rows {
		out[r.PoolID]++
	}
	return out
}

func TestSSHNode_AddProbesFirst_ClearErrors(t *testing.T) {
	state := nodes(t)
	q := startQueen(t, "ssh_config", nil)
	for _, tc := range []struct {
		name, ssh string
		code      string
	}{
		{"refused", "root@" + nodeAddr(1) + ":2222", "ssh_unreachable"},
		{"option-injection", "root@-oProxyCommand=touch", "invalid_request"},
	} {
		_, err := q.c.AddNode(t.Context(), api.AddNodeRequest{Name: tc.name, SSH: tc.ssh})
		var ae *keeper.APIError
		if !errors.As(err, &ae) || ae.Code != tc.code {
			t.Errorf("%s: %v, want %s", tc.name, err, tc.code)
		}
	}
	// A node whose sshd accepts connections but never speaks: timeout.
	sshd := sshdPID(t, 3)
	_ = syscall.Kill(sshd, syscall.SIGSTOP)
	_, err := q.c.AddNode(t.Context(), api.AddNodeRequest{Name: "frozen", SSH: "root@" + nodeAddr(3)})
	_ = syscall.Kill(sshd, syscall.SIGCONT)
	if ae := new(keeper.APIError); !errors.As(err, &ae) || ae.Code != "ssh_timeout" {
		t.Errorf("frozen sshd: %v, want ssh_timeout", err)
	}

	// Host keys are checked against known_hosts; keys are never guessed.
	unknown := startQueen(t, "ssh_config_nohostkeys", nil)
	_, err = unknown.c.AddNode(t.Context(), api.AddNodeRequest{Name: "n1", SSH: "root@" + nodeAddr(1)})
	if ae := new(keeper.APIError); !errors.As(err, &ae) || ae.Code != "ssh_host_key_unknown" || !strings.Contains(ae.Message, "known_hosts") {
		t.Errorf("unknown host key: %v", err)
	}
	wrong := startQueen(t, "ssh_config_wrongkey", nil)
	_, err = wrong.c.AddNode(t.Context(), api.AddNodeRequest{Name: "n1", SSH: "root@" + nodeAddr(1)})
	if ae := new(keeper.APIError); !errors.As(err, &ae) || ae.Code != "ssh_auth_failed" || !strings.Contains(ae.Message, "authorized_keys") {
		t.Errorf("wrong key: %v", err)
	}
	// No ssh client on the queen's machine.
	noSSH := startQueen(t, "ssh_config", []string{"PATH=" + t.TempDir()})
	_, err = noSSH.c.AddNode(t.Context(), api.AddNodeRequest{Name: "n1", SSH: "root@" + nodeAddr(1)})
	if ae := new(keeper.APIError); !errors.As(err, &ae) || ae.Code != "ssh_client_missing" || !strings.Contains(ae.Message, "openssh-client") {
		t.Errorf("no ssh client: %v", err)
	}
	nodes, err := q.c.Nodes(t.Context())
	if err != nil || len(nodes) != 0 {
		t.Errorf("failed adds saved nodes: %+v %v", nodes, err)
	}
	_ = state
}

func sshdPID(t *testing.T, i int) int {
	t.Helper()
	pid, err := cluster.SSHDPID(i)
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// Checklist (queen): "If not running, use SSH to spawn rbee-hive on remote
// node", "Send inference requests directly to workers", "Relay SSE streams
// from workers to rbee-keeper". A node cut off (link down): its pool turns unhealthy and the
// other nodes serve.
func TestSSHNode_HivesStartedOverSSH_InferenceOnRemotePools_NodeCutOff(t *testing.T) {
	q := startQueen(t, "ssh_config", nil)
	q.addNode(t, "n1", 1)
	q.addNode(t, "n2", 2)
	nodes, err := q.c.Nodes(t.Context())
	if err != nil || len(nodes) != 2 || nodes[0].Hive.State != api.HiveRunning || nodes[1].Hive.NodeAddr != nodeAddr(2) {
		t.Fatalf("nodes: %+v %v", nodes, err)
	}
	hive1 := testbin.AwaitProcess(t, nodeMarker(1), " hive ")
	if s := testbin.Cmdline(hive1); !strings.Contains(s, "--owner queen") || !strings.Contains(s, "--lifeline stdin") || strings.Contains(s, "test-cluster") {
		t.Errorf("remote hive command line: %s", s)
	}

	// apiary infer --node pins the request to that node's pool: a worker
	// is placed on each node in turn (n2's beyond --max-workers 1, as a
	// pinned cold start may be), and an unknown node is a clear error.
	q.infer(t, "n1")
	if got := q.runningPools(t); got["n1"] != 1 || got["n2"] != 0 {
		t.Errorf("after infer --node n1, running workers by pool: %v, want one on n1", got)
	}
	// The node got llama.cpp's libraries and the CPU backends beside
	// apiary: its worker runs that apiary, with a CPU backend from there.
	w1 := testbin.AwaitProcess(t, nodeMarker(1), " worker ")
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", w1))
	want := filepath.Join(nodeDir(1), "bin", "apiary")
	if err != nil || exe != want {
		t.Errorf("worker on n1 runs %q (%v), want %s", exe, err, want)
	}
	if maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", w1)); err != nil ||
		!bytes.Contains(maps, []byte(filepath.Join(nodeDir(1), "bin", "libggml-cpu-"))) ||
		!bytes.Contains(maps, []byte(filepath.Join(nodeDir(1), "bin", "libllama.so"))) {
		t.Errorf("worker on n1 maps no llama.cpp library and CPU backend from the node's bin/ (%v)", err)
	}
	q.infer(t, "n2")
	if got := q.runningPools(t); got["n1"] != 1 || got["n2"] != 1 {
		t.Errorf("after infer --node n2, running workers by pool: %v, want one on each node", got)
	}
	q.infer(t, "")
	if got := q.runningPools(t); got["n1"] != 1 || got["n2"] != 1 {
		t.Errorf("after an unpinned infer, running workers by pool: %v, want still one on each node", got)
	}
	k := testbin.Start(t, "keeper", tokens, "infer", "--queen", q.url, "--model", "tiny", "--prompt", "hi", "--node", "n9")
	if code := k.Wait(t); code == 0 || !strings.Contains(k.Lines.String(), `no pool "n9" is registered`) {
		t.Errorf("infer --node n9: exit %d, want a failure naming the unknown pool; stderr:\n%s", code, k.Lines.String())
	}

	cut := time.Now()
	if out, err := exec.Command("ip", "link", "set", cluster.Link(2), "down").CombinedOutput(); err != nil {
		t.Fatalf("link down: %v %s", err, out)
	}
	rec, _ := q.Lines.Wait(t, 0, "pool status changed", map[string]string{"pool_id": "n2", "to": "unhealthy"})
	t.Logf("pool n2 unhealthy %s after its link went down", time.Since(cut).Round(time.Millisecond))
	_ = rec
	for range 3 {
		q.infer(t, "")
	}
	// Unhealthy, or offline once the queen saw the node's SSH session
	// end (which a slow machine reaches before this request).
	k = testbin.Start(t, "keeper", tokens, "infer", "--queen", q.url, "--model", "tiny", "--prompt", "hi", "--node", "n2")
	if code, out := k.Wait(t), k.Lines.String(); code == 0 || !strings.Contains(out, "pool n2 is unhealthy") && !strings.Contains(out, "pool n2 is offline") {
		t.Errorf("infer --node n2 while it is cut off: exit %d, want a failure saying the pool is unhealthy or offline; stderr:\n%s", code, out)
	}
	rows, err := q.c.Workers(t.Context(), keeper.WorkerFilter{})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		if r.PoolID == "n2" && r.CreatedAt.After(cut) {
			t.Errorf("a worker was placed on the cut-off node: %+v", r)
		}
	}
	// The node's hive lost its queen: its lease ends and it stops its
	// worker, orphaning nothing on the unreachable machine.
	testbin.AwaitGone(t, nodeMarker(2)+"bin/", timeout+5*time.Second)
	testbin.AwaitGone(t, nodeMarker(2)+"data/", timeout+5*time.Second)
	if err := exec.Command("ip", "link", "set", cluster.Link(2), "up").Run(); err != nil {
		t.Fatal(err)
	}
	q.Signal(syscall.SIGTERM)
	if code := q.Wait(t); code != 0 {
		t.Errorf("queen exit %d", code)
	}
	testbin.AwaitGone(t, nodeMarker(1)+"bin/", 30*time.Second)
}

// apiaryWithBackend is testbin's apiary and its libraries, linked into a
// directory of the test's own, with these GPU backend files beside it (a
// fake `make cuda`); it returns the apiary there. bin/ itself stays as
// the other tests expect it.
func apiaryWithBackend(t *testing.T, backend map[string][]byte) string {
	t.Helper()
	src, dir := testbin.Path(t), t.TempDir()
	libs, err := filepath.Glob(filepath.Join(filepath.Dir(src), "lib*.so"))
	if err != nil {
		t.Fatal(err)
	}
	names := []string{filepath.Base(src)}
	for _, l := range libs {
		names = append(names, filepath.Base(l))
	}
	for _, name := range names {
		from, to := filepath.Join(filepath.Dir(src), name), filepath.Join(dir, name)
		if err := os.Link(from, to); err != nil {
			// Another file system: copy.
			b, rerr := os.ReadFile(from)
			if rerr != nil {
				t.Fatal(rerr)
			}
			if err := os.WriteFile(to, b, 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	for name, content := range backend {
		if err := os.WriteFile(filepath.Join(dir, name), content, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return filepath.Join(dir, filepath.Base(src))
}

// Issue #35: GPU nodes added over SSH served nothing, because the GPU
// backend `make cuda` puts beside bin/apiary stayed behind. A queen whose
// apiary has it beside it copies it to the node with apiary, byte for
// byte, into the directory of the apiary the node's hive runs: where the
// hive and its workers look for it (internal/gpu BackendDir).
func TestSSHNode_GPUBackendBesideApiary_ArrivesBesideTheNodesApiary(t *testing.T) {
	nodes(t)
	backend := map[string][]byte{
		sshnode.CUDALibrary:     []byte("\x7fELF fake CUDA backend \x00\x01\xfe\xff"),
		sshnode.CUDAVersionFile: []byte("12.4\n"),
	}
	queenBin := apiaryWithBackend(t, backend)
	q := startQueenFrom(t, queenBin, "ssh_config", nil)
	q.addNode(t, "n1", 1)

	hive := testbin.AwaitProcess(t, nodeMarker(1), " hive ")
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", hive))
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Dir(exe)
	if want := filepath.Join(nodeDir(1), "bin"); dir != want {
		t.Errorf("the node's hive runs %s, want the apiary in %s", exe, want)
	}
	sent, _ := filepath.Glob(filepath.Join(filepath.Dir(queenBin), "lib*"))
	if len(sent) < len(backend)+5 {
		t.Errorf("beside the queen's apiary: %v; want llama.cpp's libraries, CPU backends and the fake CUDA backend", sent)
	}
	for _, from := range sent {
		name := filepath.Base(from)
		want, _ := os.ReadFile(from)
		got, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Errorf("%s did not arrive beside the node's apiary: %v", name, err)
		} else if !bytes.Equal(got, want) {
			t.Errorf("%s on the node differs from the queen's (%d bytes, want %d)", name, len(got), len(want))
		}
	}

	q.Signal(syscall.SIGTERM)
	if code := q.Wait(t); code != 0 {
		t.Errorf("queen exit %d", code)
	}
	testbin.AwaitGone(t, nodeMarker(1)+"bin/", 30*time.Second)
}

// operatorHive starts a hive on node i the way an operator would (not
// through the queen) and waits until it serves a worker.
func operatorHive(t *testing.T, q *queen, i int, pool string) (*testbin.Proc, int) {
	t.Helper()
	h := testbin.StartCmd(t, "operator hive", tokens, "ip", "netns", "exec", cluster.Namespace(i), testbin.Path(t),
		"hive", "--addr", nodeAddr(i)+":9300", "--queen", q.url, "--pool-id", pool, "--worker-threads", "1",
		"--data-dir", filepath.Join(nodeDir(i), "data", "apiary"), "--heartbeat-interval", "300ms", "--log-json")
	q.Lines.Wait(t, 0, "pool status changed", map[string]string{"pool_id": pool, "to": "healthy"})
	resp, err := q.c.StartWorker(t.Context(), "tiny", pool, nil, "operator's worker")
	if err != nil {
		t.Fatal(err)
	}
	q.Lines.Wait(t, 0, "lifecycle row changed", map[string]string{"lifecycle_id": resp.LifecycleID, "to": "RUNNING"})
	return h, testbin.AwaitProcess(t, nodeMarker(i), " worker --worker-id")
}

// sshCluster: hives the queen started over SSH on nodes 1 and 2, each with
// a worker, and an operator's hive on node 3 with a worker.
func sshCluster(t *testing.T) (q *queen, opHive *testbin.Proc, opWorker int) {
	t.Helper()
	q = startQueen(t, "ssh_config", nil)
	q.addNode(t, "n1", 1)
	q.addNode(t, "n2", 2)
	for _, pool := range []string{"n1", "n2"} {
		resp, err := q.c.StartWorker(t.Context(), "tiny", pool, nil, "cascade test")
		if err != nil {
			t.Fatal(err)
		}
		q.Lines.Wait(t, 0, "lifecycle row changed", map[string]string{"lifecycle_id": resp.LifecycleID, "to": "RUNNING"})
	}
	opHive, opWorker = operatorHive(t, q, 3, "op")
	return q, opHive, opWorker
}

func operatorUntouched(t *testing.T, h *testbin.Proc, worker int) {
	t.Helper()
	select {
	case <-h.Done():
		t.Errorf("the operator's hive exited; the queen must not stop what it did not start")
	default:
	}
	if !testbin.Alive(worker) {
		t.Errorf("the operator's worker %d died", worker)
	}
}

// "Cascading shutdown on SIGTERM (SSH to rbee-hive)": SIGTERM to the queen
// stops every hive it started over SSH, each after its workers; the
// operator's hive on the third node is left running.
func TestSSHNode_QueenSIGTERM_EverySSHStartedHiveAndWorkerGone_OperatorHiveUntouched(t *testing.T) {
	q, opHive, opWorker := sshCluster(t)
	q.Signal(syscall.SIGTERM)
	if code := q.Wait(t); code != 0 {
		t.Errorf("queen exit %d after SIGTERM", code)
	}
	// The queen returns only after its hives have exited.
	for i := 1; i <= 2; i++ {
		for _, m := range []string{nodeMarker(i) + "bin/", nodeMarker(i) + "data/"} {
			if left := testbin.Matching(m); len(left) > 0 {
				var cmds []string
				for _, pid := range left {
					cmds = append(cmds, testbin.Cmdline(pid))
				}
				t.Errorf("node %d still runs %v after the queen exited", i, cmds)
			}
		}
	}
	for _, pool := range []string{"n1", "n2"} {
		q.Lines.Wait(t, 0, "hive stopped", map[string]string{"node": pool, "how": "lifeline closed, hive cascaded"})
	}
	if n := strings.Count(q.Lines.String(), `"to":"STOPPED"`); n != 2 {
		t.Errorf("%d worker rows STOPPED during the cascade, want 2", n)
	}
	operatorUntouched(t, opHive, opWorker)
}

// A queen killed with SIGKILL: its ssh sessions end, every hive it started
// over SSH stops its workers and exits within --heartbeat-timeout; the
// operator's hive keeps serving.
func TestSSHNode_QueenSIGKILL_EverySSHStartedHiveAndWorkerGoneWithinTimeout_OperatorHiveUntouched(t *testing.T) {
	q, opHive, opWorker := sshCluster(t)
	killed := time.Now()
	q.Signal(syscall.SIGKILL)
	q.Wait(t)
	for i := 1; i <= 2; i++ {
		testbin.AwaitGone(t, nodeMarker(i)+"bin/", timeout)
		testbin.AwaitGone(t, nodeMarker(i)+"data/", timeout)
	}
	t.Logf("every SSH-started hive and worker gone %s after the queen's SIGKILL", time.Since(killed).Round(time.Millisecond))
	operatorUntouched(t, opHive, opWorker)
}

// Checklist (queen): "Detect if rbee-hive is already running on remote
// node", "If not spawned, do NOT send SIGTERM to rbee-hive". A hive an
// operator started already serves the node's pool: the queen starts none
// there, lists the node's hive as external, and leaves it running when it
// stops.
func TestSSHNode_HiveAlreadyRunning_QueenNeitherStartsNorStopsIt(t *testing.T) {
	q := startQueen(t, "ssh_config", nil)
	opHive, opWorker := operatorHive(t, q, 3, "n3")
	if _, err := q.c.AddNode(t.Context(), api.AddNodeRequest{Name: "n3", SSH: "root@" + nodeAddr(3), InstallDir: filepath.Join(nodeDir(3), "bin")}); err != nil {
		t.Fatal(err)
	}
	q.Lines.Wait(t, 0, "a hive the queen did not start serves the node's pool; not starting one", map[string]string{"node": "n3"})
	nodes, err := q.c.Nodes(t.Context())
	if err != nil || len(nodes) != 1 || nodes[0].Hive.State != api.HiveExternal {
		t.Errorf("nodes: %+v %v", nodes, err)
	}
	if q.Lines.Has("hive started", map[string]string{"node": "n3"}) {
		t.Error("the queen started a second hive on the node")
	}
	q.Signal(syscall.SIGTERM)
	if code := q.Wait(t); code != 0 {
		t.Errorf("queen exit %d", code)
	}
	operatorUntouched(t, opHive, opWorker)
}

// TLS end to end across machines with one throwaway CA made here: the
// queen serves HTTPS on its bridge address; a node added with `nodes add
// --tls-cert --tls-key --node-ca-file` (files on the node) gets a hive and
// workers serving HTTPS with its certificate, which names only the node's
// address (the hive binds it, its workers too, and they call the hive back
// there); `apiary infer --node` answers over https from a worker there;
// plain HTTP to the node's hive and worker is refused; and a node without
// a certificate is refused with 400 while the queen serves TLS.
func TestSSHNode_TLS_QueenHiveWorkerKeeper_ThrowawayCA(t *testing.T) {
	nodes(t)
	ca := testbin.NewCA(t, t.TempDir())
	queenCert := ca.Issue(t, t.TempDir(), queenIP)
	// The node's files where its hive reads them: the namespaces share the
	// file system, so this is a directory of node 1's own.
	nodeTLSDir := filepath.Join(nodeDir(1), "tls")
	if err := os.MkdirAll(nodeTLSDir, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(nodeTLSDir) })
	nodeCert := ca.Issue(t, nodeTLSDir, nodeAddr(1))
	nodeCA := filepath.Join(nodeTLSDir, "cluster-ca.pem")
	b, err := os.ReadFile(ca.File)
	if err == nil {
		err = os.WriteFile(nodeCA, b, 0o644)
	}
	if err != nil {
		t.Fatalf("copy the CA to the node: %v", err)
	}

	q := startQueen(t, "ssh_config", []string{"APIARY_CA_FILE=" + ca.File}, "--tls-cert", queenCert.Cert, "--tls-key", queenCert.Key)
	q.caFile = ca.File
	if want := "https://" + queenIP + ":"; !strings.HasPrefix(q.url, want) {
		t.Fatalf("queen URL %s, want %s…", q.url, want)
	}
	// apiary runs the CLI against the queen, trusting the CA (--ca-file);
	// apiaryJSON decodes what it prints with --json into v.
	apiary := func(args ...string) (stdout, stderr string, code int) {
		t.Helper()
		k := testbin.Start(t, "apiary "+args[0], tokens, append([]string{"--ca-file", ca.File}, append(args, "--queen", q.url)...)...)
		code = k.Wait(t)
		return k.Stdout(), k.Lines.String(), code
	}
	apiaryJSON := func(v any, args ...string) {
		t.Helper()
		out, errOut, code := apiary(append(args, "--json")...)
		if code != 0 {
			t.Fatalf("apiary %s: exit %d\n%s", strings.Join(args, " "), code, errOut)
		}
		if err := json.Unmarshal([]byte(out), v); err != nil {
			t.Fatalf("apiary %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}

	// Without the node's certificate, or with half of it: refused before
	// any SSH, with the reason.
	for _, tc := range []struct{ name, flags, want string }{
		{"n2", "", "the queen serves TLS: give the node's certificate and key"},
		{"n3", "--tls-cert=" + nodeCert.Cert, "tls_cert and tls_key go together"},
	} {
		args := []string{"nodes", "add", tc.name, "--ssh", "root@" + nodeAddr(2), "--install-dir", filepath.Join(nodeDir(2), "bin")}
		if tc.flags != "" {
			args = append(args, tc.flags)
		}
		if _, errOut, code := apiary(args...); code == 0 || !strings.Contains(errOut, tc.want) || !strings.Contains(errOut, "(400 invalid_request)") {
			t.Errorf("nodes add %s %s while the queen serves TLS: exit %d, stderr %q; want a 400 saying %q", tc.name, tc.flags, code, errOut, tc.want)
		}
	}

	out, errOut, code := apiary("nodes", "add", "n1", "--ssh", "root@"+nodeAddr(1), "--install-dir", filepath.Join(nodeDir(1), "bin"),
		"--tls-cert", nodeCert.Cert, "--tls-key", nodeCert.Key, "--node-ca-file", nodeCA)
	if code != 0 {
		t.Fatalf("nodes add n1 with TLS files: exit %d\n%s%s", code, out, errOut)
	}
	q.Lines.Wait(t, 0, "pool status changed", map[string]string{"pool_id": "n1", "to": "healthy"})
	hive := testbin.Cmdline(testbin.AwaitProcess(t, nodeMarker(1), " hive "))
	for _, want := range []string{"--tls-cert " + nodeCert.Cert, "--tls-key " + nodeCert.Key, "--ca-file " + nodeCA, "--queen " + q.url} {
		if !strings.Contains(hive, want) {
			t.Errorf("the node's hive runs %q, want %q in it", hive, want)
		}
	}
	var nodesOut api.NodeList
	apiaryJSON(&nodesOut, "nodes", "ls")
	if len(nodesOut.Nodes) != 1 || nodesOut.Nodes[0].Name != "n1" {
		t.Errorf("nodes after the refused adds: %+v, want only n1", nodesOut.Nodes)
	}
	var pools api.PoolList
	apiaryJSON(&pools, "pools", "ls")
	if len(pools.Pools) != 1 || pools.Pools[0].PoolID != "n1" || pools.Pools[0].Status != "healthy" ||
		pools.Pools[0].Endpoint != "https://"+net.JoinHostPort(nodeAddr(1), "9200") {
		t.Fatalf("pools: %+v, want n1 healthy at https://%s:9200", pools.Pools, nodeAddr(1))
	}

	// The keeper's prompt, over https to the queen, served by a worker on
	// the node over https.
	q.infer(t, "n1")
	var rows api.LifecycleRowList
	apiaryJSON(&rows, "workers", "ls", "--status", "RUNNING")
	if len(rows.Workers) != 1 || rows.Workers[0].PoolID != "n1" || !strings.HasPrefix(rows.Workers[0].URI, "https://"+nodeAddr(1)+":") {
		t.Fatalf("running workers: %+v, want one on n1 at https://%s:…", rows.Workers, nodeAddr(1))
	}
	if w := testbin.Cmdline(testbin.AwaitProcess(t, nodeMarker(1), " worker ")); !strings.Contains(w, "--tls-cert "+nodeCert.Cert) {
		t.Errorf("the node's worker runs %q, want it to serve TLS with the node's certificate", w)
	}

	// Plain HTTP to the node's hive and worker gets nothing served.
	plain := &http.Client{Timeout: 5 * time.Second}
	for _, u := range []string{pools.Pools[0].Endpoint, rows.Workers[0].URI} {
		resp, err := plain.Get("http://" + strings.TrimPrefix(u, "https://") + "/health")
		if errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("plain HTTP to %s: %v; nothing listens there", u, err)
		}
		if err != nil {
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || strings.Contains(string(b), "{") {
			t.Errorf("plain HTTP to %s: %d %s, want it refused", u, resp.StatusCode, b)
		}
	}

	// The queen stops the node's hive and worker over TLS too.
	q.Signal(syscall.SIGTERM)
	if code := q.Wait(t); code != 0 {
		t.Errorf("queen exit %d", code)
	}
	q.Lines.Wait(t, 0, "hive stopped", map[string]string{"node": "n1", "how": "lifeline closed, hive cascaded"})
	if !strings.Contains(q.Lines.String(), `"to":"STOPPED"`) {
		t.Error("the worker's row was not STOPPED during the cascade")
	}
	testbin.AwaitGone(t, nodeMarker(1)+"bin/", 30*time.Second)
}

// Ephemeral `apiary infer --node NAME --ssh USER@HOST`: no queen answers,
// so the keeper starts one (on the address the node sees, with tokens it
// makes up) that starts the node's hive over SSH; the answer comes from a
// worker on the node, and afterwards nothing of it runs on either side and
// its throwaway data dir is gone. A node ssh cannot reach is a clear
// error with nothing left behind, and --node without --ssh says to give it.
func TestSSHNode_EphemeralInferNode_HiveOverSSH_NothingLeftBehind(t *testing.T) {
	state := nodes(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	free := "http://" + ln.Addr().String() // nothing answers there: ephemeral mode
	ln.Close()
	tmp := t.TempDir()
	env := []string{"TMPDIR=" + tmp, "APIARY_API_TOKEN=", "APIARY_ADMIN_TOKEN=", "APIARY_CLUSTER_TOKEN="}
	infer := func(ssh string, extra ...string) *testbin.Proc {
		t.Helper()
		args := []string{"infer", "--queen", free, "--model", "tiny", "--prompt", "hello", "--max-tokens", "8", "--node", "n1",
			"--worker-threads", "1", "--queen-arg=--ssh-timeout=2s", "--queen-arg=--hive-arg=--stop-grace=2s", "--queen-arg=--hive-arg=--shutdown-ack=1s"}
		if ssh != "" {
			args = append(args, "--ssh", ssh, "--ssh-config", state.SSHConfig("ssh_config"), "--install-dir", filepath.Join(nodeDir(1), "bin"))
		}
		k := testbin.Start(t, "keeper", env, append(args, extra...)...)
		k.Wait(t)
		return k
	}
	nothingLeft := func(what string) {
		t.Helper()
		if left := cluster.Leftovers(1); len(left) > 0 {
			t.Errorf("%s: node 1 still runs %v", what, left)
		}
		if left := testbin.Matching(tmp); len(left) > 0 {
			t.Errorf("%s: the keeper's queen still runs: %v", what, left)
		}
		if ents, err := os.ReadDir(tmp); err != nil || len(ents) != 0 {
			t.Errorf("%s: left in the temp dir: %v %v", what, ents, err)
		}
	}

	k := infer("root@" + nodeAddr(1))
	if code := k.Wait(t); code != 0 || k.Stdout() == "" {
		t.Fatalf("ephemeral infer --node n1: exit %d, answer %q; stderr:\n%s", code, k.Stdout(), k.Lines.String())
	}
	if !strings.Contains(k.Lines.String(), "starts a hive on node n1 (root@"+nodeAddr(1)+") over SSH") {
		t.Errorf("stderr does not say a hive is started on the node:\n%s", k.Lines.String())
	}
	// The keeper returned only after its queen, and the queen only after
	// the node's hive and worker exited.
	nothingLeft("after the answer")
	// The queen had no pool but the node's, where apiary was copied.
	if _, err := os.Stat(filepath.Join(nodeDir(1), "bin", "apiary")); err != nil {
		t.Errorf("apiary not installed on the node: %v", err)
	}

	// sshd refuses: the keeper says so before it starts any queen.
	k = infer("root@" + nodeAddr(1) + ":2222")
	if code := k.Wait(t); code != 1 || !strings.Contains(k.Lines.String(), "node n1: ") || !strings.Contains(k.Lines.String(), "sshd runs there") {
		t.Errorf("infer --ssh to a closed port: exit %d; stderr:\n%s", code, k.Lines.String())
	}
	nothingLeft("after a refused ssh")

	k = infer("")
	if code := k.Wait(t); code != 2 || !strings.Contains(k.Lines.String(), "--ssh USER@HOST") {
		t.Errorf("infer --node without --ssh and no queen: exit %d; stderr:\n%s", code, k.Lines.String())
	}
	nothingLeft("after --node without --ssh")
}
