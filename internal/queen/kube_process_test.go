//go:build !race

package queen

// Kubernetes mode on a real control plane (scripts/kube.sh: etcd,
// kube-apiserver, kube-scheduler and kube-controller-manager of
// Kubernetes v1.37.2, and stand-in nodes that run each Pod's command as
// a local process): the queen's workers are Pods.

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/keeper"
	"github.com/apiary-llm/apiary/internal/testbin"
	"github.com/apiary-llm/apiary/internal/testmodel"
)

// kubePod is what the test reads of a Pod.
type kubePod struct {
	Metadata struct {
		Name              string            `json:"name"`
		Labels            map[string]string `json:"labels"`
		DeletionTimestamp *string           `json:"deletionTimestamp"`
	} `json:"metadata"`
	Spec struct {
		NodeName      string `json:"nodeName"`
		RestartPolicy string `json:"restartPolicy"`
	} `json:"spec"`
	Status struct {
		Phase string `json:"phase"`
		PodIP string `json:"podIP"`
	} `json:"status"`
}

func workerPods(t *testing.T, k *testbin.Kube) []kubePod {
	t.Helper()
	out := k.MustKubectl(t, "get", "pods", "-n", "apiary", "-l", "app.kubernetes.io/name=apiary-worker", "-o", "json")
	var list struct{ Items []kubePod }
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatalf("kubectl get pods: %v\n%s", err, out)
	}
	return list.Items
}

// chat asks model for a short answer through the queen at url: the
// status (0 when nothing answers) and the body.
func chat(t *testing.T, url, model string) (int, string) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": model, "max_tokens": 4,
		"messages": []map[string]string{{"role": "user", "content": "hello"}}})
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	return resp.StatusCode, b.String()
}

// waitFor polls cond until it holds or limit passes; it returns how long
// it took.
func waitFor(t *testing.T, what string, limit time.Duration, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > limit {
			t.Fatalf("not within %s: %s", limit, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return time.Since(start)
}

// TestProcessKubernetesMode: a queen with --kubernetes and a model of
// min_workers 1 runs its worker as a Pod and serves through it; the Pod
// deleted, its row ends and a new Pod serves; the queen SIGKILLed and
// restarted adopts the same Pod; a Pod of the installation without a
// row is deleted; deleting the owner ConfigMap deletes every worker Pod.
func TestProcessKubernetesMode(t *testing.T) {
	k := startKube(t, 2)
	k.MustKubectl(t, "create", "namespace", "apiary")
	// The manifests of deploy/kubernetes are valid for this release
	// (the API server checks them; nothing is made).
	k.MustKubectl(t, "apply", "--dry-run=server", "-f", filepath.Join("..", "..", "deploy", "kubernetes"))
	dir := t.TempDir()
	models := ownModelsDir(t, dir)
	cfg := filepath.Join(dir, "models.yaml")
	if err := os.WriteFile(cfg, []byte("models:\n  tiny:\n    min_workers: 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	qdir := filepath.Join(dir, "queen")
	args := []string{"--kubernetes", k.Kubeconfig, "--kube-namespace", "apiary", "--kube-models-hostpath", models,
		"--config", cfg, "--hive-arg=--worker-threads=1", "--hive-arg=--health-interval=500ms", "--heartbeat-timeout", "3s"}
	q, url := startQueenProc(t, qdir, "", args...)
	client := keeper.NewClient(url, "", "")
	running := func() []api.LifecycleRow {
		rows, err := client.Workers(t.Context(), keeper.WorkerFilter{Status: "RUNNING"})
		if err != nil {
			t.Fatal(err)
		}
		return rows
	}
	podOf := func(row string) (kubePod, bool) {
		for _, p := range workerPods(t, k) {
			if p.Metadata.Labels["apiary.dev/lifecycle-id"] == row && p.Metadata.DeletionTimestamp == nil {
				return p, true
			}
		}
		return kubePod{}, false
	}
	var rows []api.LifecycleRow
	took := waitFor(t, "a RUNNING row of tiny (min_workers 1)", 3*time.Minute, func() bool { rows = running(); return len(rows) == 1 })
	t.Logf("first worker running %s after the queen started", took.Round(time.Millisecond))
	if code, body := chat(t, url, "tiny"); code != http.StatusOK {
		t.Fatalf("chat through the queen: %d %s", code, body)
	}
	first := rows[0].ID
	pod, ok := podOf(first)
	if !ok || pod.Status.Phase != "Running" || pod.Spec.RestartPolicy != "Never" || !strings.HasPrefix(pod.Status.PodIP, "127.") {
		t.Fatalf("the worker of row %s is no Running pod of restartPolicy Never: %+v (found %v)", first, pod, ok)
	}
	t.Logf("row %s runs as pod %s on %s at %s", first, pod.Metadata.Name, pod.Spec.NodeName, pod.Status.PodIP)
	if rows[0].Pod != "apiary/"+pod.Metadata.Name || rows[0].Node != pod.Spec.NodeName {
		t.Errorf("row %s names pod %q on node %q, want apiary/%s on %s", first, rows[0].Pod, rows[0].Node, pod.Metadata.Name, pod.Spec.NodeName)
	}

	// The Pod deleted: its row ends, a new Pod serves.
	deleted := time.Now()
	k.MustKubectl(t, "delete", "pod", "-n", "apiary", pod.Metadata.Name, "--wait=false")
	waitFor(t, "the deleted pod's row ended", time.Minute, func() bool {
		rs, err := client.Workers(t.Context(), keeper.WorkerFilter{})
		if err != nil {
			t.Fatal(err)
		}
		i := slices.IndexFunc(rs, func(r api.LifecycleRow) bool { return r.ID == first })
		return i >= 0 && (rs[i].Status == "FAILED" || rs[i].Status == "STOPPED")
	})
	var second string
	waitFor(t, "a new pod serving", time.Minute, func() bool {
		rows = running()
		if len(rows) != 1 || rows[0].ID == first {
			return false
		}
		second = rows[0].ID
		p, ok := podOf(second)
		return ok && p.Status.Phase == "Running"
	})
	if code, body := chat(t, url, "tiny"); code != http.StatusOK {
		t.Fatalf("chat after the pod was replaced: %d %s", code, body)
	}
	t.Logf("pod deleted → a new pod serving in %s", time.Since(deleted).Round(time.Millisecond))
	secondPod, _ := podOf(second)

	// The queen SIGKILLed and restarted on its store: the same Pod is
	// adopted, no new one made.
	q.Signal(syscall.SIGKILL)
	<-q.done
	restarted := time.Now()
	q2, url2 := startQueenProc(t, qdir, "", append(args, "--addr", strings.TrimPrefix(url, "http://"))...)
	served := func(u string) func() bool {
		return func() bool {
			code, body := chat(t, u, "tiny")
			if code != http.StatusOK {
				t.Logf("chat: %d %s", code, api.Printable(body, 300))
			}
			return code == http.StatusOK
		}
	}
	waitFor(t, "a chat served after the restart", time.Minute, served(url2))
	t.Logf("queen SIGKILLed and restarted → served %s after the restart", time.Since(restarted).Round(time.Millisecond))
	rows = running()
	if len(rows) != 1 || rows[0].ID != second {
		t.Fatalf("after the restart, running rows %+v; want %s alone", rows, second)
	}
	pods := workerPods(t, k)
	if len(pods) != 1 || pods[0].Metadata.Name != secondPod.Metadata.Name {
		t.Fatalf("after the restart, pods %+v; want %s alone (adopted)", pods, secondPod.Metadata.Name)
	}

	// A Pod of the installation that no row knows is deleted.
	stray := strings.Replace(secondPod.Metadata.Name, "worker-", "worker-0000", 1)
	manifest := `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"` + stray + `","namespace":"apiary","labels":{
"app.kubernetes.io/name":"apiary-worker","app.kubernetes.io/managed-by":"apiary","apiary.dev/installation":"apiary",
"apiary.dev/worker-id":"` + strings.TrimPrefix(stray, "apiary-") + `"}},
"spec":{"restartPolicy":"Never","containers":[{"name":"worker","image":"apiary","command":["sleep","600"]}]}}`
	mf := filepath.Join(dir, "stray.json")
	if err := os.WriteFile(mf, []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
	k.MustKubectl(t, "apply", "-f", mf)
	q2.Signal(syscall.SIGKILL) // the next queen's hive finds it at its start
	<-q2.done
	q3, url3 := startQueenProc(t, qdir, "", append(args, "--addr", strings.TrimPrefix(url, "http://"))...)
	waitFor(t, "the stray pod deleted", time.Minute, func() bool {
		return !slices.ContainsFunc(workerPods(t, k), func(p kubePod) bool { return p.Metadata.Name == stray })
	})
	waitFor(t, "a chat served by the third queen", time.Minute, served(url3))

	// Deleting the owner ConfigMap deletes every worker Pod (Kubernetes'
	// garbage collector).
	k.MustKubectl(t, "delete", "configmap", "-n", "apiary", "apiary-apiary")
	waitFor(t, "the pods of the deleted owner gone", time.Minute, func() bool {
		return !slices.ContainsFunc(workerPods(t, k), func(p kubePod) bool { return p.Metadata.Name == secondPod.Metadata.Name })
	})

	// The queen stopped: it leaves no Pod.
	if err := q3.stop(t, syscall.SIGTERM); err != nil {
		t.Errorf("queen exit: %v", err)
	}
	waitFor(t, "no worker pod after the queen's shutdown", time.Minute, func() bool { return len(workerPods(t, k)) == 0 })
}

// TestProcessKubernetesSwap: one worker at a time (--max-loaded 1): a
// request for a second model evicts the first model's worker, whose Pod
// is drained and deleted; the second model's Pod serves.
func TestProcessKubernetesSwap(t *testing.T) {
	k := startKube(t, 1)
	k.MustKubectl(t, "create", "namespace", "apiary")
	dir := t.TempDir()
	models := ownModelsDir(t, dir)
	if err := testmodel.WriteFile(filepath.Join(models, "b.gguf"), testmodel.Options{Seed: 2}); err != nil {
		t.Fatal(err)
	}
	_, url := startQueenProc(t, filepath.Join(dir, "queen"), "", "--kubernetes", k.Kubeconfig, "--kube-models-hostpath", models,
		"--hive-arg=--worker-threads=1", "--hive-arg=--max-loaded=1", "--min-residency", "0")
	client := keeper.NewClient(url, "", "")
	waitFor(t, "the local hive's models listed", time.Minute, func() bool {
		m := aliasesOf(t, url)
		_, tiny := m["tiny"]
		_, b := m["b"]
		return tiny && b
	})
	if code, body := chat(t, url, "tiny"); code != http.StatusOK {
		t.Fatalf("chat with tiny: %d %s", code, body)
	}
	pods := workerPods(t, k)
	if len(pods) != 1 {
		t.Fatalf("pods after tiny: %+v", pods)
	}
	tinyPod := pods[0].Metadata.Name
	if code, body := chat(t, url, "b"); code != http.StatusOK {
		t.Fatalf("chat with b, evicting tiny: %d %s", code, body)
	}
	waitFor(t, "tiny's pod deleted", time.Minute, func() bool {
		return !slices.ContainsFunc(workerPods(t, k), func(p kubePod) bool { return p.Metadata.Name == tinyPod })
	})
	rows, err := client.Workers(t.Context(), keeper.WorkerFilter{Model: "tiny"})
	if err != nil || len(rows) != 1 || rows[0].Status != "STOPPED" {
		t.Fatalf("tiny's row after the swap: %+v %v; want STOPPED (evicted)", rows, err)
	}
	t.Logf("tiny's row: %s (%s)", rows[0].Status, rows[0].Reason)
	pods = workerPods(t, k)
	if len(pods) != 1 || pods[0].Metadata.Labels["apiary.dev/lifecycle-id"] == "" || pods[0].Status.Phase != "Running" {
		t.Fatalf("pods after the swap: %+v; want b's alone, Running", pods)
	}
}

// TestProcessKubernetesStandbyAdopts: two queens on PostgreSQL in
// Kubernetes mode; the active one SIGKILLed, the standby takes over and
// its hive adopts the worker Pod the other made: the same Pod serves, no
// new one is made.
func TestProcessKubernetesStandbyAdopts(t *testing.T) {
	k := startKube(t, 1)
	k.MustKubectl(t, "create", "namespace", "apiary")
	dir := t.TempDir()
	models := ownModelsDir(t, dir)
	cfg := filepath.Join(dir, "models.yaml")
	if err := os.WriteFile(cfg, []byte("models:\n  tiny:\n    min_workers: 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	db, err := pg.NewDatabase(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	addrs := []string{testbin.FreeAddr(t), testbin.FreeAddr(t)}
	args := []string{"--kubernetes", k.Kubeconfig, "--kube-models-hostpath", models, "--config", cfg,
		"--hive-arg=--worker-threads=1", "--lease-duration", failoverLease.String(), "--lease-renew", failoverRenew.String()}
	q1, url1 := startQueenProc(t, "", db, append([]string{"--addr", addrs[0], "--data-dir", t.TempDir()}, args...)...)
	q2 := startProc(t, "queen 2", nil, append([]string{"queen", "--addr", addrs[1], "--flush-interval", "100ms", "--database-url", db,
		"--data-dir", t.TempDir()}, args...)...)
	q2.logs.wait(t, 0, "queen standing by: another queen holds the database", nil)
	t.Cleanup(func() { _ = q2.stop(t, syscall.SIGTERM) })
	waitFor(t, "the active queen serves tiny", 3*time.Minute, func() bool { code, _ := chat(t, url1, "tiny"); return code == http.StatusOK })
	pods := workerPods(t, k)
	if len(pods) != 1 {
		t.Fatalf("pods: %+v", pods)
	}
	q1.Signal(syscall.SIGKILL)
	<-q1.done
	killed := time.Now()
	url2 := "http://" + addrs[1]
	waitFor(t, "the standby serves tiny", time.Minute, func() bool { code, _ := chat(t, url2, "tiny"); return code == http.StatusOK })
	t.Logf("active queen SIGKILLed → the standby served %s later", time.Since(killed).Round(time.Millisecond))
	if after := workerPods(t, k); len(after) != 1 || after[0].Metadata.Name != pods[0].Metadata.Name {
		t.Fatalf("pods after the takeover: %+v; want %s alone (adopted)", after, pods[0].Metadata.Name)
	}
}

// kubeTurn keeps the Kubernetes tests' control planes one at a time.
var kubeTurn sync.Mutex

// startKube starts a control plane of nodes stand-in nodes for a test
// that then runs after every serial test of the package (t.Parallel),
// one such test at a time: make test builds the control plane in the
// background beside the other tests (scripts/kube.sh background), and
// StartKube waits for that build.
func startKube(t *testing.T, nodes int) *testbin.Kube {
	t.Parallel()
	kubeTurn.Lock()
	t.Cleanup(kubeTurn.Unlock) // after the control plane is down
	return testbin.StartKube(t, nodes)
}
