package testbin

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/procs"
)

// WaitLimit bounds every wait of these helpers: reaching it is a failure,
// not a timing guess.
var WaitLimit = 60 * time.Second

// gracePeriod is how long a process left running at the end of a test has
// to stop on SIGTERM before it is killed.
const gracePeriod = 20 * time.Second

// Proc is an apiary process run by a test in its own process group, with
// its stderr read line by line (JSON log records parsed) and its stdout
// kept.
type Proc struct {
	Name   string
	Cmd    *exec.Cmd
	Lines  *Lines // stderr
	stdout *Lines
	done   chan struct{} // closed when waited for
	err    error         // set before done is closed
}

// Start runs the apiary binary with args (env added to the test's). A
// process that still runs at the end of the test is stopped as an
// operator stops it: SIGTERM (and SIGCONT, should the test have frozen
// it) to its group, so that it stops what it started before the test's
// directories go (a hive it started is in a group of its own and would
// write into them after a SIGKILL); SIGKILL after gracePeriod.
func Start(t testing.TB, name string, env []string, args ...string) *Proc {
	t.Helper()
	return StartCmd(t, name, env, Path(t), args...)
}

// StartCmd is Start for another program (e.g. `ip netns exec NS apiary …`).
func StartCmd(t testing.TB, name string, env []string, path string, args ...string) *Proc {
	t.Helper()
	cmd := exec.Command(path, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	p := &Proc{Name: name, Cmd: cmd, Lines: NewLines(), stdout: NewLines(), done: make(chan struct{})}
	errR, errW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr, cmd.Stdout = errW, outW
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	errW.Close()
	outW.Close()
	var readers sync.WaitGroup
	readers.Go(func() { p.Lines.readFrom(errR) })
	readers.Go(func() { p.stdout.readRaw(outR) })
	go func() {
		readers.Wait()
		p.err = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGCONT)
			select {
			case <-p.done:
			case <-time.After(gracePeriod):
				_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
				<-p.done
			}
		}
		if t.Failed() {
			t.Logf("%s (pid %d) stderr:\n%s", name, cmd.Process.Pid, p.Lines.String())
		}
	})
	return p
}

// Err is how the process ended, as exec.Cmd.Wait reports it; valid once
// Done is closed.
func (p *Proc) Err() error {
	<-p.done
	return p.err
}

// PID is the process id.
func (p *Proc) PID() int { return p.Cmd.Process.Pid }

// Done is closed once the process has exited and its output is read.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Signal sends sig to the process (not its group).
func (p *Proc) Signal(sig syscall.Signal) { _ = p.Cmd.Process.Signal(sig) }

// Wait waits for the exit and returns the exit code (-1: killed by a
// signal).
func (p *Proc) Wait(t testing.TB) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(WaitLimit):
		t.Fatalf("%s did not exit within %s; stderr:\n%s", p.Name, WaitLimit, p.Lines.String())
	}
	return p.Cmd.ProcessState.ExitCode()
}

// Stdout is what the process wrote on stdout so far.
func (p *Proc) Stdout() string { return p.stdout.String() }

// WaitStdout waits until stdout holds at least n bytes.
func (p *Proc) WaitStdout(t testing.TB, n int) string {
	t.Helper()
	return p.stdout.waitRaw(t, p.Name+" stdout", n, p.done)
}

// Record is one line of a process's stderr: a JSON log record's fields, or
// a plain line as Msg.
type Record struct {
	Msg   string
	Attrs map[string]string
	Line  string
}

// Lines keeps the lines a process writes and lets a test wait for one.
type Lines struct {
	mu      sync.Mutex
	records []Record      // guarded by mu
	raw     bytes.Buffer  // guarded by mu
	change  chan struct{} // guarded by mu; closed and replaced on each write
}

// NewLines is an empty Lines, for a test that feeds it itself (Add).
func NewLines() *Lines { return &Lines{change: make(chan struct{})} }

func (l *Lines) readFrom(f *os.File) {
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l.Add(sc.Text())
	}
}

func (l *Lines) readRaw(f *os.File) {
	defer f.Close()
	buf := make([]byte, 4096)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			l.mu.Lock()
			l.raw.Write(buf[:n])
			close(l.change)
			l.change = make(chan struct{})
			l.mu.Unlock()
		}
		if err != nil {
			return
		}
	}
}

// Add records one line: a JSON log record, or anything else verbatim.
func (l *Lines) Add(line string) {
	rec := Record{Attrs: map[string]string{}, Line: line}
	var m map[string]any
	if json.Unmarshal([]byte(line), &m) != nil {
		rec.Msg = line
	} else {
		for k, v := range m {
			rec.Attrs[k] = fmt.Sprint(v)
		}
		rec.Msg = rec.Attrs["msg"]
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.records = append(l.records, rec)
	l.raw.WriteString(line)
	l.raw.WriteByte('\n')
	close(l.change)
	l.change = make(chan struct{})
}

// String is everything written so far.
func (l *Lines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.raw.String()
}

func (r Record) match(msg string, want map[string]string) bool {
	if !strings.Contains(r.Msg, msg) {
		return false
	}
	for k, v := range want {
		if r.Attrs[k] != v {
			return false
		}
	}
	return true
}

// Wait returns the first record from index from on whose message contains
// msg and whose attributes include want, and the index after it.
func (l *Lines) Wait(t testing.TB, from int, msg string, want map[string]string) (Record, int) {
	t.Helper()
	deadline := time.NewTimer(WaitLimit)
	defer deadline.Stop()
	for {
		l.mu.Lock()
		for i := from; i < len(l.records); i++ {
			if l.records[i].match(msg, want) {
				rec := l.records[i]
				l.mu.Unlock()
				return rec, i + 1
			}
		}
		ch := l.change
		l.mu.Unlock()
		select {
		case <-ch:
		case <-deadline.C:
			t.Fatalf("no line %q with %v within %s; lines:\n%s", msg, want, WaitLimit, l.String())
		}
	}
}

// Len is how many records there are: a later Wait from it sees only
// those that come after.
func (l *Lines) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.records)
}

// Count counts the records that match.
func (l *Lines) Count(msg string, want map[string]string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, r := range l.records {
		if r.match(msg, want) {
			n++
		}
	}
	return n
}

// Has reports whether some record matches.
func (l *Lines) Has(msg string, want map[string]string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range l.records {
		if r.match(msg, want) {
			return true
		}
	}
	return false
}

func (l *Lines) waitRaw(t testing.TB, what string, n int, exited <-chan struct{}) string {
	t.Helper()
	deadline := time.NewTimer(WaitLimit)
	defer deadline.Stop()
	for {
		l.mu.Lock()
		if l.raw.Len() >= n {
			s := l.raw.String()
			l.mu.Unlock()
			return s
		}
		ch := l.change
		l.mu.Unlock()
		select {
		case <-ch:
		case <-exited:
			exited = nil // read what the exit flushed, then give up
			l.mu.Lock()
			got := l.raw.Len()
			l.mu.Unlock()
			if got < n {
				t.Fatalf("%s: the process exited after %d bytes, want %d", what, got, n)
			}
		case <-deadline.C:
			t.Fatalf("%s: fewer than %d bytes within %s", what, n, WaitLimit)
		}
	}
}

// Matching lists the living processes whose command line contains marker
// (a test's temp dir, which every process of a tree it started names).
func Matching(marker string) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || !bytes.Contains(b, []byte(marker)) {
			continue
		}
		if s, err := procs.ReadStat(pid); err == nil && s.Alive() {
			out = append(out, pid)
		}
	}
	return out
}

// Cmdline is the command line of pid, spaces between the arguments.
func Cmdline(pid int) string {
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	return strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " "))
}

// Alive reports whether pid is a living process.
func Alive(pid int) bool {
	s, err := procs.ReadStat(pid)
	return err == nil && s.Alive()
}

// AwaitGone waits until no living process matches marker: they are not the
// test's children, so /proc is watched. It fails the test with what is left.
func AwaitGone(t testing.TB, marker string, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for pause := time.Millisecond; ; pause = min(2*pause, 50*time.Millisecond) {
		left := Matching(marker)
		if len(left) == 0 {
			return time.Since(start)
		}
		if time.Since(start) > within {
			var b strings.Builder
			for _, pid := range left {
				fmt.Fprintf(&b, "\n  %d: %s", pid, Cmdline(pid))
			}
			t.Fatalf("processes still alive %s later:%s", within, b.String())
		}
		time.Sleep(pause)
	}
}

// AwaitProcess waits until a living process matches marker and contains
// word in its command line, and returns its pid.
func AwaitProcess(t testing.TB, marker, word string) int {
	t.Helper()
	start := time.Now()
	for pause := time.Millisecond; ; pause = min(2*pause, 20*time.Millisecond) {
		for _, pid := range Matching(marker) {
			if strings.Contains(Cmdline(pid), word) {
				return pid
			}
		}
		if time.Since(start) > WaitLimit {
			t.Fatalf("no process with %q and %q within %s", marker, word, WaitLimit)
		}
		time.Sleep(pause)
	}
}

// AwaitDead waits until pid is no living process.
func AwaitDead(t testing.TB, pid int, within time.Duration) {
	t.Helper()
	start := time.Now()
	for pause := time.Millisecond; Alive(pid); pause = min(2*pause, 20*time.Millisecond) {
		if time.Since(start) > within {
			t.Fatalf("process %d (%s) still alive %s later", pid, Cmdline(pid), within)
		}
		time.Sleep(pause)
	}
}
