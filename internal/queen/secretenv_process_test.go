//go:build !race

package queen

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/keeper"
	"github.com/apiary-llm/apiary/internal/testbin"
	"github.com/apiary-llm/apiary/internal/testhub"
	"github.com/apiary-llm/apiary/internal/testmodel"
)

// Regression: no secret of the queen's environment reaches the
// processes it starts. A real queen with every secret set starts its local
// hive (which still gets the cluster token and HF_TOKEN, on its lifeline,
// registers with the one and pulls a gated model with the other) and the
// hive a worker: neither environment holds a secret of the queen's; the
// worker has only its own worker token. Nor do they hold what the
// operator's environment has for other programs (an ssh agent's socket,
// cloud credentials, another tool's Hugging Face token: the deny-list of
// apiary's own secrets let them all through) unless the operator names
// it: --pass-env HUGGING_FACE_HUB_TOKEN reaches the hive and its worker.
func TestChildrenInheritNoSecretOfTheQueen(t *testing.T) {
	const admin, cluster, hfToken = "admin-s3cret-0123456789", "cluster-s3cret-0123456789", "hf-s3cret-0123456789"
	var gguf bytes.Buffer
	if err := testmodel.Write(&gguf, testmodel.Options{Seed: 3}); err != nil {
		t.Fatal(err)
	}
	hub := testhub.New(t, "org/gated-GGUF", map[string][]byte{"gated-Q4_K_M.gguf": gguf.Bytes()})
	hub.Gate(hfToken)
	for k, v := range map[string]string{
		"HF_TOKEN":             hfToken,
		"APIARY_API_TOKEN":     "api-s3cret-0123456789",
		"APIARY_ADMIN_TOKEN":   admin,
		"APIARY_CLUSTER_TOKEN": cluster,
		"APIARY_WORKER_TOKEN":  "worker-s3cret-0123456789",
		"APIARY_DATABASE_URL":  "postgres://u:db-s3cret@127.0.0.1:1/db",
		"PGPASSWORD":           "pg-s3cret",
		// Not apiary's: only what the allow-list or --pass-env names.
		"SSH_AUTH_SOCK":          "/tmp/agent-s3cret.sock",
		"AWS_SECRET_ACCESS_KEY":  "aws-s3cret",
		"HUGGING_FACE_HUB_TOKEN": "hub-named-0123456789",
	} {
		t.Setenv(k, v)
	}
	dir := t.TempDir()
	q, url := startQueenProc(t, filepath.Join(dir, "queen"), "", "--database-url=", "--local-hive", "--pass-env=HUGGING_FACE_HUB_TOKEN",
		"--hive-arg=--models-dir="+ownModelsDir(t, dir), "--hive-arg=--worker-threads=1", "--hive-arg=--worker-ports=26000-26499")
	q.logs.wait(t, 0, "pool status changed", map[string]string{"pool_id": LocalPoolID, "to": "healthy"})
	resp, err := keeper.NewClient(url, admin, cluster).StartWorker(t.Context(), "tiny", LocalPoolID, nil, "secret env test")
	if err != nil {
		t.Fatal(err)
	}
	q.logs.wait(t, 0, "lifecycle row changed", map[string]string{"lifecycle_id": resp.LifecycleID, "to": "RUNNING"})
	if _, err := keeper.NewClient(url, admin, cluster).PullModel(t.Context(), LocalPoolID, api.PullModelRequest{Ref: "hf://org/gated-GGUF:Q4_K_M"}); err != nil {
		t.Errorf("the local hive cannot pull from a gated repository with the queen's HF_TOKEN: %v", err)
	} else {
		// The pull runs on in the hive: it ends (and writes no more in
		// the models directory) before the test's directories go.
		q.logs.wait(t, 0, "model pull ended", map[string]string{"pool_id": LocalPoolID, "state": api.PullDone})
	}
	for _, who := range []struct{ name, word string }{{"hive", " hive --"}, {"worker", " worker --worker-id"}} {
		pid := testbin.AwaitProcess(t, dir, who.word)
		data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
		if err != nil {
			t.Fatalf("environment of the %s: %v", who.name, err)
		}
		for _, kv := range bytes.Split(data, []byte{0}) {
			if strings.Contains(string(kv), "s3cret") {
				t.Errorf("the %s (pid %d) inherited %s", who.name, pid, kv)
			}
		}
		if !bytes.Contains(append([]byte{0}, data...), []byte("\x00HUGGING_FACE_HUB_TOKEN=hub-named-0123456789\x00")) {
			t.Errorf("the %s (pid %d) lacks HUGGING_FACE_HUB_TOKEN, which --pass-env names", who.name, pid)
		}
		if who.name == "worker" && !bytes.Contains(append([]byte{0}, data...), []byte("\x00APIARY_WORKER_TOKEN=")) {
			t.Errorf("the worker (pid %d) has no worker token of its own", pid)
		}
	}
}
