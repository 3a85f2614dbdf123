package localnode

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/virtual-kubelet/virtual-kubelet/errdefs"
	"github.com/virtual-kubelet/virtual-kubelet/node/api"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
)

// maxPods bounds the Pods of one node (its pods capacity) and so the map
// of Pods and the Pod IPs in use.
const maxPods = 110

// provider is the virtual-kubelet provider of a stand-in node: every Pod
// is one local process.
type provider struct {
	log      *slog.Logger
	ctx      context.Context // the node's life; Pod goroutines end with it
	client   kubernetes.Interface
	spawner  *spawner
	nodeName string
	ipPrefix string // "127.0.X."
	podsDir  string // one directory a Pod under it
	path     string // PATH of Pod processes

	wg sync.WaitGroup // Pod goroutines

	mu     sync.Mutex
	pods   map[string]*podRun // guarded by mu; key namespace/name
	ipUsed map[int]bool       // guarded by mu; last octet of Pod IPs in use
	notify func(*corev1.Pod)  // guarded by mu
}

func podKey(namespace, name string) string { return namespace + "/" + name }

// allocIPLocked hands out a free Pod IP.
func (p *provider) allocIPLocked() (string, error) {
	for n := 2; n < 255; n++ {
		if !p.ipUsed[n] {
			p.ipUsed[n] = true
			return fmt.Sprintf("%s%d", p.ipPrefix, n), nil
		}
	}
	return "", errors.New("no free Pod IP on the node")
}

func (p *provider) releaseIPLocked(ip string) {
	var n int
	if _, err := fmt.Sscanf(ip[len(p.ipPrefix):], "%d", &n); err == nil {
		delete(p.ipUsed, n)
	}
}

// CreatePod accepts pod and starts its process in the background.
func (p *provider) CreatePod(ctx context.Context, pod *corev1.Pod) error {
	p.mu.Lock()
	key := podKey(pod.Namespace, pod.Name)
	if r, ok := p.pods[key]; ok && r.pod.UID == pod.UID {
		p.mu.Unlock()
		return nil
	}
	if len(p.pods) >= maxPods {
		p.mu.Unlock()
		return fmt.Errorf("node %s already holds %d Pods; delete some", p.nodeName, maxPods)
	}
	ip, err := p.allocIPLocked()
	if err != nil {
		p.mu.Unlock()
		return err
	}
	r := &podRun{
		p:      p,
		log:    p.log.With("pod", key, "pod_uid", string(pod.UID)),
		pod:    pod.DeepCopy(),
		dir:    filepath.Join(p.podsDir, fmt.Sprintf("%s_%s_%s", pod.Namespace, pod.Name, pod.UID)),
		stopCh: make(chan struct{}),
		done:   make(chan struct{}),
	}
	r.state = podState{podIP: ip, accepted: time.Now()}
	r.pod.Status = status(r.pod, r.state)
	p.pods[key] = r
	p.mu.Unlock()
	p.publish(r)
	p.wg.Go(func() { r.run(p.ctx) })
	return nil
}

// UpdatePod ignores changes: a kubelet too only acts on a running Pod's
// deletion, which comes through DeletePod.
func (p *provider) UpdatePod(ctx context.Context, pod *corev1.Pod) error { return nil }

// DeletePod stops pod's process: SIGTERM to its process group now, SIGKILL
// once the grace period has passed. When the process is gone the Pod is
// reported terminal and deleted from the API.
func (p *provider) DeletePod(ctx context.Context, pod *corev1.Pod) error {
	grace := 30 * time.Second
	if g := pod.Spec.TerminationGracePeriodSeconds; g != nil {
		grace = time.Duration(*g) * time.Second
	}
	if g := pod.DeletionGracePeriodSeconds; g != nil {
		grace = time.Duration(*g) * time.Second
	}
	p.mu.Lock()
	r, ok := p.pods[podKey(pod.Namespace, pod.Name)]
	if ok {
		r.deleting = true
	}
	p.mu.Unlock()
	if !ok {
		return errdefs.NotFoundf("pod %s/%s is not on node %s", pod.Namespace, pod.Name, p.nodeName)
	}
	r.requestStop(grace)
	select {
	case <-r.done:
		p.forget(r)
	default: // run calls forget once the process is gone
	}
	return nil
}

// forget removes a terminated Pod that is being deleted from the node and
// then from the API, as a kubelet does once its containers are gone.
func (p *provider) forget(r *podRun) {
	p.mu.Lock()
	key := podKey(r.pod.Namespace, r.pod.Name)
	cur, ok := p.pods[key]
	if !ok || cur != r {
		p.mu.Unlock()
		return
	}
	delete(p.pods, key)
	p.mu.Unlock()
	uid := r.pod.UID
	p.wg.Go(func() {
		ctx, cancel := context.WithTimeout(p.ctx, 10*time.Second)
		defer cancel()
		zero := int64(0)
		err := p.client.CoreV1().Pods(r.pod.Namespace).Delete(ctx, r.pod.Name, metav1.DeleteOptions{
			GracePeriodSeconds: &zero,
			Preconditions:      &metav1.Preconditions{UID: &uid},
		})
		if err != nil {
			r.log.Debug("final delete of the Pod left to the pod controller", "err", err)
		}
	})
}

// GetPod returns the node's copy of a Pod with its current status.
func (p *provider) GetPod(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r, ok := p.pods[podKey(namespace, name)]
	if !ok {
		return nil, errdefs.NotFoundf("pod %s/%s is not on node %s", namespace, name, p.nodeName)
	}
	return r.pod.DeepCopy(), nil
}

// GetPodStatus returns a Pod's current status.
func (p *provider) GetPodStatus(ctx context.Context, namespace, name string) (*corev1.PodStatus, error) {
	pod, err := p.GetPod(ctx, namespace, name)
	if err != nil {
		return nil, err
	}
	return &pod.Status, nil
}

// GetPods returns every Pod on the node.
func (p *provider) GetPods(ctx context.Context) ([]*corev1.Pod, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]*corev1.Pod, 0, len(p.pods))
	for _, r := range p.pods {
		out = append(out, r.pod.DeepCopy())
	}
	return out, nil
}

// NotifyPods registers the callback that status changes are reported to.
func (p *provider) NotifyPods(ctx context.Context, f func(*corev1.Pod)) {
	p.mu.Lock()
	p.notify = f
	p.mu.Unlock()
}

// setState changes r's state with change and reports the new status.
func (p *provider) setState(r *podRun, change func(*podState)) {
	p.mu.Lock()
	change(&r.state)
	r.pod.Status = status(r.pod, r.state)
	p.mu.Unlock()
	p.publish(r)
}

func (p *provider) publish(r *podRun) {
	p.mu.Lock()
	f, pod := p.notify, r.pod.DeepCopy()
	p.mu.Unlock()
	if f != nil {
		f(pod)
	}
}

// GetContainerLogs returns the Pod process's output (stdout and stderr
// together), honouring tail, limitBytes and follow.
func (p *provider) GetContainerLogs(ctx context.Context, namespace, podName, containerName string, opts api.ContainerLogOpts) (io.ReadCloser, error) {
	p.mu.Lock()
	r, ok := p.pods[podKey(namespace, podName)]
	p.mu.Unlock()
	if !ok {
		return nil, errdefs.NotFoundf("pod %s/%s is not on node %s", namespace, podName, p.nodeName)
	}
	return openLog(ctx, r.logPath(), r.done, opts)
}

// stopAll stops every Pod process (SIGTERM, SIGKILL after at most grace)
// and waits for their goroutines: the node's shutdown.
func (p *provider) stopAll(grace time.Duration) {
	p.mu.Lock()
	runs := make([]*podRun, 0, len(p.pods))
	for _, r := range p.pods {
		runs = append(runs, r)
	}
	p.mu.Unlock()
	for _, r := range runs {
		r.requestStop(grace)
	}
	p.wg.Wait()
}

var errUnsupported = errdefs.InvalidInput("not supported by the stand-in node")

func (p *provider) RunInContainer(ctx context.Context, namespace, podName, containerName string, cmd []string, attach api.AttachIO) error {
	return errUnsupported
}

func (p *provider) AttachToContainer(ctx context.Context, namespace, podName, containerName string, attach api.AttachIO) error {
	return errUnsupported
}

func (p *provider) GetStatsSummary(context.Context) (*statsv1alpha1.Summary, error) {
	return nil, errUnsupported
}

func (p *provider) GetMetricsResource(context.Context) ([]*dto.MetricFamily, error) {
	return nil, errUnsupported
}

func (p *provider) PortForward(ctx context.Context, namespace, pod string, port int32, stream io.ReadWriteCloser) error {
	return errUnsupported
}

// objectsFromAPI reads Secrets and ConfigMaps straight from the API.
type objectsFromAPI struct{ client kubernetes.Interface }

func (o objectsFromAPI) Secret(ctx context.Context, namespace, name string) (*corev1.Secret, error) {
	return o.client.CoreV1().Secrets(namespace).Get(ctx, name, metav1.GetOptions{})
}

func (o objectsFromAPI) ConfigMap(ctx context.Context, namespace, name string) (*corev1.ConfigMap, error) {
	return o.client.CoreV1().ConfigMaps(namespace).Get(ctx, name, metav1.GetOptions{})
}
