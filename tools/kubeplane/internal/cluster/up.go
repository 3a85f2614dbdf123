package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/apiary-llm/apiary/tools/kubeplane/internal/pidfile"
	"github.com/apiary-llm/apiary/tools/kubeplane/internal/pki"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// Config is one cluster to bring up.
type Config struct {
	// Dir holds everything of the cluster; required, created when absent.
	Dir string
	// Nodes is how many stand-in nodes to start; default 1.
	Nodes int
	// NodePath is put before each node's PATH to find Pod commands; empty by default.
	NodePath string
	// NodeGPUs is each node's nvidia.com/gpu capacity; default 0 (none).
	NodeGPUs int
	// Binary is the kubeplane executable the components run as; required.
	Binary string
	// Timeout bounds the wait for the apiserver and the nodes; default 3 minutes.
	Timeout time.Duration
}

func (c Config) withDefaults() Config {
	if c.Nodes == 0 {
		c.Nodes = 1
	}
	if c.Timeout == 0 {
		c.Timeout = 3 * time.Minute
	}
	return c
}

// Validate reports every problem by field.
func (c Config) Validate() error {
	var errs []error
	if c.Dir == "" {
		errs = append(errs, errors.New("dir is required"))
	}
	if c.Nodes < 1 || c.Nodes > 240 {
		errs = append(errs, errors.New("nodes must be 1 to 240"))
	}
	if c.NodeGPUs < 0 {
		errs = append(errs, errors.New("node GPUs must not be negative"))
	}
	if c.Binary == "" {
		errs = append(errs, errors.New("binary is required"))
	}
	return errors.Join(errs...)
}

// ErrRunning is returned by Up when the directory's cluster already runs.
var ErrRunning = errors.New("a cluster is already running in this directory")

// Up starts a cluster in c.Dir and returns once the apiserver is ready and
// every node is Ready and untainted (the apiserver taints a new node
// not-ready; the node lifecycle controller lifts the taint once it sees
// the node Ready). On failure it stops what it started.
func Up(ctx context.Context, log *slog.Logger, c Config) (err error) {
	c = c.withDefaults()
	if err := c.Validate(); err != nil {
		return err
	}
	dir, err := filepath.Abs(c.Dir)
	if err != nil {
		return err
	}
	d := layout(dir)
	for _, p := range []string{dir, d.runDir(), d.logDir(), d.pods()} {
		if err := os.MkdirAll(p, 0o755); err != nil {
			return fmt.Errorf("create %s: %w", p, err)
		}
	}
	unlock, err := lock(filepath.Join(dir, "up.lock"))
	if err != nil {
		return err
	}
	defer unlock()
	if live, err := running(d); err != nil {
		return err
	} else if len(live) > 0 {
		return fmt.Errorf("%w: %s; stop it with `scripts/kube.sh down %s` first", ErrRunning, strings.Join(live, ", "), dir)
	}
	// Stale pid files of a cluster that died: nothing of it runs.
	if err := Down(log, dir); err != nil {
		return fmt.Errorf("clean up what the last cluster in %s left: %w", dir, err)
	}

	ports, err := freePorts(3 + c.Nodes)
	if err != nil {
		return err
	}
	etcdPort, peerPort, apiPort := ports[0], ports[1], ports[2]
	server := fmt.Sprintf("https://127.0.0.1:%d", apiPort)

	ca, err := pki.Open(d.pki())
	if err != nil {
		return err
	}
	apiCert, apiKey, err := ca.Issue(pki.Request{
		Name: "apiserver", CN: "kube-apiserver", Server: true,
		DNS: []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
		IPs: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("10.96.0.1")},
	})
	if err != nil {
		return err
	}
	saPub, saKey, err := ca.ServiceAccountKey()
	if err != nil {
		return err
	}
	// Every client is in system:masters: a test cluster has no need to
	// prove the components' least privileges.
	kubeconfig := func(name, cn, path string) error {
		cert, key, err := ca.Issue(pki.Request{Name: name, CN: cn, Orgs: []string{"system:masters"}})
		if err != nil {
			return err
		}
		return ca.WriteKubeconfig(path, server, cn, cert, key)
	}
	if err := kubeconfig("admin", "kubernetes-admin", d.kubeconfig()); err != nil {
		return err
	}
	adminCert, adminKey := filepath.Join(d.pki(), "admin.crt"), filepath.Join(d.pki(), "admin.key")
	schedConf := filepath.Join(d.pki(), "scheduler.kubeconfig")
	kcmConf := filepath.Join(d.pki(), "controller-manager.kubeconfig")
	if err := kubeconfig("scheduler", "system:kube-scheduler", schedConf); err != nil {
		return err
	}
	if err := kubeconfig("controller-manager", "system:kube-controller-manager", kcmConf); err != nil {
		return err
	}

	s := &starter{log: log, d: d, bin: c.Binary, exited: map[string]chan struct{}{}}
	defer func() {
		if err != nil {
			log.Error("cluster did not come up; stopping what started", "err", err)
			if derr := Down(log, dir); derr != nil {
				err = errors.Join(err, derr)
			}
		}
	}()
	if err := s.start("etcd", "etcd", "--data-dir", d.etcd(),
		"--client-port", strconv.Itoa(etcdPort), "--peer-port", strconv.Itoa(peerPort)); err != nil {
		return err
	}
	if err := s.start("apiserver", "apiserver",
		"--etcd-servers=http://127.0.0.1:"+strconv.Itoa(etcdPort),
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
		"--secure-port="+strconv.Itoa(apiPort),
		"--cert-dir="+filepath.Join(d.pki(), "apiserver-generated"),
		"--tls-cert-file="+apiCert, "--tls-private-key-file="+apiKey,
		"--client-ca-file="+ca.CertPath(),
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file="+saPub, "--service-account-signing-key-file="+saKey,
		"--service-cluster-ip-range=10.96.0.0/16",
		"--authorization-mode=RBAC",
		// Pods get no service-account token volume: the stand-in nodes
		// could not mount it anyway.
		"--disable-admission-plugins=ServiceAccount",
		"--kubelet-client-certificate="+adminCert, "--kubelet-client-key="+adminKey,
		"--kubelet-preferred-address-types=InternalIP",
		"--endpoint-reconciler-type=none",
		"--enable-priority-and-fairness=false",
		"--profiling=false",
		"--allow-privileged=true",
	); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, c.Timeout)
	defer cancel()
	client, err := adminClient(d.kubeconfig())
	if err != nil {
		return err
	}
	if err := s.waitFor(ctx, "the apiserver to be ready", func(ctx context.Context) bool {
		body, err := client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err == nil && bytes.Equal(bytes.TrimSpace(body), []byte("ok"))
	}); err != nil {
		return err
	}
	if err := s.start("scheduler", "scheduler", "--kubeconfig="+schedConf,
		"--leader-elect=false", "--secure-port=0"); err != nil {
		return err
	}
	if err := s.start("controller-manager", "controller-manager", "--kubeconfig="+kcmConf,
		"--leader-elect=false", "--secure-port=0",
		"--controllers=*",
		"--use-service-account-credentials=false",
		"--service-account-private-key-file="+saKey,
		"--root-ca-file="+ca.CertPath()); err != nil {
		return err
	}
	podIPs, prefix, err := claimPodIPs()
	if err != nil {
		return err
	}
	defer podIPs.Close() // the nodes hold the claim from here on
	var names []string
	for i := 1; i <= c.Nodes; i++ {
		name := fmt.Sprintf("node-%d", i)
		names = append(names, name)
		cert, key, err := ca.Issue(pki.Request{Name: name, CN: "system:node:" + name, Orgs: []string{"system:masters"}, Server: true,
			DNS: []string{name, "localhost"}, IPs: []net.IP{net.ParseIP("127.0.0.1")}})
		if err != nil {
			return err
		}
		conf := filepath.Join(d.pki(), name+".kubeconfig")
		if err := ca.WriteKubeconfig(conf, server, "system:node:"+name, cert, key); err != nil {
			return err
		}
		s.extra = []*os.File{podIPs}
		if err := s.start(name, "node", name, "--index", strconv.Itoa(i), "--pod-ip-prefix", prefix, "--kubeconfig", conf,
			"--pods-dir", d.pods(), "--port", strconv.Itoa(ports[2+i]), "--cert", cert, "--key", key,
			"--gpus", strconv.Itoa(c.NodeGPUs), "--path", c.NodePath); err != nil {
			return err
		}
	}
	if err := s.waitFor(ctx, "every node to be Ready and schedulable", func(ctx context.Context) bool {
		for _, name := range names {
			n, err := client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
			if err != nil || !nodeReady(n) || len(n.Spec.Taints) > 0 {
				return false
			}
		}
		return true
	}); err != nil {
		return err
	}
	log.Info("cluster up", "dir", dir, "apiserver", server, "nodes", c.Nodes, "kubeconfig", d.kubeconfig())
	return nil
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func adminClient(kubeconfig string) (*kubernetes.Clientset, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", kubeconfig, err)
	}
	cfg.Timeout = 5 * time.Second
	return kubernetes.NewForConfig(cfg)
}

// starter starts components as background processes that outlive Up.
type starter struct {
	log    *slog.Logger
	d      layout
	bin    string
	exited map[string]chan struct{} // closed when that component exits while Up runs
	extra  []*os.File               // inherited by the next component started (fd 3…)
}

// start runs `kubeplane ARGS…` in a session of its own (so that down can
// signal its process group and a terminal's ^C does not reach it), output
// to its log file, and records its pid.
func (s *starter) start(name string, args ...string) error {
	logf, err := os.OpenFile(s.d.logFile(name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("open %s's log: %w", name, err)
	}
	defer logf.Close()
	cmd := exec.Command(s.bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	cmd.ExtraFiles, s.extra = s.extra, nil
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", name, err)
	}
	rec, err := pidfile.Of(cmd.Process.Pid)
	if err == nil {
		err = pidfile.Write(s.d.pidFile(name), rec)
	}
	if err != nil {
		_ = cmd.Process.Kill()
		return fmt.Errorf("record %s's pid: %w", name, err)
	}
	done := make(chan struct{})
	s.exited[name] = done
	go func() { _ = cmd.Wait(); close(done) }()
	s.log.Info("started", "component", name, "pid", cmd.Process.Pid, "log", s.d.logFile(name))
	return nil
}

// waitFor polls ok every 200ms until it holds, a component exits, or ctx ends.
func (s *starter) waitFor(ctx context.Context, what string, ok func(context.Context) bool) error {
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		if ok(ctx) {
			return nil
		}
		for name, done := range s.exited {
			select {
			case <-done:
				return fmt.Errorf("%s exited while waiting for %s; its log ends:\n%s", name, what, tail(s.d.logFile(name), 30))
			default:
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("gave up waiting for %s: %w; the logs are in %s", what, ctx.Err(), s.d.logDir())
		case <-t.C:
		}
	}
}

// tail returns the last n lines of the file at path.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// freePorts asks the kernel for n free ports on 127.0.0.1, holding them all
// until every one is known so they differ.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("find a free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// lock takes an exclusive lock on path, so two `up`s of one directory do
// not race; it fails at once when another holds it.
func lock(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("another `up` is starting a cluster in %s; wait for it or run down", filepath.Dir(path))
	}
	return func() { f.Close() }, nil
}

// claimPodIPs picks the Pod IP range of this cluster, 127.X.0.0/16, so
// that clusters side by side never hand out the same Pod IP: it takes an
// exclusive lock on the first free of 256 files in one directory of the
// host. The lock holds while any process has the returned file open: Up
// passes it to every node, so it lasts as long as the cluster's nodes.
func claimPodIPs() (*os.File, string, error) {
	dir := filepath.Join(os.TempDir(), "kubeplane-pod-ips")
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return nil, "", fmt.Errorf("create %s: %w", dir, err)
	}
	for x := range 256 {
		path := filepath.Join(dir, fmt.Sprintf("127.%d", x))
		f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o666)
		if err != nil {
			continue // another user's file
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			f.Close()
			continue
		}
		return f, fmt.Sprintf("127.%d", x), nil
	}
	return nil, "", fmt.Errorf("all 256 Pod IP ranges in %s are taken by running clusters; stop some with kube.sh down", dir)
}
