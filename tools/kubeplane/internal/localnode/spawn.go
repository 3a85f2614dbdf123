package localnode

import (
	"fmt"
	"os/exec"
	"runtime"
	"sync"
	"syscall"
)

// spawner forks Pod processes from one OS thread it keeps locked for its
// whole life: Linux sends Pdeathsig when the forking thread ends, so a
// process forked from a short-lived thread would be killed early, and one
// forked from the main thread (which the runtime never ends) would outlive
// the node. Each process leads its own process group, so the node signals
// the whole Pod, and gets SIGKILL when the node dies.
type spawner struct {
	reqs      chan spawnReq
	quit      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

type spawnReq struct {
	cmd   *exec.Cmd
	reply chan error
}

func newSpawner() *spawner {
	s := &spawner{reqs: make(chan spawnReq), quit: make(chan struct{}), done: make(chan struct{})}
	go s.loop()
	return s
}

func (s *spawner) loop() {
	// Never unlocked: the thread ends with this goroutine, firing Pdeathsig
	// for any survivor.
	runtime.LockOSThread()
	if syscall.Gettid() == syscall.Getpid() {
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

// start forks cmd in its own process group with Pdeathsig SIGKILL.
func (s *spawner) start(cmd *exec.Cmd) error {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	reply := make(chan error, 1)
	select {
	case s.reqs <- spawnReq{cmd: cmd, reply: reply}:
		return <-reply
	case <-s.done:
		return fmt.Errorf("the node is shutting down; no new Pod processes")
	}
}

// close ends the spawner's thread; call it after every Pod process is gone.
func (s *spawner) close() {
	s.closeOnce.Do(func() { close(s.quit) })
	<-s.done
}

// signalGroup sends sig to the process group pgid; a group already gone is
// not an error.
func signalGroup(pgid int, sig syscall.Signal) error {
	if err := syscall.Kill(-pgid, sig); err != nil && err != syscall.ESRCH {
		return fmt.Errorf("signal process group %d: %w", pgid, err)
	}
	return nil
}
