package hive

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/lifecycle"
	"github.com/apiary-llm/apiary/internal/procs"
)

// The cases of what dies when (docs/ownership.md, "Who owns what") that concern
// the hive and its workers, one test each, named after the row. The queen's
// cascade reaches a hive as SIGTERM (SSH) or POST /v2/shutdown.

// After inference completes: the hive and the worker stay up; the worker is
// reused for the next request.
func TestWhatDiesWhen_AfterInferenceCompletes_HiveAndWorkerStayUp(t *testing.T) {
	th := startHive(t, withReal(t))
	id := th.start()
	ready := th.rec.wait(t, id, lifecycle.Ready)
	for range 2 {
		if _, err := realCompletion(ready); err != nil {
			t.Fatal(err)
		}
	}
	w := th.worker(id)
	if !lifecycle.State(w.Status).Serving() {
		t.Errorf("worker after inference: %s", w.Status)
	}
	if s, err := procs.ReadStat(w.PID); err != nil || !s.Alive() {
		t.Errorf("worker process %d after inference: %v", w.PID, err)
	}
}

// After Ctrl+C to the keeper in persistent mode: a client going away does
// not touch the hive or the worker.
func TestWhatDiesWhen_ClientGoesAway_HiveAndWorkerStayUp(t *testing.T) {
	th := startHive(t, withReal(t))
	id := th.start()
	ready := th.rec.wait(t, id, lifecycle.Ready)
	ctx, cancel := context.WithCancel(t.Context())
	req, _ := http.NewRequestWithContext(ctx, "POST", ready.Worker.URI+"/v1/completions",
		strings.NewReader(`{"model":"tiny","prompt":"hello","max_tokens":200,"stream":true}`))
	req.Header.Set("Authorization", "Bearer "+ready.WorkerToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(resp.Body).ReadString('\n') // the first token arrived
	if !strings.HasPrefix(line, "data: ") {
		t.Fatalf("stream began with %q", line)
	}
	cancel() // Ctrl+C
	resp.Body.Close()
	if _, err := realCompletion(ready); err != nil {
		t.Fatalf("worker after a client left: %v", err)
	}
	if st := th.rec.states(id); slicesContains(st, "failed") || slicesContains(st, "draining") {
		t.Errorf("states after a client left: %v", st)
	}
}

// After 5 minutes idle: see TestWhatDiesWhen_AfterIdleTimeout_WorkerDiesHiveLives.

// Ephemeral mode, Ctrl+C: the queen SIGTERMs the hive; every worker gets
// the shutdown, unloads and exits; the hive clears its registry and exits 0.
func TestWhatDiesWhen_HiveGetsSIGTERM_AllWorkersStopHiveExits0(t *testing.T) {
	q := newFakeQueen(t, "tok")
	hp := startHiveProcess(t, apiaryBin(t), q, "")
	ids := []string{hp.start(t), hp.start(t)}
	var pids []int
	for _, id := range ids {
		pids = append(pids, q.waitEvent(t, id, lifecycle.Ready).Worker.PID)
	}
	if err := hp.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := hp.wait(); err != nil {
		t.Fatalf("hive after SIGTERM: %v\n%s", err, hp.log())
	}
	for i, id := range ids {
		ev := q.waitEvent(t, id, lifecycle.Stopped)
		if !strings.Contains(ev.Reason, "graceful") {
			t.Errorf("%s stopped: %q", id, ev.Reason)
		}
		assertNoProcess(t, pids[i])
	}
	if ents, _ := os.ReadDir(filepath.Join(hp.dir, "hive", "children")); len(ents) != 0 {
		t.Errorf("child records left after a clean exit: %d", len(ents))
	}
}

// The queen's cascade over HTTP: POST /v2/shutdown stops every worker and
// the hive exits.
func TestWhatDiesWhen_ShutdownRequested_AllWorkersStopHiveExits(t *testing.T) {
	th := startHive(t, withReal(t))
	ids := []string{th.start(), th.start()}
	for _, id := range ids {
		th.rec.wait(t, id, lifecycle.Ready)
	}
	if code := th.do("POST", "/v2/shutdown", nil, nil); code != http.StatusAccepted {
		t.Fatalf("shutdown: %d", code)
	}
	<-th.Done()
	for _, id := range ids {
		th.rec.wait(t, id, lifecycle.Stopped)
		w, _ := th.reg.get(id, true)
		assertNoProcess(t, th.reg.snapshot(w).PID)
	}
	if resp, err := http.Get(th.url + "/health"); err == nil {
		resp.Body.Close()
		t.Errorf("hive still serving after shutdown")
	}
}

// The hive crashes (SIGKILL): its workers die with it (Pdeathsig), and the
// next hive on the data dir starts clean.
func TestWhatDiesWhen_HiveKilled_WorkersDieWithIt(t *testing.T) {
	q := newFakeQueen(t, "tok")
	hp := startHiveProcess(t, apiaryBin(t), q, "")
	id := hp.start(t)
	pid := q.waitEvent(t, id, lifecycle.Ready).Worker.PID
	_ = hp.cmd.Process.Signal(syscall.SIGKILL)
	_ = hp.wait()
	waitProcessGone(t, pid)
	th := startHive(t, withReal(t), func(c *Config) { c.DataDir = hp.dir; c.ModelsDir = filepath.Join(hp.dir, "models") })
	if ents, _ := os.ReadDir(filepath.Join(hp.dir, "hive", "children")); len(ents) != 0 {
		t.Errorf("child records left after the next hive started: %d", len(ents))
	}
	_ = th
}

// The hive crashes and a worker outlives it (it cleared its parent-death
// signal, and left a grandchild holding its port): the next hive on the
// same data dir kills them before it serves.
func TestWhatDiesWhen_HiveKilled_NextHiveKillsSurvivors(t *testing.T) {
	q := newFakeQueen(t, "tok")
	hp := startHiveProcess(t, os.Args[0], q, "no-pdeathsig,holder")
	id := hp.start(t)
	ready := q.waitEvent(t, id, lifecycle.Ready)
	pid := ready.Worker.PID
	// If the test fails before the next hive runs, leave nothing behind.
	t.Cleanup(func() { _ = syscall.Kill(-pid, syscall.SIGKILL) })
	_ = hp.cmd.Process.Signal(syscall.SIGKILL)
	_ = hp.wait()
	// The fake worker forks its port holder as it starts serving; under the
	// race detector that can come a moment after the ready event.
	var members []int
	var err error
	for deadline := time.Now().Add(10 * time.Second); ; {
		members, err = procs.GroupMembers(pid)
		if err == nil && len(members) >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("survivors before the next hive: %v %v (the fake and its port holder should outlive their hive)", members, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	th := startHive(t, func(c *Config) { c.DataDir = hp.dir; c.ModelsDir = filepath.Join(hp.dir, "models") })
	assertNoProcess(t, pid) // killed before Ready
	if !strings.Contains(th.logs.String(), "killed worker processes left by a previous hive") {
		t.Errorf("the next hive did not report the survivors")
	}
	portFree(t, ready.Worker.URI)
}

// hiveProcess is a hive in a process of its own.
type hiveProcess struct {
	cmd    *exec.Cmd
	dir    string
	url    string
	token  string
	mu     sync.Mutex
	stderr bytes.Buffer // guarded by mu
	exited chan error

	waitOnce sync.Once
	waitErr  error
}

var servingAddr = regexp.MustCompile(`msg="hive serving".* addr=(\S+)`)

// startHiveProcess runs `bin hive` (the real binary) or, for the test
// binary, hiveProcessMain with fake workers of behaviour fake.
func startHiveProcess(t *testing.T, bin string, q *fakeQueen, fake string) *hiveProcess {
	t.Helper()
	dir := t.TempDir()
	writeModel(t, filepath.Join(dir, "models"), "tiny")
	hp := &hiveProcess{dir: dir, token: q.token, exited: make(chan error, 1)}
	env := append(os.Environ(), "APIARY_CLUSTER_TOKEN="+q.token)
	if bin == os.Args[0] {
		hp.cmd = exec.Command(bin)
		env = append(env, hiveProcessEnv+"=1", "APIARY_TEST_HIVE_DIR="+dir,
			"APIARY_TEST_HIVE_FAKE="+fake, "APIARY_TEST_HIVE_QUEEN="+q.srv.URL)
	} else {
		hp.cmd = exec.Command(bin, "hive", "--addr", "127.0.0.1:0", "--data-dir", dir,
			"--queen", q.srv.URL, "--pool-id", "pool-test", "--heartbeat-interval", "100ms",
			"--health-interval", "200ms", "--stop-grace", "5s", "--idle-timeout", "0")
	}
	hp.cmd.Env = env
	pr, pw := io.Pipe()
	hp.cmd.Stderr = pw
	if err := hp.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { err := hp.cmd.Wait(); pw.Close(); hp.exited <- err }()
	t.Cleanup(func() {
		_ = hp.cmd.Process.Kill()
		_ = hp.wait()
	})
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			hp.mu.Lock()
			hp.stderr.WriteString(sc.Text() + "\n")
			hp.mu.Unlock()
			if m := servingAddr.FindStringSubmatch(sc.Text()); m != nil {
				addr <- m[1]
			}
		}
		close(addr)
	}()
	select {
	case a, ok := <-addr:
		if !ok {
			t.Fatalf("hive process ended before serving:\n%s", hp.log())
		}
		hp.url = "http://" + a
	case <-time.After(waitLimit):
		t.Fatalf("hive process never served:\n%s", hp.log())
	}
	return hp
}

func (hp *hiveProcess) wait() error {
	hp.waitOnce.Do(func() {
		select {
		case hp.waitErr = <-hp.exited:
		case <-time.After(waitLimit):
			hp.waitErr = errors.New("hive process did not exit")
		}
	})
	return hp.waitErr
}

func (hp *hiveProcess) log() string {
	hp.mu.Lock()
	defer hp.mu.Unlock()
	return hp.stderr.String()
}

func (hp *hiveProcess) start(t *testing.T) string {
	t.Helper()
	th := &testHive{t: t, url: hp.url}
	return th.startAuthed(hp.token)
}

// waitProcessGone waits for a process that is not our child to die: there
// is nothing to wait on but /proc.
func waitProcessGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for pause := time.Millisecond; ; pause = min(2*pause, 50*time.Millisecond) {
		if s, err := procs.ReadStat(pid); err != nil || !s.Alive() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d outlived its hive", pid)
		}
		time.Sleep(pause)
	}
}

func slicesContains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}
