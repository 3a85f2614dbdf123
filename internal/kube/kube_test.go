package kube

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/apiary-llm/apiary/internal/gpu"
	"github.com/apiary-llm/apiary/internal/secret"
)

// These tests run the package against client-go's object tracker, with
// watches (fakeCore); the process test in internal/queen runs
// it against a real control plane (scripts/kube.sh).

func node(name string, memGiB int64, gpus int64, labels map[string]string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Status: corev1.NodeStatus{
			Allocatable: corev1.ResourceList{corev1.ResourceMemory: *resource.NewQuantity(memGiB<<30, resource.BinarySI)},
			Conditions:  []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
		}}
	if gpus > 0 {
		n.Status.Allocatable[ResourceGPU] = *resource.NewQuantity(gpus, resource.DecimalSI)
	}
	return n
}

func testCluster(t *testing.T, objs ...any) (*Cluster, *fakeCore) {
	t.Helper()
	var ros []runtime.Object
	for _, o := range objs {
		ros = append(ros, o.(runtime.Object))
	}
	cs, err := newFakeCore(append([]runtime.Object{&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "apiary"}}}, ros...)...)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Kubeconfig: "test", ModelsHostPath: "/models", ModelsDir: "/models", Logger: slog.New(slog.DiscardHandler)}.withDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	c := newCluster(cfg, cs)
	if err := c.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, cs
}

func eventually(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !ok(); {
		if time.Now().After(deadline) {
			t.Fatalf("not within 10s: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestConfigSaysWhatIsWrong(t *testing.T) {
	err := Config{Namespace: "Bad_NS", ModelsPVC: "m", ModelsHostPath: "/x", ModelsDir: "rel"}.withDefaults().Validate()
	for _, want := range []string{"Kubeconfig", "Namespace", "Bad_NS", "not both", "ModelsDir", "\"rel\""} {
		if err == nil || !contains(err.Error(), want) {
			t.Errorf("error %v does not say %q", err, want)
		}
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

func TestDevicesAreTheNodes(t *testing.T) {
	other := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: "default"},
		Spec: corev1.PodSpec{NodeName: "a", Containers: []corev1.Container{{Name: "db", Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceMemory: *resource.NewQuantity(2<<30, resource.BinarySI)},
			Limits:   corev1.ResourceList{ResourceGPU: *resource.NewQuantity(1, resource.DecimalSI)}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	cordoned := node("c", 4, 0, nil)
	cordoned.Spec.Unschedulable = true
	c, _ := testCluster(t, node("a", 16, 2, map[string]string{LabelGPUMemory: "24576"}), node("b", 8, 1, nil), cordoned, other)
	devs, err := c.Devices(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, d := range devs {
		got = append(got, d.Kind+" "+d.Name)
	}
	want := []string{"cuda a GPU 0", "cuda a GPU 1", "cpu a", "cuda b GPU 0", "cpu b", "cpu c"}
	if !slices.Equal(got, want) {
		t.Fatalf("devices %v, want %v", got, want)
	}
	if devs[0].TotalBytes != 24<<30 || devs[0].FreeBytes != 24<<30 || devs[1].FreeBytes != 0 {
		t.Errorf("node a's GPUs: %+v %+v; want 24 GiB each, the second another Pod's", devs[0], devs[1])
	}
	if devs[2].TotalBytes != 16<<30 || devs[2].FreeBytes != 14<<30 {
		t.Errorf("node a's CPU: total %d free %d, want 16 GiB less the other Pod's 2", devs[2].TotalBytes, devs[2].FreeBytes)
	}
	if devs[3].Unusable == "" || !contains(devs[3].Unusable, LabelGPUMemory) {
		t.Errorf("a GPU of unknown memory is usable: %+v", devs[3])
	}
	if !contains(devs[5].Unusable, "cordoned") {
		t.Errorf("a cordoned node is usable: %+v", devs[5])
	}
	if p, ok := c.Place(devs[1].ID); !ok || p != (Placement{Node: "a", GPUs: 1}) {
		t.Errorf("place on %d: %+v", devs[1].ID, p)
	}
	if p, ok := c.Place(devs[4].ID); !ok || p != (Placement{Node: "b"}) {
		t.Errorf("place on %d: %+v", devs[4].ID, p)
	}
}

func TestLaunchMakesTheWorkerPod(t *testing.T) {
	c, cs := testCluster(t, node("a", 16, 0, nil))
	devs, _ := c.Devices(t.Context())
	ctx := t.Context()
	p, err := c.Launch(ctx, Worker{ID: "worker-1", LifecycleID: "wk-1", ModelRef: "tiny", Devices: []int{devs[0].ID},
		MemoryBytes: 100 << 20, Token: "tok", Args: []string{"worker", "--host", "$(POD_IP)"}, Env: map[string]string{"HF_HOME": "/cache"},
		SpawnedAt: time.Now(), Grace: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	pod, err := getObj[corev1.Pod](ctx, cs, resPods, "apiary", "apiary-worker-1")
	if err != nil {
		t.Fatal(err)
	}
	spec := pod.Spec
	ct := spec.Containers[0]
	switch {
	case spec.RestartPolicy != corev1.RestartPolicyNever:
		t.Errorf("restartPolicy %s", spec.RestartPolicy)
	case pod.Labels[LabelLifecycle] != "wk-1" || pod.Labels[LabelWorker] != "worker-1" || pod.Labels[LabelInstallation] != "apiary" || pod.Labels[LabelModel] != "tiny":
		t.Errorf("labels %v", pod.Labels)
	case len(pod.OwnerReferences) != 1 || pod.OwnerReferences[0].Kind != "ConfigMap" || pod.OwnerReferences[0].Name != "apiary-apiary":
		t.Errorf("owners %v", pod.OwnerReferences)
	case spec.NodeSelector["kubernetes.io/hostname"] != "a":
		t.Errorf("node selector %v", spec.NodeSelector)
	case ct.Resources.Requests.Memory().Value() != 100<<20:
		t.Errorf("requests %v", ct.Resources.Requests)
	case ct.Image != DefaultImage() || !slices.Equal(ct.Command, []string{"apiary"}) || !slices.Equal(ct.Args, []string{"worker", "--host", "$(POD_IP)"}):
		t.Errorf("container %s %v %v", ct.Image, ct.Command, ct.Args)
	case len(ct.VolumeMounts) != 1 || ct.VolumeMounts[0].MountPath != "/models" || !ct.VolumeMounts[0].ReadOnly || spec.Volumes[0].HostPath == nil || spec.Volumes[0].HostPath.Path != "/models":
		t.Errorf("models volume %v %v", ct.VolumeMounts, spec.Volumes)
	case *spec.TerminationGracePeriodSeconds != 5:
		t.Errorf("grace %d", *spec.TerminationGracePeriodSeconds)
	}
	env := map[string]corev1.EnvVar{}
	for _, e := range ct.Env {
		env[e.Name] = e
	}
	if e := env[PodIPEnv]; e.ValueFrom == nil || e.ValueFrom.FieldRef.FieldPath != "status.podIP" {
		t.Errorf("POD_IP %+v", e)
	}
	if e := env[secret.WorkerTokenEnv]; e.Value != "" || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef.Name != "apiary-worker-1" {
		t.Errorf("the token is not from the worker's secret: %+v", e)
	}
	if env["HF_HOME"].Value != "/cache" {
		t.Errorf("env %v", ct.Env)
	}
	sec, err := getObj[corev1.Secret](ctx, cs, resSecrets, "apiary", "apiary-worker-1")
	if err != nil || string(sec.Data[tokenKey]) != "tok" || len(sec.OwnerReferences) != 1 || sec.OwnerReferences[0].Kind != "Pod" {
		t.Fatalf("secret %+v, %v: want the token, owned by the pod", sec, err)
	}

	// The Pod runs, gets an IP, and its container exits 3.
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.7"}
	if _, err := updateObj(ctx, cs, resPods, "apiary", pod); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the pod's IP", func() bool { return p.IP() == "10.0.0.7" })
	pod.Status = corev1.PodStatus{Phase: corev1.PodFailed, PodIP: "10.0.0.7", ContainerStatuses: []corev1.ContainerStatus{{
		Name: "worker", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 3, Reason: "Error"}}}}}
	if _, err := updateObj(ctx, cs, resPods, "apiary", pod); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Exited():
	case <-time.After(10 * time.Second):
		t.Fatal("a Failed pod has not exited")
	}
	if ex := p.Exit(); ex.Code != 3 || !contains(ex.String(), "Failed") {
		t.Errorf("exit %+v (%s), want code 3 of a Failed pod", ex, ex)
	}
}

func TestDeletedPodExits(t *testing.T) {
	c, cs := testCluster(t, node("a", 16, 0, nil))
	devs, _ := c.Devices(t.Context())
	p, err := c.Launch(t.Context(), Worker{ID: "worker-2", ModelRef: "tiny", Devices: []int{devs[0].ID}, Token: "t", SpawnedAt: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	if err := cs.remove(t.Context(), resPods, "apiary", p.Name(), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Exited():
	case <-time.After(10 * time.Second):
		t.Fatal("a deleted pod has not exited")
	}
	if !contains(p.Exit().String(), "deleted") {
		t.Errorf("exit %s does not say the pod was deleted", p.Exit())
	}
	// Deleting the owner ConfigMap: the next worker makes it again.
	if err := cs.remove(t.Context(), resConfigMaps, "apiary", "apiary-apiary", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Launch(t.Context(), Worker{ID: "worker-3", ModelRef: "tiny", Devices: []int{devs[0].ID}, Token: "t", SpawnedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if _, err := getObj[corev1.ConfigMap](t.Context(), cs, resConfigMaps, "apiary", "apiary-apiary"); err != nil {
		t.Fatalf("the owner was not made again: %v", err)
	}
}

func TestAdoptTakesRunningPodsAndDeletesTheRest(t *testing.T) {
	ctx := context.Background()
	pod := func(id string, phase corev1.PodPhase) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: podName(id), Namespace: "apiary",
				Labels: map[string]string{LabelManagedBy: managedBy, LabelInstallation: "apiary", LabelWorker: id, LabelLifecycle: "wk-" + id},
				Annotations: map[string]string{annotModelRef: "tiny", annotEstimate: "1000", annotDevice: "0",
					annotSpawnedAt: "2026-11-29T09:00:00Z"}},
			Spec:   corev1.PodSpec{NodeName: "a"},
			Status: corev1.PodStatus{Phase: phase, PodIP: "10.0.0.9"},
		}
	}
	tok := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: podName("worker-run"), Namespace: "apiary"}, Data: map[string][]byte{tokenKey: []byte("tok")}}
	noSecret := pod("worker-nosecret", corev1.PodRunning)
	c, cs := testCluster(t, node("a", 16, 0, nil), pod("worker-run", corev1.PodRunning), pod("worker-pending", corev1.PodPending), noSecret, tok)
	got, err := c.Adopt(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].ID != "worker-run" || got[0].LifecycleID != "wk-worker-run" || got[0].Token != "tok" || got[0].Estimate != 1000 || got[0].Pod.IP() != "10.0.0.9" {
		t.Fatalf("adopted %+v, want worker-run alone", got)
	}
	devs, _ := c.Devices(ctx)
	if i := slices.IndexFunc(devs, func(d gpu.Device) bool { return d.ID == got[0].Device }); i < 0 || devs[i].Name != "a" {
		t.Errorf("adopted on device %d, not node a's CPU (%v)", got[0].Device, devs)
	}
	for _, gone := range []string{"worker-pending", "worker-nosecret"} {
		if _, err := getObj[corev1.Pod](ctx, cs, resPods, "apiary", podName(gone)); err == nil {
			t.Errorf("pod of %s not deleted", gone)
		}
	}
}

func TestReasonsSayWhatKubernetesSays(t *testing.T) {
	evicted := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "apiary-worker-9"}, Status: corev1.PodStatus{Phase: corev1.PodFailed,
		Reason: "Evicted", Message: "The node was low on resource: memory."}}
	if s := exitOf(evicted, "x").String(); !contains(s, "Evicted") || !contains(s, "low on resource") {
		t.Errorf("an evicted pod's exit: %q", s)
	}
	pending := &corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{{
		Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: "Unschedulable", Message: "0/2 nodes are available: 2 Insufficient memory."}}}}
	if s := waitingReason(pending); !contains(s, "Unschedulable") || !contains(s, "Insufficient memory") {
		t.Errorf("an unschedulable pod's reason: %q", s)
	}
	pulling := &corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodPending, ContainerStatuses: []corev1.ContainerStatus{{
		State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ImagePullBackOff", Message: "apiary:x not found"}}}}}}
	if s := waitingReason(pulling); !contains(s, "ImagePullBackOff") {
		t.Errorf("a pod whose image is missing: %q", s)
	}
}
