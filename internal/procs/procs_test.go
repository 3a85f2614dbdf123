package procs

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// The test binary doubles as the child: PROCS_CHILD selects a behaviour.
func TestMain(m *testing.M) {
	if b := os.Getenv("PROCS_CHILD"); b != "" {
		os.Exit(child(b))
	}
	goleak.VerifyTestMain(m)
}

func child(behaviour string) int {
	switch behaviour {
	case "exit3":
		fmt.Println("bye")
		return 3
	case "sleep":
		fmt.Println("sleeping")
		time.Sleep(time.Hour)
	case "ignore-term":
		signal.Ignore(syscall.SIGTERM)
		fmt.Println("ready")
		time.Sleep(time.Hour)
	case "lifeline":
		// Exits once its stdin (a lifeline) closes.
		fmt.Println("ready")
		_, _ = io.Copy(io.Discard, os.Stdin)
		return 0
	case "grandchild":
		// A descendant in the same group that keeps the output open.
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), "PROCS_CHILD=sleep")
		cmd.Stdout = os.Stdout
		if err := cmd.Start(); err != nil {
			return 10
		}
		fmt.Printf("grandchild %d\n", cmd.Process.Pid)
		return 0
	}
	return 99
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func startChild(t *testing.T, sp *Spawner, behaviour string, out *syncBuffer) *Process {
	t.Helper()
	spec := Spec{Path: os.Args[0], Env: append(os.Environ(), "PROCS_CHILD="+behaviour)}
	if out != nil {
		spec.Output = out
	}
	p, err := sp.Start(t.Context(), spec)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestExitCodeAndOutput(t *testing.T) {
	sp := NewSpawner()
	defer sp.Close()
	var out syncBuffer
	p := startChild(t, sp, "exit3", &out)
	<-p.Done()
	if got := p.Exit(); got.Code != 3 {
		t.Errorf("exit = %v, want code 3", got)
	}
	if out.String() != "bye\n" {
		t.Errorf("output = %q", out.String())
	}
}

func TestChildLeadsItsOwnGroup(t *testing.T) {
	sp := NewSpawner()
	defer sp.Close()
	p := startChild(t, sp, "sleep", nil)
	defer func() { p.Kill(); <-p.Done() }()
	s, err := ReadStat(p.PID())
	if err != nil {
		t.Fatal(err)
	}
	if s.PGID != p.PID() || s.PPID != os.Getpid() {
		t.Errorf("stat = %+v, want pgid %d ppid %d", s, p.PID(), os.Getpid())
	}
	if !p.Identity().Alive() {
		t.Error("Identity().Alive() = false for a running child")
	}
}

func TestGrandchildHoldingOutputDiesWithLeader(t *testing.T) {
	sp := NewSpawner()
	defer sp.Close()
	var out syncBuffer
	p := startChild(t, sp, "grandchild", &out)
	<-p.Done()
	if got := p.Exit(); got.Code != 0 {
		t.Fatalf("exit = %v", got)
	}
	if !strings.Contains(out.String(), "grandchild ") {
		t.Fatalf("output %q", out.String())
	}
	if members, _ := GroupMembers(p.PID()); len(members) != 0 {
		t.Errorf("group %d still has %v", p.PID(), members)
	}
}

func TestKillEndsTheGroup(t *testing.T) {
	sp := NewSpawner()
	defer sp.Close()
	p := startChild(t, sp, "sleep", nil)
	p.Kill()
	<-p.Done()
	if got := p.Exit(); got.Signal != syscall.SIGKILL {
		t.Errorf("exit = %v, want SIGKILL", got)
	}
}

func TestSignalTermReachesGroup(t *testing.T) {
	sp := NewSpawner()
	defer sp.Close()
	p := startChild(t, sp, "sleep", nil)
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	<-p.Done()
	if got := p.Exit(); got.Signal != syscall.SIGTERM {
		t.Errorf("exit = %v, want SIGTERM", got)
	}
}

// Pdeathsig belongs to the forking thread: closing the spawner ends that
// thread, and the kernel kills what it started.
func TestClosingSpawnerThreadKillsChildren(t *testing.T) {
	sp := NewSpawner()
	p := startChild(t, sp, "sleep", nil)
	sp.Close()
	select {
	case <-p.Done():
	case <-time.After(10 * time.Second):
		p.Kill()
		<-p.Done()
		t.Fatal("child survived its spawner thread")
	}
	if got := p.Exit(); got.Signal != syscall.SIGKILL {
		t.Errorf("exit = %v, want SIGKILL from Pdeathsig", got)
	}
	if _, err := sp.Start(t.Context(), Spec{Path: os.Args[0]}); err == nil {
		t.Error("Start after Close succeeded")
	}
}

func TestKillSurvivors(t *testing.T) {
	// A process in its own group that is not ours to wait on through the
	// spawner, as a survivor of a previous daemon would be.
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "PROCS_CHILD=sleep")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	start, err := StartTicks(pid)
	if err != nil {
		t.Fatal(err)
	}

	// A record whose start time does not match is a reused pid: untouched.
	if killed, err := KillSurvivors(Identity{PID: pid, PGID: pid, StartTicks: start + 1}); err != nil || len(killed) != 0 {
		t.Fatalf("KillSurvivors(reused pid) = %v, %v", killed, err)
	}
	killed, err := KillSurvivors(Identity{PID: pid, PGID: pid, StartTicks: start})
	if err != nil || !slices.Contains(killed, pid) {
		t.Fatalf("KillSurvivors = %v, %v; want %d", killed, err, pid)
	}
	err = cmd.Wait()
	if ws := cmd.ProcessState.Sys().(syscall.WaitStatus); !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Errorf("survivor ended with %v", err)
	}
	if killed, err := KillSurvivors(Identity{PID: pid, PGID: pid, StartTicks: start}); err != nil || len(killed) != 0 {
		t.Errorf("second KillSurvivors = %v, %v", killed, err)
	}
}

func TestParseStat(t *testing.T) {
	line := "1234 (we ird) name)) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10"
	s, err := ParseStat([]byte(line))
	if err != nil {
		t.Fatal(err)
	}
	if s != (Stat{State: 'S', PPID: 1, PGID: 1234, StartTicks: 987654}) {
		t.Errorf("stat = %+v", s)
	}
	if _, err := ParseStat([]byte("1 (x) S 1")); err == nil {
		t.Error("short stat parsed")
	}
}
