package kube

import (
	"context"
	"fmt"
	"reflect"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/watch"
	k8stesting "k8s.io/client-go/testing"
)

// fakeCore is core on client-go's object tracker (what its fake
// clientsets keep objects in, with watches), for the core group alone.
type fakeCore struct {
	k8stesting.ObjectTracker
}

var kinds = map[string]string{resPods: "Pod", resSecrets: "Secret", resConfigMaps: "ConfigMap", resNodes: "Node", resNamespaces: "Namespace"}

func newFakeCore(objs ...runtime.Object) (*fakeCore, error) {
	s, err := coreScheme()
	if err != nil {
		return nil, err
	}
	f := &fakeCore{k8stesting.NewObjectTracker(s, serializer.NewCodecFactory(s).UniversalDecoder())}
	for _, o := range objs {
		if err := f.Add(o); err != nil {
			return nil, err
		}
	}
	return f, nil
}

// IsWatchListSemanticsUnSupported: the tracker lists, then watches.
func (f *fakeCore) IsWatchListSemanticsUnSupported() bool { return true }

func (f *fakeCore) get(_ context.Context, res, ns, name string, into runtime.Object) error {
	obj, err := f.Get(corev1.SchemeGroupVersion.WithResource(res), ns, name)
	if err != nil {
		return err
	}
	return copyInto(obj, into)
}

func (f *fakeCore) list(_ context.Context, res, ns string, o metav1.ListOptions, into runtime.Object) error {
	obj, err := f.List(corev1.SchemeGroupVersion.WithResource(res), corev1.SchemeGroupVersion.WithKind(kinds[res]), ns)
	if err != nil {
		return err
	}
	sel, err := labels.Parse(o.LabelSelector)
	if err != nil {
		return err
	}
	items, err := meta.ExtractList(obj)
	if err != nil {
		return err
	}
	var keep []runtime.Object
	for _, it := range items {
		if m, err := meta.Accessor(it); err == nil && sel.Matches(labels.Set(m.GetLabels())) {
			keep = append(keep, it)
		}
	}
	if err := meta.SetList(obj, keep); err != nil {
		return err
	}
	return copyInto(obj, into)
}

func (f *fakeCore) watch(_ context.Context, res, ns string, o metav1.ListOptions) (watch.Interface, error) {
	w, err := f.Watch(corev1.SchemeGroupVersion.WithResource(res), ns)
	if err != nil {
		return nil, err
	}
	sel, err := labels.Parse(o.LabelSelector)
	if err != nil {
		w.Stop()
		return nil, err
	}
	return watch.Filter(w, func(e watch.Event) (watch.Event, bool) {
		m, err := meta.Accessor(e.Object)
		return e, err != nil || sel.Matches(labels.Set(m.GetLabels()))
	}), nil
}

func (f *fakeCore) create(_ context.Context, res, ns string, obj, into runtime.Object) error {
	if err := f.Create(corev1.SchemeGroupVersion.WithResource(res), obj, ns); err != nil {
		return err
	}
	return stored(obj, ns, into)
}

func (f *fakeCore) update(_ context.Context, res, ns string, obj, into runtime.Object) error {
	if err := f.Update(corev1.SchemeGroupVersion.WithResource(res), obj, ns); err != nil {
		return err
	}
	return stored(obj, ns, into)
}

// stored sets into to obj as the tracker stored it (in namespace ns).
// Not read back: the cluster may have deleted it already (an ended Pod).
func stored(obj runtime.Object, ns string, into runtime.Object) error {
	if err := copyInto(obj, into); err != nil {
		return err
	}
	m, err := meta.Accessor(into)
	if err != nil {
		return err
	}
	if m.GetNamespace() == "" {
		m.SetNamespace(ns)
	}
	return nil
}

func (f *fakeCore) remove(_ context.Context, res, ns, name string, _ metav1.DeleteOptions) error {
	return f.Delete(corev1.SchemeGroupVersion.WithResource(res), ns, name)
}

// copyInto sets *into to a copy of *obj, of the same type.
func copyInto(obj, into runtime.Object) error {
	src, dst := reflect.ValueOf(obj.DeepCopyObject()), reflect.ValueOf(into)
	if src.Type() != dst.Type() {
		return fmt.Errorf("a %s read into a %s", src.Type(), dst.Type())
	}
	dst.Elem().Set(src.Elem())
	return nil
}
