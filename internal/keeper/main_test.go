package keeper

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/apiary-llm/apiary/internal/testbin"
	"github.com/apiary-llm/apiary/internal/testmodel"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		testbin.Cleanup()
		os.Exit(code)
	}))
}

// teardownLimit bounds how long a tree may take to be gone after the
// keeper exits or is signalled: the cascade of a queen, a hive and a
// worker with short test timings.
const teardownLimit = 30 * time.Second

// writeModel writes the deterministic test model as dir/ref.gguf.
func writeModel(t *testing.T, dir, ref string) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, ref+".gguf")
	if err := testmodel.WriteFile(p, testmodel.Options{}); err != nil {
		t.Fatal(err)
	}
	return p
}

// operator is a queen and a hive that an operator started (persistent
// mode): the keeper must never stop them.
type operator struct {
	queen, hive *testbin.Proc
	url         string
	marker      string // every process of the operator's names it
}

func startOperator(t *testing.T) *operator {
	t.Helper()
	marker := t.TempDir()
	models := filepath.Join(marker, "models")
	writeModel(t, models, "tiny")
	q := testbin.Start(t, "operator queen", nil, "queen", "--addr", "127.0.0.1:0", "--data-dir", filepath.Join(marker, "queen"),
		"--flush-interval", "100ms", "--log-json")
	rec, _ := q.Lines.Wait(t, 0, "queen serving", nil)
	url := "http://" + rec.Attrs["addr"]
	h := testbin.Start(t, "operator hive", nil, "hive", "--addr", "127.0.0.1:0", "--queen", url, "--pool-id", "op-1",
		"--data-dir", filepath.Join(marker, "hive"), "--models-dir", models, "--worker-threads", "1",
		"--heartbeat-interval", "200ms", "--worker-ports", "27000-27999", "--log-json")
	q.Lines.Wait(t, 0, "pool status changed", map[string]string{"pool_id": "op-1", "to": "healthy"})
	return &operator{queen: q, hive: h, url: url, marker: marker}
}

// stillUp checks that the operator's queen, hive and worker all live.
func (o *operator) stillUp(t *testing.T) {
	t.Helper()
	for _, p := range []*testbin.Proc{o.queen, o.hive} {
		select {
		case <-p.Done():
			t.Errorf("the operator's %s exited; the keeper must not stop what it did not start", p.Name)
		default:
		}
	}
	workers := 0
	for _, pid := range testbin.Matching(o.marker) {
		if strings.Contains(testbin.Cmdline(pid), " worker ") {
			workers++
		}
	}
	if workers != 1 {
		t.Errorf("the operator's hive runs %d workers, want 1 (the worker stays up after the keeper)", workers)
	}
}

func (o *operator) stop(t *testing.T) {
	t.Helper()
	o.hive.Signal(syscall.SIGTERM)
	if code := o.hive.Wait(t); code != 0 {
		t.Errorf("operator hive exit %d", code)
	}
	o.queen.Signal(syscall.SIGTERM)
	if code := o.queen.Wait(t); code != 0 {
		t.Errorf("operator queen exit %d", code)
	}
	testbin.AwaitGone(t, o.marker, teardownLimit)
}

// keeper is one `apiary infer` process. Its TMPDIR is a fresh directory:
// the throwaway data dir of an ephemeral run is made in it, so every
// process of the tree it starts names it on its command line.
type keeper struct {
	*testbin.Proc
	marker string
}

func startKeeper(t *testing.T, args ...string) *keeper {
	t.Helper()
	return startKeeperEnv(t, nil, args...)
}

// startKeeperEnv is startKeeper with env added to the keeper's.
func startKeeperEnv(t *testing.T, env []string, args ...string) *keeper {
	t.Helper()
	marker := t.TempDir()
	p := testbin.Start(t, "keeper", append([]string{"TMPDIR=" + marker}, env...), append([]string{"infer"}, args...)...)
	return &keeper{Proc: p, marker: marker}
}

// ephemeralArgs are the flags of a keeper that finds no queen: the model
// by path, one worker thread, short hive timings.
func ephemeralArgs(t *testing.T, extra ...string) []string {
	t.Helper()
	model := writeModel(t, t.TempDir(), "tiny")
	args := []string{"--model", model, "--queen", "http://127.0.0.1:1", "--worker-threads", "1",
		"--queen-arg=--heartbeat-timeout=2s",
		"--queen-arg=--hive-arg=--stop-grace=2s", "--queen-arg=--hive-arg=--shutdown-ack=1s",
		"--queen-arg=--hive-arg=--worker-ports=28000-28999"}
	return append(args, extra...)
}

// testHoldEnv is the workers' test knob (worker.TestHoldEnv; not
// imported, so that this package's tests stay free of cgo).
const testHoldEnv = "APIARY_TEST_HOLD_DIR"

// startHeldKeeper starts an ephemeral keeper (ephemeralArgs with extra)
// whose worker holds its answer after its first 16 pieces (the test knob,
// passed down by the queen and the hive), so that a signal lands while
// tokens are being generated however fast the CPU is.
func startHeldKeeper(t *testing.T, extra ...string) *keeper {
	t.Helper()
	dir := t.TempDir()
	// 16 pieces first: one that is only control characters (a random
	// model's) prints nothing.
	if err := os.WriteFile(filepath.Join(dir, "tiny"), []byte("16"), 0o644); err != nil {
		t.Fatal(err)
	}
	pass := []string{"--queen-arg=--pass-env=" + testHoldEnv, "--queen-arg=--hive-arg=--pass-env=" + testHoldEnv}
	return startKeeperEnv(t, []string{testHoldEnv + "=" + dir}, ephemeralArgs(t, append(pass, extra...)...)...)
}

// gone checks that no process of the keeper's tree is left and that the
// throwaway data dir was removed.
func (k *keeper) gone(t *testing.T) {
	t.Helper()
	took := testbin.AwaitGone(t, k.marker, teardownLimit)
	if took > 0 {
		t.Logf("tree gone %s after the keeper exited", took.Round(time.Millisecond))
	}
	ents, err := os.ReadDir(k.marker)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "apiary-infer-") {
			t.Errorf("throwaway data dir %s left behind", e.Name())
		}
	}
}
