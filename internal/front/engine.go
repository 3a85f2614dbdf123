package front

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"syscall"
	"time"

	"github.com/apiary-llm/apiary/internal/procs"
)

// Command is the external engine's command line, placeholders already
// replaced.
type Command struct {
	Path string
	Args []string // without argv[0]
	// Env is the engine's complete environment.
	Env []string
	// Output receives its stdout and stderr; nil: the front's stderr.
	// A file, so that the engine writes to it directly and no copy of its
	// output outlives it.
	Output *os.File
}

// engineProc is the running engine: a child of the front in the front's
// own process group (so the hive's signals to the group reach it, and its
// descendants die with the group), with the parent-death signal SIGKILL.
type engineProc struct {
	pid    int
	exited chan struct{} // closed once it has been reaped
	exit   procs.Exit    // written before exited is closed
}

// ErrEngineStart means the engine's program could not be started.
var ErrEngineStart = errors.New("engine did not start")

// startEngine starts c from a goroutine whose OS thread stays locked
// until the engine has been reaped: Linux sends the parent-death signal
// when the thread that forked the child ends, not when the process does.
func startEngine(c Command) (*engineProc, error) {
	p := &engineProc{exited: make(chan struct{})}
	started := make(chan error, 1)
	go p.run(c, started)
	if err := <-started; err != nil {
		return nil, err
	}
	return p, nil
}

func (p *engineProc) run(c Command, started chan<- error) {
	runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
	if syscall.Gettid() == syscall.Getpid() {
		// The runtime never ends the main thread, so a child forked from
		// it would keep its parent-death signal unarmed; use another.
		runtime.UnlockOSThread()
		go p.run(c, started)
		return
	}
	cmd := exec.Command(c.Path, c.Args...)
	cmd.Env = c.Env
	out := c.Output
	if out == nil {
		out = os.Stderr
	}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		started <- fmt.Errorf("%w: %w", ErrEngineStart, err)
		return
	}
	p.pid = cmd.Process.Pid
	started <- nil
	_ = cmd.Wait()
	p.exit = exitOf(cmd.ProcessState)
	close(p.exited)
}

func exitOf(ps *os.ProcessState) procs.Exit {
	if ps == nil {
		return procs.Exit{Code: -1, Signal: syscall.SIGKILL}
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return procs.Exit{Code: -1, Signal: ws.Signal()}
	}
	return procs.Exit{Code: ps.ExitCode()}
}

// stop sends the engine SIGTERM, then SIGKILL if it is still there after
// wait, and returns once it has been reaped: "graceful" or "forced".
func (p *engineProc) stop(wait time.Duration) string {
	select {
	case <-p.exited:
		return "graceful"
	default:
	}
	_ = syscall.Kill(p.pid, syscall.SIGTERM)
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-p.exited:
		return "graceful"
	case <-t.C:
	}
	_ = syscall.Kill(p.pid, syscall.SIGKILL)
	<-p.exited
	return "forced"
}

// EngineExitError is the front's end when its engine exited on its own:
// the hive sees the engine's exit as the front's (see cmd/apiary), so
// that a worker's FAILED row names how the engine ended.
type EngineExitError struct{ Exit procs.Exit }

func (e *EngineExitError) Error() string { return "the engine exited: " + e.Exit.String() }
