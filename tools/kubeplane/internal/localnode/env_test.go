package localnode

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

type fakeObjects struct {
	secrets    map[string]map[string][]byte
	configMaps map[string]map[string]string
}

func (f fakeObjects) Secret(_ context.Context, _, name string) (*corev1.Secret, error) {
	d, ok := f.secrets[name]
	if !ok {
		return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "secrets"}, name)
	}
	return &corev1.Secret{Data: d}, nil
}

func (f fakeObjects) ConfigMap(_ context.Context, _, name string) (*corev1.ConfigMap, error) {
	d, ok := f.configMaps[name]
	if !ok {
		return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "configmaps"}, name)
	}
	return &corev1.ConfigMap{Data: d}, nil
}

func field(path string) *corev1.EnvVarSource {
	return &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: path}}
}

func TestContainerEnvResolvesLikeAKubelet(t *testing.T) {
	optional := true
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "u-1",
			Labels: map[string]string{"app": "web"}, Annotations: map[string]string{"a": "b"}},
		Spec:   corev1.PodSpec{NodeName: "node-1"},
		Status: corev1.PodStatus{PodIP: "127.0.11.2", HostIP: "127.0.0.1"},
	}
	c := &corev1.Container{Env: []corev1.EnvVar{
		{Name: "NAME", ValueFrom: field("metadata.name")},
		{Name: "NS", ValueFrom: field("metadata.namespace")},
		{Name: "UID", ValueFrom: field("metadata.uid")},
		{Name: "APP", ValueFrom: field("metadata.labels['app']")},
		{Name: "ANN", ValueFrom: field("metadata.annotations['a']")},
		{Name: "NODE", ValueFrom: field("spec.nodeName")},
		{Name: "IP", ValueFrom: field("status.podIP")},
		{Name: "HOST", ValueFrom: field("status.hostIP")},
		{Name: "URL", Value: "http://$(IP):8080/$(UNSET)/$$(IP)"},
		{Name: "TOKEN", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: "s"}, Key: "k"}}},
		{Name: "MODE", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: "cm"}, Key: "mode"}}},
		{Name: "GONE", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: "absent"}, Key: "k", Optional: &optional}}},
	}}
	objs := fakeObjects{
		secrets:    map[string]map[string][]byte{"s": {"k": []byte("v")}},
		configMaps: map[string]map[string]string{"cm": {"mode": "fast"}},
	}
	env, err := containerEnv(t.Context(), objs, pod, c)
	if err != nil {
		t.Fatal(err)
	}
	want := []corev1.EnvVar{
		{Name: "NAME", Value: "p"}, {Name: "NS", Value: "ns"}, {Name: "UID", Value: "u-1"},
		{Name: "APP", Value: "web"}, {Name: "ANN", Value: "b"}, {Name: "NODE", Value: "node-1"},
		{Name: "IP", Value: "127.0.11.2"}, {Name: "HOST", Value: "127.0.0.1"},
		{Name: "URL", Value: "http://127.0.11.2:8080/$(UNSET)/$(IP)"},
		{Name: "TOKEN", Value: "v"}, {Name: "MODE", Value: "fast"},
	}
	if d := cmp.Diff(want, env); d != "" {
		t.Errorf("env (-want +got):\n%s", d)
	}

	c.Command = []string{"sh", "-c", "echo $(IP) $(NOPE)"}
	c.Args = []string{"$(NAME)"}
	path, args, err := commandLine(c, env, "/nonexistent:/bin:/usr/bin")
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Base(path) != "sh" || !cmp.Equal(args, []string{"-c", "echo 127.0.11.2 $(NOPE)", "p"}) {
		t.Errorf("command %s %q", path, args)
	}
}

func TestContainerEnvMissingReferenceFailsWithReason(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"}}
	for _, src := range []*corev1.EnvVarSource{
		{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "absent"}, Key: "k"}},
		{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "absent"}, Key: "k"}},
	} {
		_, err := containerEnv(t.Context(), fakeObjects{}, pod, &corev1.Container{Env: []corev1.EnvVar{{Name: "X", ValueFrom: src}}})
		var ce *configError
		if !errors.As(err, &ce) || ce.Reason != "CreateContainerConfigError" || !strings.Contains(ce.Msg, `"absent" not found`) {
			t.Errorf("error %v, want a CreateContainerConfigError naming the missing object", err)
		}
	}
}

func TestLookPathUsesNodePathFirst(t *testing.T) {
	dir := t.TempDir()
	tool := filepath.Join(dir, "sh")
	if err := os.WriteFile(tool, []byte("#!/bin/true\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	got, err := lookPath("sh", dir+":/bin:/usr/bin")
	if err != nil || got != tool {
		t.Errorf("lookPath = %q, %v; want %s", got, err, tool)
	}
	if _, err := lookPath("no-such-command-anywhere", dir); err == nil || !strings.Contains(err.Error(), "KUBE_NODE_PATH") {
		t.Errorf("error %v, want one that points at KUBE_NODE_PATH", err)
	}
}

func TestCheckVolumes(t *testing.T) {
	hostPath := func(p string) corev1.Volume {
		return corev1.Volume{Name: "v", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: p}}}
	}
	token := corev1.Volume{Name: "kube-api-access", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
		Sources: []corev1.VolumeProjection{{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token"}}}}}}
	pvc := corev1.Volume{Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "c"}}}
	empty := corev1.Volume{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}
	tests := []struct {
		name    string
		vols    []corev1.Volume
		mounts  []corev1.VolumeMount
		problem string // "" when the Pod can run
	}{
		{"hostPath at its own path", []corev1.Volume{hostPath("/srv/models")}, []corev1.VolumeMount{{Name: "v", MountPath: "/srv/models/"}}, ""},
		{"service-account token ignored", []corev1.Volume{token}, []corev1.VolumeMount{{Name: "kube-api-access", MountPath: "/var/run/secrets/kubernetes.io/serviceaccount"}}, ""},
		{"hostPath elsewhere", []corev1.Volume{hostPath("/srv/models")}, []corev1.VolumeMount{{Name: "v", MountPath: "/models"}}, "UnsupportedVolume"},
		{"pvc", []corev1.Volume{pvc}, nil, "UnsupportedVolume"},
		{"emptyDir mounted", []corev1.Volume{empty}, []corev1.VolumeMount{{Name: "scratch", MountPath: "/tmp/x"}}, "UnsupportedVolume"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pod := &corev1.Pod{Spec: corev1.PodSpec{Volumes: tt.vols}}
			err := checkVolumes(pod, &corev1.Container{VolumeMounts: tt.mounts})
			var ce *configError
			switch {
			case tt.problem == "" && err != nil:
				t.Errorf("unexpected error %v", err)
			case tt.problem != "" && (!errors.As(err, &ce) || ce.Reason != tt.problem || !strings.Contains(ce.Msg, "unsupported by the stand-in node")):
				t.Errorf("error %v, want %s saying the stand-in node does not support it", err, tt.problem)
			}
		})
	}
}

func TestTailOffset(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "log")
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("a\nb\nc\n")
	for n, want := range map[int]int64{1: 4, 2: 2, 3: 0, 9: 0} {
		f.Seek(0, 0)
		if got, err := tailOffset(f, n); err != nil || got != want {
			t.Errorf("tail %d: offset %d, %v; want %d", n, got, err, want)
		}
	}
}
