package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
)

// Labels and annotations of every object apiary makes.
const (
	LabelName         = "app.kubernetes.io/name"
	LabelManagedBy    = "app.kubernetes.io/managed-by"
	LabelInstallation = "apiary.dev/installation"
	LabelWorker       = "apiary.dev/worker-id"
	LabelLifecycle    = "apiary.dev/lifecycle-id"
	LabelModel        = "apiary.dev/model"

	annotModelRef  = "apiary.dev/model-ref"
	annotEstimate  = "apiary.dev/estimate-bytes"
	annotDevice    = "apiary.dev/device"
	annotSpawnedAt = "apiary.dev/spawned-at"

	workerName = "apiary-worker"
	managedBy  = "apiary"
	tokenKey   = "token"
)

// Cluster is the hive's view of a Kubernetes cluster: a client, the
// worker Pods of its installation and the nodes, both watched (informers).
// Create it with New, start it with Start, stop it with Close.
type Cluster struct {
	cfg  Config
	log  *slog.Logger
	api  core // the core API group's client
	pods corelisters.PodLister
	// allPods are every Pod of the cluster (to count what others hold
	// on a node), nodes every node.
	allPods corelisters.PodLister
	nodes   corelisters.NodeLister
	// informers watch the installation's worker Pods, every Pod and
	// every node; the first is podInformer.
	informers   []cache.SharedIndexInformer
	podInformer cache.SharedIndexInformer
	stop        chan struct{}
	stopOnce    sync.Once
	watchers    sync.WaitGroup // the informers' goroutines

	removals sync.WaitGroup // deletions of ended Pods under way

	mu       sync.Mutex
	watching map[string]*Pod // by Pod name; guarded by mu
	devices  deviceIDs       // guarded by mu
}

// New connects to the cluster cfg names; nothing is watched until Start.
func New(cfg Config) (*Cluster, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	var rc *rest.Config
	var err error
	if cfg.Kubeconfig == InCluster {
		rc, err = rest.InClusterConfig()
	} else {
		rc, err = clientcmd.BuildConfigFromFlags("", cfg.Kubeconfig)
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes %s: %w", cfg.Kubeconfig, err)
	}
	rc.UserAgent = "apiary"
	api, err := newRESTCore(rc)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return newCluster(cfg, api), nil
}

// newCluster watches through api. Whether the server streams its lists
// in a watch (client-go's watch-list semantics: an API server does, the
// tests' object tracker does not) is api's to say
// (IsWatchListSemanticsUnSupported).
func newCluster(cfg Config, api core) *Cluster {
	c := &Cluster{cfg: cfg, log: cfg.Logger.With("component", "kube", "namespace", cfg.Namespace), api: api,
		stop: make(chan struct{}), watching: map[string]*Pod{}}
	ours := labels.SelectorFromSet(c.selector()).String()
	// informer watches the objects of res in ns ("": all) whose labels
	// match selector ("": all); newList makes an empty list of them.
	informer := func(obj runtime.Object, newList func() runtime.Object, res, ns, selector string) cache.SharedIndexInformer {
		lw := &cache.ListWatch{
			ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
				o.LabelSelector = selector
				list := newList()
				return list, api.list(ctx, res, ns, o, list)
			},
			WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
				o.LabelSelector = selector
				return api.watch(ctx, res, ns, o)
			},
		}
		return cache.NewSharedIndexInformer(cache.ToListWatcherWithWatchListSemantics(lw, api), obj, 0,
			cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	}
	podList := func() runtime.Object { return &corev1.PodList{} }
	c.podInformer = informer(&corev1.Pod{}, podList, resPods, cfg.Namespace, ours)
	all := informer(&corev1.Pod{}, podList, resPods, metav1.NamespaceAll, "")
	nodes := informer(&corev1.Node{}, func() runtime.Object { return &corev1.NodeList{} }, resNodes, "", "")
	c.informers = []cache.SharedIndexInformer{c.podInformer, all, nodes}
	c.pods = corelisters.NewPodLister(c.podInformer.GetIndexer())
	c.allPods = corelisters.NewPodLister(all.GetIndexer())
	c.nodes = corelisters.NewNodeLister(nodes.GetIndexer())
	return c
}

// selector are the labels of every worker Pod of the installation.
func (c *Cluster) selector() labels.Set {
	return labels.Set{LabelManagedBy: managedBy, LabelInstallation: c.cfg.Installation}
}

// Start checks the namespace, starts the watches and waits until they
// have listed what exists (or ctx ends).
func (c *Cluster) Start(ctx context.Context) error {
	if _, err := getObj[corev1.Namespace](ctx, c.api, resNamespaces, "", c.cfg.Namespace); err != nil {
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("kubernetes namespace %q does not exist: create it (kubectl create namespace %s) or give another", c.cfg.Namespace, c.cfg.Namespace)
		}
		return fmt.Errorf("kubernetes namespace %q: %w", c.cfg.Namespace, err)
	}
	if _, err := c.podInformer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { c.seen(o) },
		UpdateFunc: func(_, o any) { c.seen(o) },
		DeleteFunc: func(o any) { c.deleted(o) },
	}); err != nil {
		return err
	}
	for _, inf := range c.informers {
		c.watchers.Go(func() { inf.Run(c.stop) })
	}
	wait, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	synced := make([]cache.InformerSynced, len(c.informers))
	for i, inf := range c.informers {
		synced[i] = inf.HasSynced
	}
	if !cache.WaitForCacheSync(wait.Done(), synced...) {
		return fmt.Errorf("kubernetes: the worker pods, every pod and the nodes were not listed within 60s: %w", errors.Join(ctx.Err(), wait.Err()))
	}
	c.log.Info("kubernetes cluster watched", "installation", c.cfg.Installation, "image", c.cfg.Image)
	return nil
}

// Close stops the watches; the Pods stay.
func (c *Cluster) Close() error {
	c.stopOnce.Do(func() {
		close(c.stop)
		c.watchers.Wait()
		c.removals.Wait()
	})
	return nil
}

// seen hands a Pod's new state to its watcher.
func (c *Cluster) seen(o any) {
	pod, ok := o.(*corev1.Pod)
	if !ok {
		return
	}
	c.mu.Lock()
	p := c.watching[pod.Name]
	c.mu.Unlock()
	if p != nil {
		p.observe(pod)
	}
}

// deleted tells a Pod's watcher that it is gone.
func (c *Cluster) deleted(o any) {
	if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = t.Obj
	}
	pod, ok := o.(*corev1.Pod)
	if !ok {
		return
	}
	c.mu.Lock()
	p := c.watching[pod.Name]
	delete(c.watching, pod.Name)
	c.mu.Unlock()
	if p != nil {
		p.observe(pod)
		p.end(exitOf(pod, "the pod was deleted"))
	}
}

// ensureOwner returns the reference to the installation's owner
// ConfigMap, creating it when it is missing (deleted, every worker Pod
// went with it; the next worker makes it again).
func (c *Cluster) ensureOwner(ctx context.Context) (metav1.OwnerReference, error) {
	ns, name := c.cfg.Namespace, ownerName(c.cfg.Installation)
	cm, err := getObj[corev1.ConfigMap](ctx, c.api, resConfigMaps, ns, name)
	if apierrors.IsNotFound(err) {
		cm, err = createObj(ctx, c.api, resConfigMaps, ns, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
				LabelName: "apiary", LabelManagedBy: managedBy, LabelInstallation: c.cfg.Installation}},
			Data: map[string]string{"about": "Owner of every worker Pod of apiary installation " + c.cfg.Installation +
				": deleting it deletes them all (Kubernetes' garbage collector)."},
		})
		if apierrors.IsAlreadyExists(err) {
			cm, err = getObj[corev1.ConfigMap](ctx, c.api, resConfigMaps, ns, name)
		}
	}
	if err != nil {
		return metav1.OwnerReference{}, fmt.Errorf("the owner ConfigMap %s/%s: %w", ns, name, err)
	}
	return metav1.OwnerReference{APIVersion: "v1", Kind: "ConfigMap", Name: cm.Name, UID: cm.UID}, nil
}
