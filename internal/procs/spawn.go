// Package procs starts, signals and reaps the child processes of a daemon so
// that none outlives it: every child leads its own process group (so its
// descendants can be signalled with it), gets SIGKILL from the kernel when the
// thread that forked it exits (Pdeathsig, armed from one OS thread locked for
// the spawner's whole life), is waited on as soon as it exits, and has its
// whole group killed once it is gone.
package procs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"syscall"
	"time"
)

// ErrClosed is returned by Start after Close.
var ErrClosed = errors.New("spawner closed")

// Spec describes one child.
type Spec struct {
	Path string
	Args []string // without argv[0]
	Env  []string // the complete environment
	Dir  string
	// Output receives the child's stdout and stderr, interleaved. It is
	// written from one goroutine; nil discards.
	Output io.Writer
	// WaitDelay bounds how long Wait waits for the output to close after the
	// process and its group are gone (a descendant that left the group may
	// hold it). Zero means one second.
	WaitDelay time.Duration
	// Stdin is the child's standard input; nil is /dev/null. A pipe whose
	// write end the parent keeps is a lifeline: the child sees EOF when the
	// parent closes it or dies.
	Stdin *os.File
	// ExtraFiles are inherited by the child as fds 3, 4, … (a listening
	// socket the parent bound for it). The parent may close them once
	// Start returns.
	ExtraFiles []*os.File
	// DeathSignal is what the kernel sends the child when the spawner's
	// thread (and so the parent) dies; zero means SIGKILL. A daemon that
	// cascades its own shutdown on SIGTERM gets SIGTERM here.
	DeathSignal syscall.Signal
}

// Spawner forks children from a single OS thread that it keeps locked for
// its whole life, because Linux delivers Pdeathsig when the forking thread
// ends, not when the process does. Close it only after its children are
// gone: its thread then exits and any survivor gets SIGKILL.
type Spawner struct {
	reqs      chan spawnReq
	quit      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

type spawnReq struct {
	cmd   *exec.Cmd
	reply chan error
}

// NewSpawner starts the spawner's thread.
func NewSpawner() *Spawner {
	s := &Spawner{reqs: make(chan spawnReq), quit: make(chan struct{}), done: make(chan struct{})}
	go s.loop()
	return s
}

func (s *Spawner) loop() {
	// Never unlocked: when this goroutine returns the runtime ends the
	// thread, which is what fires Pdeathsig for anything still alive.
	runtime.LockOSThread()
	if syscall.Gettid() == syscall.Getpid() {
		// The main thread is the exception: the runtime never ends it
		// (it wedges it), so children forked here would outlive Close.
		// Move to another thread.
		runtime.UnlockOSThread()
		go s.loop()
		return
	}
	defer close(s.done)
	for {
		select {
		case r := <-s.reqs:
			r.reply <- r.cmd.Start()
		case <-s.quit:
			return
		}
	}
}

// Close ends the spawner's thread; it is idempotent and waits for the
// thread's goroutine to finish.
func (s *Spawner) Close() error {
	s.closeOnce.Do(func() { close(s.quit) })
	<-s.done
	return nil
}

// Start forks the child described by spec in its own process group with
// Pdeathsig SIGKILL, and starts waiting for it.
func (s *Spawner) Start(ctx context.Context, spec Spec) (*Process, error) {
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("output pipe: %w", err)
	}
	killCtx, kill := context.WithCancel(context.Background())
	cmd := exec.CommandContext(killCtx, spec.Path, spec.Args...)
	cmd.Env = spec.Env
	cmd.Dir = spec.Dir
	if spec.Stdin != nil {
		cmd.Stdin = spec.Stdin
	}
	cmd.ExtraFiles = spec.ExtraFiles
	cmd.Stdout, cmd.Stderr = pw, pw
	death := spec.DeathSignal
	if death == 0 {
		death = syscall.SIGKILL
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: death}
	// Process.Kill (cancelling killCtx) kills the whole group, not just the
	// leader; WaitDelay is the backstop exec offers on top of that.
	cmd.Cancel = func() error { return killGroup(cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = time.Second

	reply := make(chan error, 1)
	select {
	case s.reqs <- spawnReq{cmd: cmd, reply: reply}:
	case <-s.done:
		err = ErrClosed
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err == nil {
		err = <-reply
	}
	pw.Close()
	if err != nil {
		pr.Close()
		kill()
		return nil, fmt.Errorf("start %s: %w", spec.Path, err)
	}
	p := &Process{
		cmd:    cmd,
		pid:    cmd.Process.Pid,
		kill:   kill,
		exited: make(chan struct{}),
		done:   make(chan struct{}),
	}
	p.startTicks, _ = StartTicks(p.pid)
	delay := spec.WaitDelay
	if delay <= 0 {
		delay = time.Second
	}
	go p.wait(pr, spec.Output, delay)
	return p, nil
}

// Process is a running child.
type Process struct {
	cmd        *exec.Cmd
	pid        int
	startTicks uint64
	kill       context.CancelFunc

	exited chan struct{} // closed when the child has been reaped
	done   chan struct{} // closed when reaped, group killed and output drained
	exit   Exit          // written before exited is closed
}

// Exit is how a child ended.
type Exit struct {
	Code   int            // exit status; -1 when a signal ended it
	Signal syscall.Signal // the signal, when one ended it
	// Reason says more, where something other than a process's end
	// ended it (a Kubernetes Pod deleted or evicted); "" for a process.
	Reason string
}

func (e Exit) String() string {
	var s string
	switch {
	case e.Code >= 0:
		s = fmt.Sprintf("exit code %d", e.Code)
	case e.Reason != "" && e.Signal == syscall.SIGKILL:
		return e.Reason
	default:
		s = fmt.Sprintf("killed by signal %d (%s)", int(e.Signal), e.Signal)
	}
	if e.Reason != "" {
		s += "; " + e.Reason
	}
	return s
}

// PID is the child's process id, which is also its process group id.
func (p *Process) PID() int { return p.pid }

// Identity is what a record needs to find this child again after a crash.
func (p *Process) Identity() Identity {
	return Identity{PID: p.pid, PGID: p.pid, StartTicks: p.startTicks}
}

// Exited is closed as soon as the child has been reaped.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// Done is closed once the child is reaped, every member of its group is
// dead and its output drained (or abandoned after the WaitDelay).
func (p *Process) Done() <-chan struct{} { return p.done }

// Exit reports how the child ended; valid after Exited is closed.
func (p *Process) Exit() Exit {
	<-p.exited
	return p.exit
}

// Signal sends sig to the child's whole process group.
func (p *Process) Signal(sig syscall.Signal) error {
	select {
	case <-p.exited:
		return nil
	default:
	}
	return killGroup(p.pid, sig)
}

// Kill sends SIGKILL to the child's whole process group.
func (p *Process) Kill() { p.kill() }

func (p *Process) wait(out *os.File, w io.Writer, delay time.Duration) {
	defer close(p.done)
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		if w == nil {
			w = io.Discard
		}
		_, _ = io.Copy(w, out)
	}()

	err := p.cmd.Wait()
	p.exit = exitOf(p.cmd.ProcessState, err)
	// The leader is gone; whatever it left in its group goes with it. The
	// group id cannot be reused while any member lives, so this reaches only
	// our descendants.
	_ = killGroup(p.pid, syscall.SIGKILL)
	p.kill()
	close(p.exited)

	deadline := time.Now().Add(delay)
	waitGroupGone(p.pid, deadline)
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-copied:
	case <-t.C:
		// A descendant that left the group still holds the output; stop
		// reading rather than wait for it.
	}
	out.Close()
	<-copied
}

// waitGroupGone watches /proc until no living process is in group pgid (a
// SIGKILLed process takes a moment to die) or the deadline passes. Members
// are not our children, so there is no event to wait on; most groups are
// empty at the first look.
func waitGroupGone(pgid int, deadline time.Time) {
	for pause := 100 * time.Microsecond; ; pause = min(2*pause, 10*time.Millisecond) {
		m, err := GroupMembers(pgid)
		if err != nil || len(m) == 0 || time.Now().After(deadline) {
			return
		}
		time.Sleep(pause)
	}
}

func exitOf(ps *os.ProcessState, err error) Exit {
	if ps == nil {
		return Exit{Code: -1, Signal: syscall.SIGKILL}
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return Exit{Code: -1, Signal: ws.Signal()}
	}
	return Exit{Code: ps.ExitCode()}
}

func killGroup(pgid int, sig syscall.Signal) error {
	if pgid <= 1 {
		return fmt.Errorf("refusing to signal process group %d", pgid)
	}
	err := syscall.Kill(-pgid, sig)
	if errors.Is(err, syscall.ESRCH) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("signal group %d: %w", pgid, err)
	}
	return nil
}
