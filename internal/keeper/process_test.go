//go:build !race

package keeper

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/testbin"
)

// The keeper as a person runs it: the real binary, a real queen, hive and
// worker. Tests are named after the cases of what dies when, and of the
// two modes of `apiary infer` (docs/ownership.md).

// Persistent mode. Checklist: "Detect if queen-rbee is already running",
// "If not spawned, do NOT send SIGTERM to queen-rbee", "Exit after command
// completes"; integration: "Persistent mode: rbee-hive and worker survive
// rbee-keeper exit".
func TestWhatDiesWhen_AfterInferenceCompletes_KeeperExitsQueenHiveWorkerStay(t *testing.T) {
	op := startOperator(t)
	for i := range 2 { // the second run reuses the worker
		k := startKeeper(t, "--model", "tiny", "--prompt", "hello bees", "--max-tokens", "8", "--queen", op.url)
		if code := k.Wait(t); code != 0 {
			t.Fatalf("run %d: keeper exit %d; stderr:\n%s", i, code, k.Lines.String())
		}
		if k.Stdout() == "" {
			t.Errorf("run %d: no answer on stdout", i)
		}
		if k.Lines.Has("starting one", nil) {
			t.Errorf("run %d: the keeper started a queen although one answers", i)
		}
		op.stillUp(t)
	}
	op.stop(t)
}

// Ephemeral mode. Checklist: "If not running, spawn queen-rbee as child
// process", "If spawned, send SIGTERM to queen-rbee on exit", "Stream SSE
// output from queen-rbee to stdout", "Exit after command completes";
// BDD MVP-012 (hive spawned by the keeper's queen).
func TestEphemeral_SpawnsQueenAndLocalHive_StreamsTokens_StopsEverything(t *testing.T) {
	k := startKeeper(t, ephemeralArgs(t, "--prompt", "hello bees", "--max-tokens", "16")...)
	queen := testbin.AwaitProcess(t, k.marker, " queen ")
	if s := testbin.Cmdline(queen); !strings.Contains(s, "--owner keeper") || !strings.Contains(s, "--lifeline stdin") {
		t.Errorf("ephemeral queen command line: %s", s)
	}
	if code := k.Wait(t); code != 0 {
		t.Fatalf("keeper exit %d; stderr:\n%s", code, k.Lines.String())
	}
	if k.Stdout() == "" {
		t.Errorf("no answer on stdout; stderr:\n%s", k.Lines.String())
	}
	if !k.Lines.Has("no queen at http://127.0.0.1:1: starting one", nil) {
		t.Errorf("no word on stderr of the ephemeral mode:\n%s", k.Lines.String())
	}
	k.gone(t)
}

// A model ref the models dir does not have is a usage error before
// anything starts.
func TestEphemeral_UnknownModelIsUsageError(t *testing.T) {
	k := startKeeper(t, "--model", "nosuch", "--prompt", "x", "--queen", "http://127.0.0.1:1", "--models-dir", t.TempDir())
	if code := k.Wait(t); code != 2 {
		t.Fatalf("exit %d, want 2; stderr:\n%s", code, k.Lines.String())
	}
	if !k.Lines.Has("model nosuch is not in", nil) {
		t.Errorf("stderr:\n%s", k.Lines.String())
	}
	k.gone(t)
}

// gate is a worker binary that waits, before it execs the real worker,
// until the test opens it: a worker held in its loading phase.
type gate struct{ script string }

func newGate(t *testing.T) gate {
	t.Helper()
	script := filepath.Join(t.TempDir(), "gated-worker.sh")
	body := fmt.Sprintf("#!/bin/sh\n# A worker that loads only once the test opens the gate.\nwhile [ ! -e \"$0.open\" ]; do sleep 0.01; done\nexec %s \"$@\"\n", testbin.Path(t))
	if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	return gate{script: script}
}

func (g gate) open(t *testing.T) {
	if err := os.WriteFile(g.script+".open", nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

// "After Ctrl+C to rbee-keeper (Ephemeral Mode)": the keeper, the queen it
// started, the hive and the worker all die, whether the signal comes while
// the queen starts, while the worker loads, or while tokens stream. Ctrl+C
// exits 130, SIGTERM 143. Integration: "Ephemeral mode: All processes exit
// after Ctrl+C".
func TestWhatDiesWhen_CtrlCEphemeral_KeeperQueenHiveWorkerAllDie(t *testing.T) {
	for _, sig := range []struct {
		name string
		sig  syscall.Signal
		code int
	}{{"SIGINT", syscall.SIGINT, 130}, {"SIGTERM", syscall.SIGTERM, 143}} {
		t.Run(sig.name+"/startup", func(t *testing.T) {
			k := startKeeper(t, ephemeralArgs(t, "--prompt", "hello", "--max-tokens", "8")...)
			k.Lines.Wait(t, 0, "starting one with a local hive", nil)
			k.Signal(sig.sig)
			if code := k.Wait(t); code != sig.code {
				t.Errorf("exit %d, want %d; stderr:\n%s", code, sig.code, k.Lines.String())
			}
			k.gone(t)
		})
		t.Run(sig.name+"/loading", func(t *testing.T) {
			g := newGate(t)
			k := startKeeper(t, ephemeralArgs(t, "--prompt", "hello", "--max-tokens", "8",
				"--queen-arg=--hive-arg=--worker-path="+g.script)...)
			k.Lines.Wait(t, 0, "loading tiny on pool local", nil)
			k.Signal(sig.sig)
			g.open(t) // the worker goes on loading while the tree cascades
			if code := k.Wait(t); code != sig.code {
				t.Errorf("exit %d, want %d; stderr:\n%s", code, sig.code, k.Lines.String())
			}
			k.gone(t)
		})
		t.Run(sig.name+"/generating", func(t *testing.T) {
			// The worker holds its answer after the first token, so the
			// signal surely lands while tokens are being generated.
			k := startHeldKeeper(t, "--prompt", "hello", "--max-tokens", "64")
			k.WaitStdout(t, 1)
			k.Signal(sig.sig)
			if code := k.Wait(t); code != sig.code {
				t.Errorf("exit %d, want %d; stderr:\n%s", code, sig.code, k.Lines.String())
			}
			k.gone(t)
		})
	}
}

// "After Ctrl+C to rbee-keeper (Persistent Mode)": only the keeper dies;
// the queen, the hive and the worker were not started by it and stay up.
func TestWhatDiesWhen_CtrlCPersistent_OnlyKeeperDies(t *testing.T) {
	op := startOperator(t)
	// A first prompt makes the operator's hive start a worker.
	warm := startKeeper(t, "--model", "tiny", "--prompt", "hello", "--max-tokens", "2", "--queen", op.url)
	if code := warm.Wait(t); code != 0 {
		t.Fatalf("warm-up keeper exit %d; stderr:\n%s", code, warm.Lines.String())
	}
	var worker int
	for _, pid := range testbin.Matching(op.marker) {
		if strings.Contains(testbin.Cmdline(pid), " worker ") {
			worker = pid
		}
	}
	if worker == 0 {
		t.Fatal("no worker of the operator's hive after the first prompt")
	}
	// Hold the worker so the keeper is surely still waiting for tokens
	// when Ctrl+C arrives (the random test model may end an answer early).
	_ = syscall.Kill(worker, syscall.SIGSTOP)
	k := startKeeper(t, "--model", "tiny", "--prompt", "hello", "--max-tokens", "2000", "--queen", op.url)
	awaitStderr(t, k, "waiting for the answer")
	k.Signal(syscall.SIGINT)
	code := k.Wait(t)
	_ = syscall.Kill(worker, syscall.SIGCONT)
	if code != 130 {
		t.Errorf("exit %d, want 130; stderr:\n%s", code, k.Lines.String())
	}
	op.stillUp(t)
	// The worker serves the next prompt.
	k2 := startKeeper(t, "--model", "tiny", "--prompt", "again", "--max-tokens", "4", "--queen", op.url)
	if code := k2.Wait(t); code != 0 {
		t.Errorf("next keeper exit %d; stderr:\n%s", code, k2.Lines.String())
	}
	op.stillUp(t)
	op.stop(t)
}

// awaitStderr waits until the keeper's stderr holds text.
func awaitStderr(t *testing.T, k *keeper, text string) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !strings.Contains(k.Lines.String(), text) {
		select {
		case <-deadline:
			t.Fatalf("keeper never wrote %q; stderr:\n%s", text, k.Lines.String())
		case <-k.Done():
			t.Fatalf("keeper exited before writing %q; stderr:\n%s", text, k.Lines.String())
		case <-tick.C:
		}
	}
}

// A keeper killed with SIGKILL cannot tear down; its queen gets SIGTERM
// from the kernel (its death signal) and cascades all the same.
func TestKeeperKilled_EphemeralQueenStillCascades(t *testing.T) {
	k := startHeldKeeper(t, "--prompt", "hello", "--max-tokens", "64") // still answering when killed

	k.WaitStdout(t, 1)
	k.Signal(syscall.SIGKILL)
	if code := k.Wait(t); code != -1 {
		t.Errorf("keeper exit %d after SIGKILL", code)
	}
	testbin.AwaitGone(t, k.marker, teardownLimit)
}

// Issue #34: with a queen somebody else runs at the default address
// (APIARY_QUEEN here, http://127.0.0.1:8080 without it), `apiary infer
// --ephemeral` answers from a queen and hive of its own, on free ports,
// and never asks the one it would otherwise have used.
func TestEphemeralFlag_LeavesTheQueenAtTheDefaultAddressAlone(t *testing.T) {
	other := testbin.StartOtherQueen(t)
	model := writeModel(t, t.TempDir(), "tiny")
	k := startKeeperEnv(t, []string{"APIARY_QUEEN=" + other.URL}, "--ephemeral", "--model", model, "--prompt", "hello bees",
		"--max-tokens", "8", "--worker-threads", "1", "--queen-arg=--hive-arg=--worker-ports=28000-28999")
	if code := k.Wait(t); code != 0 {
		t.Fatalf("keeper exit %d; stderr:\n%s", code, k.Lines.String())
	}
	if k.Stdout() == "" {
		t.Errorf("no answer on stdout; stderr:\n%s", k.Lines.String())
	}
	if !k.Lines.Has("--ephemeral: starting a queen with a local hive", nil) {
		t.Errorf("stderr does not say why it started a queen:\n%s", k.Lines.String())
	}
	if got := other.Requests(); len(got) != 0 {
		t.Errorf("the queen at the default address got %q; --ephemeral must never ask it", got)
	}
	k.gone(t)

	// --ephemeral with --queen asks for two things at once.
	both := startKeeperEnv(t, nil, "--ephemeral", "--queen", other.URL, "--model", model, "--prompt", "x")
	if code := both.Wait(t); code != 2 || !both.Lines.Has("--ephemeral starts a queen of its own and --queen names one to ask", nil) {
		t.Errorf("--ephemeral --queen: exit %d, want 2 naming both flags; stderr:\n%s", code, both.Lines.String())
	}
}

// Issue #34: without --ephemeral, a queen found at the default address is
// named on stderr with how to choose, and its 401 says what to do; a
// model given by path is refused with --ephemeral as the way out.
func TestPersistentMode_NamesTheQueenItFoundAndHowToChoose(t *testing.T) {
	other := testbin.StartOtherQueen(t)
	env := []string{"APIARY_QUEEN=" + other.URL}
	k := startKeeperEnv(t, env, "--model", "tiny", "--prompt", "hello bees", "--max-tokens", "8")
	if code := k.Wait(t); code != 1 {
		t.Fatalf("keeper exit %d, want 1 (the queen refuses without a token); stderr:\n%s", code, k.Lines.String())
	}
	for _, want := range []string{
		"a queen answers at " + other.URL + ": asking it",
		"--ephemeral starts a throwaway queen and hive for this prompt instead, --queen URL asks another queen",
		"missing or invalid bearer token",
		"the queen at " + other.URL + " wants a token (APIARY_API_TOKEN); if it is not yours, pass --ephemeral",
	} {
		if !k.Lines.Has(want, nil) {
			t.Errorf("stderr lacks %q:\n%s", want, k.Lines.String())
		}
	}
	if k.Lines.Has("starting one", nil) {
		t.Errorf("the keeper started a queen although one answers:\n%s", k.Lines.String())
	}

	path := writeModel(t, t.TempDir(), "tiny")
	p := startKeeperEnv(t, env, "--model", path, "--prompt", "hello bees")
	if code := p.Wait(t); code != 2 || !p.Lines.Has("or pass --ephemeral to load the file itself (ephemeral mode", nil) {
		t.Errorf("a path with a queen found: exit %d, want 2 pointing at --ephemeral; stderr:\n%s", code, p.Lines.String())
	}
}
