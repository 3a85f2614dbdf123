package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	watchtools "k8s.io/client-go/tools/watch"
)

// helperName is the name under which the test binary acts as a Pod's
// server: it is linked into a directory on KUBE_NODE_PATH, so Pods also
// prove that commands resolve through it.
const helperName = "kubeplane-test-helper"

var kubeSh string // scripts/kube.sh

// podIPOfNode1 matches the Pod IPs node-1 hands out: the second octet is
// the cluster's own.
var podIPOfNode1 = regexp.MustCompile(`^127\.\d+\.11\.\d+$`)

func TestMain(m *testing.M) {
	if filepath.Base(os.Args[0]) == helperName {
		os.Exit(serve())
	}
	root, err := filepath.Abs("../../..")
	if err != nil {
		panic(err)
	}
	kubeSh = filepath.Join(root, "scripts", "kube.sh")
	// Build once for every test: the cold build takes minutes, a warm one
	// seconds; tests fail, not skip, when it does not build.
	out, err := exec.Command(kubeSh, "build").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "scripts/kube.sh build failed: %v\n%s", err, out)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// serve is the helper Pod process: it prints what it was given and answers
// HTTP on $POD_IP:8080 until SIGTERM.
func serve() int {
	ip := os.Getenv("POD_IP")
	l, err := net.Listen("tcp", net.JoinHostPort(ip, "8080"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "listen:", err)
		return 1
	}
	fmt.Printf("helper listening on %s\n", l.Addr())
	_ = http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "pod %s", os.Getenv("POD_NAME"))
	}))
	return 1
}

func kube(t *testing.T, env []string, args ...string) string {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), kubeSh, args...)
	cmd.Env = append(os.Environ(), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kube.sh %s: %v\n%s%s", strings.Join(args, " "), err, out, stderr.String())
	}
	return string(out)
}

// cluster is one running test cluster.
type testCluster struct {
	dir    string
	client *kubernetes.Clientset
}

func upCluster(t *testing.T, nodes int, env ...string) *testCluster {
	t.Helper()
	dir := t.TempDir()
	t.Cleanup(func() {
		// Down even when the test failed half way; a test that wants to
		// check down calls it itself first, and a second down is a no-op.
		out, err := exec.Command(kubeSh, "down", dir).CombinedOutput()
		if err != nil {
			t.Errorf("kube.sh down: %v\n%s", err, out)
		}
	})
	kube(t, env, "up", dir, strconv.Itoa(nodes))
	cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(dir, "kubeconfig"))
	if err != nil {
		t.Fatal(err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &testCluster{dir: dir, client: client}
}

// waitPod waits, watching, until cond holds for the Pod (cond gets nil
// once the Pod is gone) and returns the Pod it held for.
func (c *testCluster) waitPod(t *testing.T, ns, name, what string, cond func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	lw := cache.NewFilteredListWatchFromClient(c.client.CoreV1().RESTClient(), "pods", ns, func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", name).String()
	})
	var last *corev1.Pod
	check := func(p *corev1.Pod) bool {
		last = p
		// A Pod that ended will not change: stop waiting.
		return cond(p) || (p != nil && (p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded))
	}
	_, err := watchtools.UntilWithSync(ctx, lw, &corev1.Pod{},
		func(store cache.Store) (bool, error) {
			obj, ok, err := store.GetByKey(ns + "/" + name)
			if err != nil || !ok {
				return check(nil), err
			}
			return check(obj.(*corev1.Pod)), nil
		},
		func(ev watch.Event) (bool, error) {
			if ev.Type == watch.Deleted {
				return check(nil), nil
			}
			p, _ := ev.Object.(*corev1.Pod)
			return check(p), nil
		})
	if err != nil || !cond(last) {
		logs, _ := c.client.CoreV1().Pods(ns).GetLogs(name, &corev1.PodLogOptions{}).DoRaw(context.WithoutCancel(ctx))
		t.Fatalf("pod %s/%s: waiting for %s: %v; last seen: %s\nits output:\n%s", ns, name, what, err, describe(last), logs)
	}
	return last
}

func describe(p *corev1.Pod) string {
	if p == nil {
		return "gone"
	}
	return fmt.Sprintf("phase %s reason %q message %q node %q ip %q containers %+v", p.Status.Phase, p.Status.Reason,
		p.Status.Message, p.Spec.NodeName, p.Status.PodIP, p.Status.ContainerStatuses)
}

func running(p *corev1.Pod) bool { return p != nil && p.Status.Phase == corev1.PodRunning }

func ready(p *corev1.Pod) bool {
	if !running(p) {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func (c *testCluster) create(t *testing.T, p *corev1.Pod) {
	t.Helper()
	if _, err := c.client.CoreV1().Pods(p.Namespace).Create(t.Context(), p, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod %s: %v", p.Name, err)
	}
}

func (c *testCluster) logs(t *testing.T, ns, name string) string {
	t.Helper()
	b, err := c.client.CoreV1().Pods(ns).GetLogs(name, &corev1.PodLogOptions{}).DoRaw(t.Context())
	if err != nil {
		t.Fatalf("logs of %s: %v", name, err)
	}
	return string(b)
}

func shPod(ns, name, script string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{
				Name: "main", Image: "ignored:latest",
				Command: []string{"sh", "-c", script},
			}},
		},
	}
}

// alive reports whether pid runs (a zombie does not).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return len(f) > 0 && f[0] != "Z" && f[0] != "X"
}

// group lists the live processes in process group pgid.
func group(pgid int) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || !alive(pid) {
			continue
		}
		b, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		s := string(b)
		if f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:]); len(f) > 2 && f[2] == strconv.Itoa(pgid) {
			out = append(out, pid)
		}
	}
	return out
}

// processesOf lists live processes whose command line mentions dir: every
// component (their flags name the cluster directory).
func processesOf(dir string) []string {
	ents, _ := os.ReadDir("/proc")
	var out []string
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || !alive(pid) {
			continue
		}
		b, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if bytes.Contains(b, []byte(dir)) {
			out = append(out, fmt.Sprintf("%d %s", pid, bytes.ReplaceAll(b, []byte{0}, []byte{' '})))
		}
	}
	return out
}

// TestCluster brings up a two-node cluster through scripts/kube.sh and
// checks what apiary's tests rely on, one subtest a behaviour, then that
// down leaves nothing running.
func TestCluster(t *testing.T) {
	t.Parallel() // beside TestDocsRunAsWritten's cluster: two clusters side by side
	bin := t.TempDir()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(self, filepath.Join(bin, helperName)); err != nil {
		t.Fatal(err)
	}
	c := upCluster(t, 2, "KUBE_NODE_PATH="+bin, "KUBE_NODE_GPUS=1")
	ctx := t.Context()
	ns := "kubeplane-test"
	if _, err := c.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var podPIDs []int // every Pod process started, for the check after down

	t.Run("NodesAreReadyWithHostCapacity", func(t *testing.T) {
		nodes, err := c.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(nodes.Items) != 2 {
			t.Fatalf("%d nodes, want 2", len(nodes.Items))
		}
		for _, n := range nodes.Items {
			if n.Labels["kubernetes.io/hostname"] != n.Name || n.Labels["kubernetes.io/os"] != "linux" {
				t.Errorf("node %s labels %v", n.Name, n.Labels)
			}
			if got := n.Status.Capacity[corev1.ResourcePods]; got.Value() != 110 {
				t.Errorf("node %s pods capacity %s, want 110", n.Name, got.String())
			}
			if got := n.Status.Capacity["nvidia.com/gpu"]; got.Value() != 1 {
				t.Errorf("node %s nvidia.com/gpu %s, want 1 (KUBE_NODE_GPUS=1)", n.Name, got.String())
			}
			if len(n.Spec.Taints) != 0 {
				t.Errorf("node %s has taints %v", n.Name, n.Spec.Taints)
			}
		}
	})

	t.Run("UpAgainFailsWhileRunning", func(t *testing.T) {
		out, err := exec.Command(kubeSh, "up", c.dir).CombinedOutput()
		if err == nil || !strings.Contains(string(out), "already running") {
			t.Fatalf("second up: err %v, output:\n%s", err, out)
		}
	})

	t.Run("PodGetsLoopbackIPEnvAndLogs", func(t *testing.T) {
		_, err := c.client.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: "creds"},
			StringData: map[string]string{"token": "s3cr3t-value"},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var ips []string
		for _, name := range []string{"web-a", "web-b"} {
			// $(POD_IP) is expanded by the node, $TOKEN by sh.
			p := shPod(ns, name, `echo "ip=$(POD_IP) token=$TOKEN"; exec `+helperName)
			p.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": "node-1"} // both listen on 8080 on one host
			p.Spec.Containers[0].Env = []corev1.EnvVar{
				{Name: "POD_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}},
				{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
				{Name: "TOKEN", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
					LocalObjectReference: corev1.LocalObjectReference{Name: "creds"}, Key: "token"}}},
			}
			p.Spec.Containers[0].ReadinessProbe = &corev1.Probe{
				ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/", Port: intstr.FromInt32(8080)}},
				PeriodSeconds: 1,
			}
			c.create(t, p)
		}
		for _, name := range []string{"web-a", "web-b"} {
			p := c.waitPod(t, ns, name, "Ready", ready)
			if !podIPOfNode1.MatchString(p.Status.PodIP) || p.Status.HostIP != "127.0.0.1" {
				t.Errorf("%s: pod IP %q host IP %q, want 127.X.11.N and 127.0.0.1", name, p.Status.PodIP, p.Status.HostIP)
			}
			if st := p.Status.ContainerStatuses; len(st) != 1 || st[0].State.Running == nil || !st[0].Ready {
				t.Errorf("%s: container status %+v, want running and ready", name, st)
			}
			ips = append(ips, p.Status.PodIP)
			logs := c.logs(t, ns, name)
			for _, want := range []string{"ip=" + p.Status.PodIP, "token=s3cr3t-value", "helper listening on " + p.Status.PodIP + ":8080"} {
				if !strings.Contains(logs, want) {
					t.Errorf("%s: logs lack %q:\n%s", name, want, logs)
				}
			}
			resp, err := http.Get("http://" + net.JoinHostPort(p.Status.PodIP, "8080"))
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if string(body) != "pod "+name {
				t.Errorf("%s answered %q", name, body)
			}
			podPIDs = append(podPIDs, podPID(t, c.dir, p))
		}
		if ips[0] == ips[1] {
			t.Errorf("both Pods got IP %s", ips[0])
		}
	})

	t.Run("ExitCodeThreeFailsThePod", func(t *testing.T) {
		c.create(t, shPod(ns, "exit3", "echo bye; exit 3"))
		p := c.waitPod(t, ns, "exit3", "Failed", func(p *corev1.Pod) bool { return p != nil && p.Status.Phase == corev1.PodFailed })
		term := p.Status.ContainerStatuses[0].State.Terminated
		if term == nil || term.ExitCode != 3 || term.Reason != "Error" {
			t.Errorf("terminated state %+v, want exit code 3, reason Error", term)
		}
		if logs := c.logs(t, ns, "exit3"); !strings.Contains(logs, "bye") {
			t.Errorf("logs %q", logs)
		}
	})

	t.Run("ExitZeroSucceeds", func(t *testing.T) {
		c.create(t, shPod(ns, "ok", "true"))
		c.waitPod(t, ns, "ok", "Succeeded", func(p *corev1.Pod) bool { return p != nil && p.Status.Phase == corev1.PodSucceeded })
	})

	t.Run("DeleteWithGraceSendsSIGTERM", func(t *testing.T) {
		mark := filepath.Join(t.TempDir(), "terminated")
		c.create(t, shPod(ns, "graceful", `trap 'echo TERM > `+mark+`; exit 0' TERM; echo trapped; while :; do sleep 0.1; done`))
		p := c.waitPod(t, ns, "graceful", "the trap to be set", func(p *corev1.Pod) bool {
			return running(p) && strings.Contains(c.logs(t, ns, "graceful"), "trapped")
		})
		pid := podPID(t, c.dir, p)
		grace := int64(20)
		start := time.Now()
		if err := c.client.CoreV1().Pods(ns).Delete(ctx, "graceful", metav1.DeleteOptions{GracePeriodSeconds: &grace}); err != nil {
			t.Fatal(err)
		}
		c.waitPod(t, ns, "graceful", "deletion", func(p *corev1.Pod) bool { return p == nil })
		if took := time.Since(start); took > 10*time.Second {
			t.Errorf("the Pod took %s to go from the API after its process exited on SIGTERM", took)
		}
		if b, err := os.ReadFile(mark); err != nil || strings.TrimSpace(string(b)) != "TERM" {
			t.Errorf("the trap did not run: %q %v", b, err)
		}
		if alive(pid) {
			t.Errorf("pod process %d still runs", pid)
		}
	})

	t.Run("OwnerDeletedGarbageCollectsPod", func(t *testing.T) {
		owner, err := c.client.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "owner"}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		p := shPod(ns, "owned", "sleep 600 & wait")
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: owner.Name, UID: owner.UID}}
		c.create(t, p)
		p = c.waitPod(t, ns, "owned", "Running", running)
		pid := podPID(t, c.dir, p)
		if err := c.client.CoreV1().ConfigMaps(ns).Delete(ctx, "owner", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		c.waitPod(t, ns, "owned", "garbage collection", func(p *corev1.Pod) bool { return p == nil })
		if alive(pid) {
			t.Errorf("pod process %d still runs", pid)
		}
	})

	t.Run("UnrunnablePodsFailWithReason", func(t *testing.T) {
		missing := shPod(ns, "missing-secret", "true")
		missing.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "X", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: "absent"}, Key: "k"}}}}
		remapped := shPod(ns, "remapped-hostpath", "true")
		remapped.Spec.Volumes = []corev1.Volume{{Name: "v", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: c.dir}}}}
		remapped.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "v", MountPath: "/data"}}
		for _, tc := range []struct {
			pod    *corev1.Pod
			reason string
			msg    string
		}{
			{missing, "CreateContainerConfigError", `secret "absent" not found`},
			{remapped, "UnsupportedVolume", "unsupported by the stand-in node"},
		} {
			c.create(t, tc.pod)
			p := c.waitPod(t, ns, tc.pod.Name, "Failed", func(p *corev1.Pod) bool { return p != nil && p.Status.Phase == corev1.PodFailed })
			if p.Status.Reason != tc.reason || !strings.Contains(p.Status.Message, tc.msg) {
				t.Errorf("%s: reason %q message %q, want %q and %q", tc.pod.Name, p.Status.Reason, p.Status.Message, tc.reason, tc.msg)
			}
		}
	})

	t.Run("SchedulerCountsGPUs", func(t *testing.T) {
		for i := range 3 {
			p := shPod(ns, fmt.Sprintf("gpu-%d", i), "sleep 600")
			p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}
			c.create(t, p)
		}
		nodes := map[string]bool{}
		pending := 0
		for i := range 3 {
			name := fmt.Sprintf("gpu-%d", i)
			p := c.waitPod(t, ns, name, "Running or Unschedulable", func(p *corev1.Pod) bool {
				return running(p) || (p != nil && unschedulable(p))
			})
			if running(p) {
				nodes[p.Spec.NodeName] = true
				podPIDs = append(podPIDs, podPID(t, c.dir, p))
			} else {
				pending++
			}
		}
		if len(nodes) != 2 || pending != 1 {
			t.Errorf("GPU Pods ran on %v with %d unschedulable, want one on each node and one unschedulable", nodes, pending)
		}
	})

	t.Run("NodeDeathKillsItsPods", func(t *testing.T) {
		p := shPod(ns, "orphan", "sleep 600 & wait")
		p.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": "node-2"}
		c.create(t, p)
		p = c.waitPod(t, ns, "orphan", "Running", running)
		pid := podPID(t, c.dir, p)
		podPIDs = append(podPIDs, pid) // its sleep stays in the group until down
		b, err := os.ReadFile(filepath.Join(c.dir, "run", "node-2.pid"))
		if err != nil {
			t.Fatal(err)
		}
		node, _ := strconv.Atoi(strings.Fields(string(b))[0])
		if err := syscall.Kill(node, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		// Pdeathsig is immediate; the deadline only bounds a failure.
		for deadline := time.Now().Add(5 * time.Second); alive(pid); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("pod process %d outlived its node by 5 s", pid)
			}
		}
	})

	t.Run("DownLeavesNothingRunning", func(t *testing.T) {
		kube(t, nil, "down", c.dir)
		if left := processesOf(c.dir); len(left) > 0 {
			t.Errorf("after down these still run:\n%s", strings.Join(left, "\n"))
		}
		for _, pgid := range podPIDs {
			if left := group(pgid); len(left) > 0 {
				t.Errorf("processes %v of Pod process group %d still run after down", left, pgid)
			}
		}
		kube(t, nil, "down", c.dir) // again: nothing to do, still exit 0
	})
}

func unschedulable(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			return true
		}
	}
	return false
}

// podPID is the pid of a running Pod's process, from the record its node keeps.
func podPID(t *testing.T, dir string, p *corev1.Pod) int {
	t.Helper()
	path := filepath.Join(dir, "pods", p.Spec.NodeName, fmt.Sprintf("%s_%s_%s", p.Namespace, p.Name, p.UID), "pgid")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("pod %s: %v", p.Name, err)
	}
	pid, err := strconv.Atoi(strings.Fields(string(b))[0])
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

func TestDownWithoutClusterExitsZero(t *testing.T) {
	kube(t, nil, "down", t.TempDir())
}
