package kube

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/apiary-llm/apiary/internal/procs"
	"github.com/apiary-llm/apiary/internal/secret"
)

// Worker is what a worker Pod runs.
type Worker struct {
	ID, LifecycleID, ModelRef string
	// Devices are the ids (Cluster.Devices) the worker was placed on: a
	// node's CPU, or GPUs of one node.
	Devices []int
	// MemoryBytes is the model's estimate: the Pod's memory request.
	MemoryBytes uint64
	Token       string
	// Args follow Config.Command: "worker" and its flags; "$(POD_IP)"
	// is the Pod's IP (Kubernetes expands it from the Pod's env).
	Args      []string
	Env       map[string]string
	SpawnedAt time.Time
	// Grace is how long a deleted Pod has between SIGTERM and SIGKILL.
	Grace time.Duration
}

// PodIPEnv is the variable a worker Pod's IP is in.
const PodIPEnv = "POD_IP"

// Pod is a worker's Pod as the hive's owner loop sees a process: it has
// exited once the Pod has ended (Succeeded, Failed, evicted) or is gone.
type Pod struct {
	c     *Cluster
	name  string
	grace time.Duration

	exited   chan struct{}
	exitOnce sync.Once

	mu   sync.Mutex
	exit procs.Exit // guarded by mu
	ip   string     // guarded by mu
	node string     // guarded by mu
	// waiting is why the Pod has not started ("" once it has, or
	// while nothing is known): Unschedulable's message, a
	// container's waiting reason.
	waiting string // guarded by mu
}

// Name is the Pod's name.
func (p *Pod) Name() string { return p.name }

// PID is 0: the worker is no process of this machine.
func (p *Pod) PID() int { return 0 }

// Identity is empty: a Pod is found again by its labels, not a record.
func (p *Pod) Identity() procs.Identity { return procs.Identity{} }

// Exited is closed once the Pod has ended or is gone.
func (p *Pod) Exited() <-chan struct{} { return p.exited }

// Done is Exited: the Pod's containers, and so its memory, are gone with it.
func (p *Pod) Done() <-chan struct{} { return p.exited }

// Exit is how the Pod ended (valid once Exited is closed).
func (p *Pod) Exit() procs.Exit {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exit
}

// IP is the Pod's IP ("" until it has one).
func (p *Pod) IP() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ip
}

// Ref is the Pod's NAMESPACE/NAME.
func (p *Pod) Ref() string { return p.c.cfg.Namespace + "/" + p.name }

// Node is the node the Pod is bound to ("" until it is).
func (p *Pod) Node() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.node
}

// Where names the Pod and its node, for reasons and logs.
func (p *Pod) Where() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := "pod " + p.c.cfg.Namespace + "/" + p.name
	if p.node != "" {
		s += " on node " + p.node
	}
	if p.waiting != "" {
		s += " (" + p.waiting + ")"
	}
	return s
}

// Signal deletes the Pod with its grace period (SIGTERM first, as the
// kubelet does), or at once for SIGKILL; other signals are refused.
func (p *Pod) Signal(sig syscall.Signal) error {
	switch sig {
	case syscall.SIGTERM:
		return p.delete(p.grace)
	case syscall.SIGKILL:
		return p.delete(0)
	}
	return fmt.Errorf("a pod takes no %s", sig)
}

// killWait bounds how long a Pod deleted at once may stay listed (a node
// that is gone cannot confirm it) before the hive counts it ended.
const killWait = 30 * time.Second

// Kill deletes the Pod at once. Should the Pod stay listed (its node gone),
// it counts as ended after killWait.
func (p *Pod) Kill() {
	if err := p.delete(0); err != nil {
		p.c.log.Warn("cannot delete a worker pod", "pod", p.name, "err", err)
	}
	time.AfterFunc(killWait, func() {
		p.end(procs.Exit{Code: -1, Signal: syscall.SIGKILL, Reason: "pod deleted; its end not confirmed within " + killWait.String()})
	})
}

func (p *Pod) delete(grace time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	secs := int64(grace / time.Second)
	err := p.c.api.remove(ctx, resPods, p.c.cfg.Namespace, p.name, metav1.DeleteOptions{GracePeriodSeconds: &secs})
	if apierrors.IsNotFound(err) {
		p.end(procs.Exit{Code: -1, Signal: syscall.SIGKILL, Reason: "pod gone"})
		return nil
	}
	return err
}

// observe takes a Pod's new state from the watch.
func (p *Pod) observe(pod *corev1.Pod) {
	p.mu.Lock()
	if pod.Status.PodIP != "" {
		p.ip = pod.Status.PodIP
	}
	p.node = pod.Spec.NodeName
	p.waiting = waitingReason(pod)
	p.mu.Unlock()
	if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		p.end(exitOf(pod, "pod "+string(pod.Status.Phase)))
		if pod.DeletionTimestamp == nil {
			// An ended Pod is only its record now: it goes, with its
			// Secret, so that no Pod outlives its worker.
			p.c.removals.Go(func() {
				if err := p.delete(0); err != nil {
					p.c.log.Warn("cannot delete an ended worker pod", "pod", p.name, "err", err)
				}
			})
		}
	}
}

// end records how the Pod ended, once.
func (p *Pod) end(ex procs.Exit) {
	p.exitOnce.Do(func() {
		p.mu.Lock()
		p.exit = ex
		p.mu.Unlock()
		p.c.mu.Lock()
		if p.c.watching[p.name] == p {
			delete(p.c.watching, p.name)
		}
		p.c.mu.Unlock()
		close(p.exited)
	})
}

// exitOf is how pod ended: its container's exit code, else why
// Kubernetes ended it (evicted, deleted), else fallback.
func exitOf(pod *corev1.Pod, fallback string) procs.Exit {
	for _, cs := range pod.Status.ContainerStatuses {
		if t := cs.State.Terminated; t != nil {
			ex := procs.Exit{Code: int(t.ExitCode), Reason: "pod " + pod.Name + " " + string(pod.Status.Phase)}
			if t.Signal != 0 {
				ex = procs.Exit{Code: -1, Signal: syscall.Signal(t.Signal), Reason: ex.Reason}
			}
			if t.Reason != "" {
				ex.Reason += ": " + t.Reason
			}
			if pod.Status.Reason != "" {
				ex.Reason += " (" + pod.Status.Reason + ": " + pod.Status.Message + ")"
			}
			return ex
		}
	}
	why := fallback
	if pod.Status.Reason != "" {
		why = "pod " + string(pod.Status.Phase) + ": " + pod.Status.Reason + ": " + pod.Status.Message
	}
	return procs.Exit{Code: -1, Signal: syscall.SIGKILL, Reason: why}
}

// waitingReason is why pod has not started, if it says.
func waitingReason(pod *corev1.Pod) string {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
			return "not scheduled: " + c.Reason + ": " + c.Message
		}
	}
	for _, cs := range pod.Status.ContainerStatuses {
		if w := cs.State.Waiting; w != nil && w.Reason != "" {
			return w.Reason + ": " + w.Message
		}
	}
	return ""
}

// Waiting is why the Pod has not started yet ("" if it has, or nothing
// says).
func (p *Pod) Waiting() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.waiting
}

// podName is the Pod (and Secret) of a worker.
func podName(workerID string) string { return "apiary-" + workerID }

// Launch creates a worker's Secret (its token) and Pod, and watches the
// Pod. The Secret belongs to the Pod (deleted with it); both to the
// installation's owner ConfigMap.
func (c *Cluster) Launch(ctx context.Context, w Worker) (*Pod, error) {
	if len(w.Devices) == 0 {
		return nil, errors.New("a worker pod needs a device")
	}
	where, ok := c.Place(w.Devices[0])
	if !ok {
		return nil, fmt.Errorf("device %d is no device of the cluster", w.Devices[0])
	}
	if where.GPUs > 0 {
		where.GPUs = len(w.Devices)
	}
	owner, err := c.ensureOwner(ctx)
	if err != nil {
		return nil, err
	}
	name := podName(w.ID)
	ns := c.cfg.Namespace
	sec, err := createObj(ctx, c.api, resSecrets, ns, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: c.labels(w), OwnerReferences: []metav1.OwnerReference{owner}},
		Data:       map[string][]byte{tokenKey: []byte(w.Token)},
	})
	if err != nil {
		return nil, fmt.Errorf("the worker's secret: %w", err)
	}
	p := &Pod{c: c, name: name, grace: w.Grace, exited: make(chan struct{})}
	c.mu.Lock()
	c.watching[name] = p
	c.mu.Unlock()
	pod, err := createObj(ctx, c.api, resPods, ns, c.podSpec(w, name, where, owner))
	if err != nil {
		c.mu.Lock()
		delete(c.watching, name)
		c.mu.Unlock()
		_ = c.api.remove(context.WithoutCancel(ctx), resSecrets, ns, name, metav1.DeleteOptions{})
		return nil, fmt.Errorf("the worker's pod: %w", err)
	}
	// The token goes with its Pod.
	sec.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID}}
	if _, err := updateObj(ctx, c.api, resSecrets, ns, sec); err != nil {
		c.log.Warn("the worker's secret stays owned by the installation, not its pod", "pod", name, "err", err)
	}
	if cur, err := c.pods.Pods(ns).Get(name); err == nil {
		p.observe(cur)
	}
	return p, nil
}

func (c *Cluster) labels(w Worker) map[string]string {
	l := map[string]string{LabelName: workerName, LabelManagedBy: managedBy, LabelInstallation: c.cfg.Installation, LabelWorker: w.ID}
	if w.LifecycleID != "" {
		l[LabelLifecycle] = w.LifecycleID
	}
	if len(validation.IsValidLabelValue(w.ModelRef)) == 0 {
		l[LabelModel] = w.ModelRef // a ref no label can hold is in the annotation alone
	}
	return l
}

// podSpec is a worker's Pod: restartPolicy Never, the worker's command,
// its token from its Secret, its memory request, its GPUs, the models
// volume read-only, bound to its node.
func (c *Cluster) podSpec(w Worker, name string, where Placement, owner metav1.OwnerReference) *corev1.Pod {
	env := []corev1.EnvVar{
		{Name: PodIPEnv, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}},
		{Name: secret.WorkerTokenEnv, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: name}, Key: tokenKey}}},
	}
	for _, k := range sortedKeys(w.Env) {
		env = append(env, corev1.EnvVar{Name: k, Value: w.Env[k]})
	}
	res := corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceMemory: quantity(w.MemoryBytes)}}
	if where.GPUs > 0 {
		q := quantity(uint64(where.GPUs))
		res.Limits = corev1.ResourceList{ResourceGPU: q}
		res.Requests = corev1.ResourceList{ResourceGPU: q}
	}
	vol := corev1.Volume{Name: "models"}
	if c.cfg.ModelsPVC != "" {
		vol.PersistentVolumeClaim = &corev1.PersistentVolumeClaimVolumeSource{ClaimName: c.cfg.ModelsPVC, ReadOnly: true}
	} else {
		dir := corev1.HostPathDirectory
		vol.HostPath = &corev1.HostPathVolumeSource{Path: c.cfg.ModelsHostPath, Type: &dir}
	}
	grace := int64(max(w.Grace/time.Second, 1))
	no := false
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: c.cfg.Namespace, Labels: c.labels(w), OwnerReferences: []metav1.OwnerReference{owner},
			Annotations: map[string]string{
				annotModelRef: w.ModelRef, annotEstimate: strconv.FormatUint(w.MemoryBytes, 10),
				annotDevice: strconv.Itoa(where.GPUs), annotSpawnedAt: w.SpawnedAt.UTC().Format(time.RFC3339Nano),
			},
		},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			NodeSelector:                  map[string]string{"kubernetes.io/hostname": where.Node},
			AutomountServiceAccountToken:  &no,
			EnableServiceLinks:            &no,
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{
				Name: "worker", Image: c.cfg.Image, Command: c.cfg.Command, Args: w.Args, Env: env,
				Ports:        []corev1.ContainerPort{{Name: "http", ContainerPort: WorkerPort}},
				Resources:    res,
				VolumeMounts: []corev1.VolumeMount{{Name: "models", MountPath: c.cfg.ModelsDir, ReadOnly: true}},
			}},
			Volumes: []corev1.Volume{vol},
		},
	}
}

// Adopted is a running worker Pod of the installation found at start: a
// previous hive's (the queen restarted), for this one to take over.
type Adopted struct {
	Pod                       *Pod
	ID, LifecycleID, ModelRef string
	Device                    int
	GPUs                      int
	Estimate                  uint64
	Token                     string
	SpawnedAt                 time.Time
}

// Adopt lists the installation's worker Pods: the running ones it can
// read (labels, annotations, token) are returned and watched from now
// on; the others (ended, still pending: their ready callback went to a
// hive that is gone, unreadable) are deleted.
func (c *Cluster) Adopt(ctx context.Context) ([]Adopted, error) {
	pods, err := c.pods.Pods(c.cfg.Namespace).List(labels.SelectorFromSet(c.selector()))
	if err != nil {
		return nil, err
	}
	var out []Adopted
	for _, pod := range pods {
		a, err := c.adoptable(ctx, pod)
		if err != nil {
			c.log.Warn("deleting a worker pod of the installation that cannot be adopted", "pod", pod.Name, "reason", err)
			if err := c.api.remove(ctx, resPods, c.cfg.Namespace, pod.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				c.log.Error("cannot delete a worker pod", "pod", pod.Name, "err", err)
			}
			continue
		}
		c.mu.Lock()
		c.watching[pod.Name] = a.Pod
		c.mu.Unlock()
		a.Pod.observe(pod)
		out = append(out, a)
	}
	return out, nil
}

func (c *Cluster) adoptable(ctx context.Context, pod *corev1.Pod) (Adopted, error) {
	switch {
	case pod.DeletionTimestamp != nil:
		return Adopted{}, errors.New("being deleted")
	case pod.Status.Phase != corev1.PodRunning:
		return Adopted{}, fmt.Errorf("phase %s", pod.Status.Phase)
	case pod.Status.PodIP == "":
		return Adopted{}, errors.New("no pod IP")
	}
	a := Adopted{ID: pod.Labels[LabelWorker], LifecycleID: pod.Labels[LabelLifecycle], ModelRef: pod.Annotations[annotModelRef]}
	if a.ID == "" || a.ModelRef == "" || podName(a.ID) != pod.Name {
		return Adopted{}, errors.New("no worker id or model ref")
	}
	var err error
	if a.Estimate, err = strconv.ParseUint(pod.Annotations[annotEstimate], 10, 64); err != nil {
		return Adopted{}, fmt.Errorf("annotation %s: %w", annotEstimate, err)
	}
	if a.GPUs, err = strconv.Atoi(pod.Annotations[annotDevice]); err != nil {
		return Adopted{}, fmt.Errorf("annotation %s: %w", annotDevice, err)
	}
	if a.SpawnedAt, err = time.Parse(time.RFC3339Nano, pod.Annotations[annotSpawnedAt]); err != nil {
		return Adopted{}, fmt.Errorf("annotation %s: %w", annotSpawnedAt, err)
	}
	sec, err := getObj[corev1.Secret](ctx, c.api, resSecrets, c.cfg.Namespace, pod.Name)
	if err != nil {
		return Adopted{}, fmt.Errorf("its token: %w", err)
	}
	if a.Token = string(sec.Data[tokenKey]); a.Token == "" {
		return Adopted{}, errors.New("its secret holds no token")
	}
	a.Device = c.deviceOf(pod.Spec.NodeName, a.GPUs)
	grace := 30 * time.Second
	if g := pod.Spec.TerminationGracePeriodSeconds; g != nil {
		grace = time.Duration(*g) * time.Second
	}
	a.Pod = &Pod{c: c, name: pod.Name, grace: grace, exited: make(chan struct{})}
	return a, nil
}
