package testbin

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Kube is a real Kubernetes control plane (etcd, kube-apiserver,
// kube-scheduler, kube-controller-manager of one pinned release) with
// stand-in nodes that run a Pod's command as a local process, started
// by scripts/kube.sh (docs/kubernetes.md); the test's end stops it.
type Kube struct {
	Dir        string
	Kubeconfig string
	script     string
}

// StartKube brings up a control plane with nodes stand-in nodes, whose
// Pods find this apiary binary on their PATH. Its first build takes
// minutes (then it is cached outside the tree).
func StartKube(t testing.TB, nodes int) *Kube {
	t.Helper()
	_, root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	k := &Kube{Dir: t.TempDir(), script: filepath.Join(root, "scripts", "kube.sh")}
	k.Kubeconfig = filepath.Join(k.Dir, "kubeconfig")
	bin := filepath.Dir(Path(t))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, k.script, "up", k.Dir, strconv.Itoa(nodes))
	cmd.Env = append(os.Environ(), "KUBE_NODE_PATH="+bin)
	t.Cleanup(func() {
		out, err := exec.Command(k.script, "down", k.Dir).CombinedOutput()
		if err != nil {
			t.Errorf("kube.sh down: %v\n%s", err, out)
		}
	})
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("kube.sh up %s %d: %v\n%s", k.Dir, nodes, err, out)
	}
	return k
}

// Kubectl runs kubectl against the control plane; its output, or the
// error with its output.
func (k *Kube) Kubectl(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, k.script, append([]string{"kubectl", k.Dir}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// MustKubectl is Kubectl failing the test on an error.
func (k *Kube) MustKubectl(t testing.TB, args ...string) string {
	t.Helper()
	out, err := k.Kubectl(args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}
