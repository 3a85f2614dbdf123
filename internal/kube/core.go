package kube

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
)

// The kinds of Kubernetes' core API group (v1) the cluster reads and
// writes, by their resource names.
const (
	resPods       = "pods"
	resSecrets    = "secrets"
	resConfigMaps = "configmaps"
	resNodes      = "nodes"      // not namespaced
	resNamespaces = "namespaces" // not namespaced
)

// core is what the cluster asks of Kubernetes' core API group: objects of
// one resource, in namespace ns ("" for nodes and namespaces), read into
// the object given. It is a REST client of that group alone (restCore):
// client-go's typed client of it registers every API group in its scheme,
// which links about 150 packages more into the binary and doubled
// internal/kube's share of a cold build.
type core interface {
	get(ctx context.Context, res, ns, name string, into runtime.Object) error
	list(ctx context.Context, res, ns string, o metav1.ListOptions, into runtime.Object) error
	watch(ctx context.Context, res, ns string, o metav1.ListOptions) (watch.Interface, error)
	create(ctx context.Context, res, ns string, obj, into runtime.Object) error
	update(ctx context.Context, res, ns string, obj, into runtime.Object) error
	remove(ctx context.Context, res, ns, name string, o metav1.DeleteOptions) error
}

// coreScheme knows the core group's kinds, and the options and statuses
// of API requests.
func coreScheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	if err := corev1.AddToScheme(s); err != nil { // with metav1's kinds for v1
		return nil, err
	}
	return s, nil
}

// restCore is core over HTTP, to an API server.
type restCore struct {
	rc     *rest.RESTClient
	params runtime.ParameterCodec
}

func newRESTCore(cfg *rest.Config) (*restCore, error) {
	s, err := coreScheme()
	if err != nil {
		return nil, err
	}
	c := rest.CopyConfig(cfg)
	c.APIPath = "/api"
	c.GroupVersion = &corev1.SchemeGroupVersion
	c.NegotiatedSerializer = serializer.NewCodecFactory(s).WithoutConversion()
	rc, err := rest.RESTClientFor(c)
	if err != nil {
		return nil, err
	}
	return &restCore{rc: rc, params: runtime.NewParameterCodec(s)}, nil
}

func (a *restCore) at(r *rest.Request, res, ns string) *rest.Request {
	return r.NamespaceIfScoped(ns, ns != "").Resource(res)
}

func (a *restCore) get(ctx context.Context, res, ns, name string, into runtime.Object) error {
	return a.at(a.rc.Get(), res, ns).Name(name).Do(ctx).Into(into)
}

func (a *restCore) list(ctx context.Context, res, ns string, o metav1.ListOptions, into runtime.Object) error {
	return a.at(a.rc.Get(), res, ns).VersionedParams(&o, a.params).Do(ctx).Into(into)
}

func (a *restCore) watch(ctx context.Context, res, ns string, o metav1.ListOptions) (watch.Interface, error) {
	o.Watch = true
	return a.at(a.rc.Get(), res, ns).VersionedParams(&o, a.params).Watch(ctx)
}

func (a *restCore) create(ctx context.Context, res, ns string, obj, into runtime.Object) error {
	return a.at(a.rc.Post(), res, ns).Body(obj).Do(ctx).Into(into)
}

func (a *restCore) update(ctx context.Context, res, ns string, obj, into runtime.Object) error {
	m, err := meta.Accessor(obj)
	if err != nil {
		return fmt.Errorf("update %s: %w", res, err)
	}
	return a.at(a.rc.Put(), res, ns).Name(m.GetName()).Body(obj).Do(ctx).Into(into)
}

func (a *restCore) remove(ctx context.Context, res, ns, name string, o metav1.DeleteOptions) error {
	return a.at(a.rc.Delete(), res, ns).Name(name).Body(&o).Do(ctx).Error()
}

// object is a pointer to a Kubernetes object type T.
type object[T any] interface {
	*T
	runtime.Object
}

// read returns a new T that fill read the server's answer into.
func read[T any, PT object[T]](fill func(into runtime.Object) error) (PT, error) {
	out := PT(new(T))
	if err := fill(out); err != nil {
		return nil, err
	}
	return out, nil
}

// getObj reads one object.
func getObj[T any, PT object[T]](ctx context.Context, api core, res, ns, name string) (PT, error) {
	return read[T, PT](func(into runtime.Object) error { return api.get(ctx, res, ns, name, into) })
}

// createObj creates obj and returns it as the server stored it.
func createObj[T any, PT object[T]](ctx context.Context, api core, res, ns string, obj PT) (PT, error) {
	return read[T, PT](func(into runtime.Object) error { return api.create(ctx, res, ns, obj, into) })
}

// updateObj replaces obj and returns it as the server stored it.
func updateObj[T any, PT object[T]](ctx context.Context, api core, res, ns string, obj PT) (PT, error) {
	return read[T, PT](func(into runtime.Object) error { return api.update(ctx, res, ns, obj, into) })
}
