// Package localnode is a stand-in Kubernetes node: a virtual-kubelet whose
// provider runs each Pod's first container as a local process (no
// container runtime, no image, no cgroups, no network namespace), with a
// loopback address of its own as the Pod IP.
package localnode

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
	"time"

	"github.com/virtual-kubelet/virtual-kubelet/node"
	"github.com/virtual-kubelet/virtual-kubelet/node/nodeutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// Config is one stand-in node.
type Config struct {
	// Name is the Node's name and kubernetes.io/hostname label; required.
	Name string
	// Index numbers the node from 1; its Pod IPs are
	// PodIPPrefix.(Index+10).N. Required, at most 240.
	Index int
	// PodIPPrefix is the cluster's Pod IP range, "127.X"; default "127.0".
	PodIPPrefix string
	// Kubeconfig reaches the apiserver; required.
	Kubeconfig string
	// PodsDir holds a directory per Pod (output, pid file); required.
	PodsDir string
	// Port is the kubelet API's port on 127.0.0.1 (logs); required.
	Port int
	// CertFile and KeyFile are the kubelet API's serving certificate; required.
	CertFile, KeyFile string
	// GPUs is the node's nvidia.com/gpu capacity; 0 (the default) lists none.
	GPUs int
	// Path is put before the node's own PATH to find Pod commands; empty by default.
	Path string
}

// Validate reports every missing or wrong field.
func (c Config) Validate() error {
	var errs []error
	if c.Name == "" {
		errs = append(errs, errors.New("node name is required"))
	}
	if c.Index < 1 || c.Index > 240 {
		errs = append(errs, errors.New("node index must be 1 to 240"))
	}
	if c.Kubeconfig == "" || c.PodsDir == "" || c.CertFile == "" || c.KeyFile == "" {
		errs = append(errs, errors.New("node needs a kubeconfig, a pods directory and a serving certificate and key"))
	}
	if ip := net.ParseIP(c.PodIPPrefix + ".0.0"); c.PodIPPrefix != "" && (ip == nil || !ip.IsLoopback()) {
		errs = append(errs, errors.New("pod IP prefix must be 127.X"))
	}
	if c.Port <= 0 {
		errs = append(errs, errors.New("node needs the port of its kubelet API"))
	}
	if c.GPUs < 0 {
		errs = append(errs, errors.New("node GPUs must not be negative"))
	}
	return errors.Join(errs...)
}

// shutdownGrace bounds each Pod's grace period when the node itself stops.
const shutdownGrace = 5 * time.Second

// Run registers the node and runs Pods until ctx ends; then it stops every
// Pod process (SIGTERM, SIGKILL after at most shutdownGrace) before returning.
func Run(ctx context.Context, log *slog.Logger, c Config) error {
	if c.PodIPPrefix == "" {
		c.PodIPPrefix = "127.0"
	}
	if err := c.Validate(); err != nil {
		return err
	}
	restCfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		return fmt.Errorf("load kubeconfig %s: %w", c.Kubeconfig, err)
	}
	client, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return fmt.Errorf("make the API client: %w", err)
	}
	podsDir := filepath.Join(c.PodsDir, c.Name)
	if err := os.MkdirAll(podsDir, 0o755); err != nil {
		return fmt.Errorf("create the Pod directory: %w", err)
	}
	podCtx, stopPods := context.WithCancel(context.WithoutCancel(ctx))
	defer stopPods()
	p := &provider{
		log:      log,
		ctx:      podCtx,
		client:   client,
		spawner:  newSpawner(),
		nodeName: c.Name,
		ipPrefix: fmt.Sprintf("%s.%d.", c.PodIPPrefix, c.Index+10),
		podsDir:  podsDir,
		path:     joinPath(c.Path, os.Getenv("PATH")),
		pods:     map[string]*podRun{},
		ipUsed:   map[int]bool{},
	}
	defer p.spawner.close()
	defer p.stopAll(shutdownGrace)

	mux := http.NewServeMux()
	n, err := nodeutil.NewNode(c.Name,
		func(pc nodeutil.ProviderConfig) (nodeutil.Provider, node.NodeProvider, error) {
			describeNode(pc.Node, c)
			// The node registers Ready: nodeutil creates it only once the
			// Pod controller runs. Registering NotReady and turning Ready a
			// moment later (nodeutil's default) let the node lifecycle
			// controller, had it looked in between, add a not-ready
			// NoExecute taint after the node was already Ready, and lift it
			// only on its next pass: a node briefly tainted after `up`.
			return p, node.NewNaiveNodeProvider(), nil
		},
		nodeutil.WithClient(client),
		func(nc *nodeutil.NodeConfig) error {
			nc.HTTPListenAddr = "127.0.0.1:" + strconv.Itoa(c.Port)
			nc.Handler = mux
			nc.SkipDownwardAPIResolution = true // the provider resolves env itself, once the Pod IP is known
			nc.NumWorkers = 4
			return nil
		},
		nodeutil.WithTLSConfig(nodeutil.WithKeyPairFromPath(c.CertFile, c.KeyFile)),
		nodeutil.AttachProviderRoutes(mux),
	)
	if err != nil {
		return fmt.Errorf("set up the node: %w", err)
	}
	runErr := make(chan error, 1)
	go func() { runErr <- n.Run(ctx) }()
	select {
	case <-n.Ready():
		log.Info("node ready", "pod_ips", p.ipPrefix+"N", "kubelet_port", c.Port)
	case err := <-runErr:
		return fmt.Errorf("node stopped before it was ready: %w", err)
	}
	err = <-runErr
	if ctx.Err() != nil {
		return nil
	}
	return err
}

func joinPath(parts ...string) string {
	out := ""
	for _, s := range parts {
		if s == "" {
			continue
		}
		if out != "" {
			out += ":"
		}
		out += s
	}
	return out
}

// describeNode fills in the Node object a kubelet would register.
func describeNode(n *corev1.Node, c Config) {
	n.Labels["kubernetes.io/hostname"] = c.Name
	n.Labels["kubernetes.io/os"] = "linux"
	n.Labels["kubernetes.io/arch"] = runtime.GOARCH
	n.Labels["kubeplane.apiary.dev/stand-in"] = "true"
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    *resource.NewQuantity(int64(runtime.NumCPU()), resource.DecimalSI),
		corev1.ResourceMemory: *resource.NewQuantity(hostMemory(), resource.BinarySI),
		corev1.ResourcePods:   *resource.NewQuantity(maxPods, resource.DecimalSI),
	}
	if c.GPUs > 0 {
		capacity["nvidia.com/gpu"] = *resource.NewQuantity(int64(c.GPUs), resource.DecimalSI)
	}
	n.Status.Capacity = capacity
	n.Status.Allocatable = capacity.DeepCopy()
	n.Status.Addresses = []corev1.NodeAddress{
		{Type: corev1.NodeInternalIP, Address: hostIP},
		{Type: corev1.NodeHostName, Address: c.Name},
	}
	n.Status.DaemonEndpoints.KubeletEndpoint.Port = int32(c.Port)
	n.Status.NodeInfo = corev1.NodeSystemInfo{
		OperatingSystem:         "linux",
		Architecture:            runtime.GOARCH,
		KubeletVersion:          "v1.37.2",
		ContainerRuntimeVersion: "kubeplane://local-process",
	}
	now := metav1.Now()
	cond := func(t corev1.NodeConditionType, s corev1.ConditionStatus, reason, msg string) corev1.NodeCondition {
		return corev1.NodeCondition{Type: t, Status: s, Reason: reason, Message: msg, LastHeartbeatTime: now, LastTransitionTime: now}
	}
	n.Status.Phase = corev1.NodeRunning
	n.Status.Conditions = []corev1.NodeCondition{
		cond(corev1.NodeReady, corev1.ConditionTrue, "KubeletReady", "stand-in node; registered once its Pod controller runs"),
		cond(corev1.NodeMemoryPressure, corev1.ConditionFalse, "KubeletHasSufficientMemory", "stand-in node"),
		cond(corev1.NodeDiskPressure, corev1.ConditionFalse, "KubeletHasNoDiskPressure", "stand-in node"),
		cond(corev1.NodePIDPressure, corev1.ConditionFalse, "KubeletHasSufficientPID", "stand-in node"),
		cond(corev1.NodeNetworkUnavailable, corev1.ConditionFalse, "RouteCreated", "loopback Pod IPs"),
	}
}

func hostMemory() int64 {
	var si syscall.Sysinfo_t
	if err := syscall.Sysinfo(&si); err != nil {
		return 1 << 30
	}
	return int64(si.Totalram) * int64(si.Unit)
}
