package localnode

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/apiary-llm/apiary/tools/kubeplane/internal/pidfile"
	corev1 "k8s.io/api/core/v1"
)

// podRun is one Pod on the node. Its goroutine (run) owns the process;
// others ask it to stop through requestStop.
type podRun struct {
	p   *provider
	log *slog.Logger
	dir string // logs, pid file and default working directory

	pod      *corev1.Pod // guarded by p.mu; Status mirrors state
	state    podState    // guarded by p.mu
	deleting bool        // guarded by p.mu

	stopOnce sync.Once
	stopCh   chan struct{} // closed by requestStop
	grace    time.Duration // written before stopCh is closed
	done     chan struct{} // closed when the process is gone, or never started
}

func (r *podRun) logPath() string { return filepath.Join(r.dir, "container.log") }

// PidPath is where a Pod's process group is recorded, for kube.sh down.
func (r *podRun) pidPath() string { return filepath.Join(r.dir, "pgid") }

// requestStop asks run to stop the process: SIGTERM now, SIGKILL after
// grace. Only the first request counts.
func (r *podRun) requestStop(grace time.Duration) {
	r.stopOnce.Do(func() {
		r.grace = grace
		close(r.stopCh)
	})
}

// run starts the Pod's process, reports its status as it changes and
// stops it when asked or when the node stops.
func (r *podRun) run(ctx context.Context) {
	defer func() {
		close(r.done)
		r.p.mu.Lock()
		deleting := r.deleting
		r.p.releaseIPLocked(r.state.podIP)
		r.p.mu.Unlock()
		if deleting {
			r.p.forget(r)
		}
	}()
	cmd, logFile, err := r.prepare(ctx)
	if err != nil {
		r.fail(err)
		return
	}
	defer logFile.Close()
	if err := r.p.spawner.start(cmd); err != nil {
		r.fail(&configError{Reason: "CreateContainerError", Msg: fmt.Sprintf("start %s: %v", cmd.Path, err)})
		return
	}
	pgid := cmd.Process.Pid
	if rec, err := pidfile.Of(pgid); err == nil {
		if err := pidfile.Write(r.pidPath(), rec); err != nil {
			r.log.Warn("kube.sh down will not find this Pod's process group", "err", err)
		}
	}
	r.log.Info("pod process started", "pid", pgid, "path", cmd.Path, "image_ignored", r.pod.Spec.Containers[0].Image)
	probe := r.pod.Spec.Containers[0].ReadinessProbe
	r.p.setState(r, func(s *podState) {
		s.started = time.Now()
		s.ready = probe == nil
	})
	probeCtx, stopProbe := context.WithCancel(ctx)
	var probes sync.WaitGroup
	if probe != nil {
		probes.Go(func() { r.probeReadiness(probeCtx, probe) })
	}

	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	var waitErr error
	stopCh := r.stopCh
	nodeDone := ctx.Done()
	var kill <-chan time.Time
	for exited := false; !exited; {
		select {
		case waitErr = <-waited:
			exited = true
		case <-stopCh:
			stopCh = nil
			r.log.Info("stopping pod process", "signal", "SIGTERM", "grace", r.grace)
			_ = signalGroup(pgid, syscall.SIGTERM)
			kill = time.After(r.grace)
		case <-nodeDone:
			// The node stops: stopAll has asked for a stop with a bounded grace.
			nodeDone = nil
		case <-kill:
			kill = nil
			r.log.Info("grace period over", "signal", "SIGKILL")
			_ = signalGroup(pgid, syscall.SIGKILL)
		}
	}
	// The leader is gone; what it left in its group goes with it, as a
	// container's processes go with the container.
	_ = signalGroup(pgid, syscall.SIGKILL)
	stopProbe()
	probes.Wait()
	os.Remove(r.pidPath())

	code, sig := exitOf(cmd, waitErr)
	r.log.Info("pod process exited", "exit_code", code, "signal", sig)
	r.p.setState(r, func(s *podState) {
		s.exited, s.exitCode, s.signal, s.finished, s.ready = true, code, sig, time.Now(), false
	})
}

// prepare resolves everything the process needs: volumes, env, command,
// log file. A Pod the node cannot run yields a *configError.
func (r *podRun) prepare(ctx context.Context) (*exec.Cmd, *os.File, error) {
	r.p.mu.Lock()
	pod := r.pod.DeepCopy()
	r.p.mu.Unlock()
	if len(pod.Spec.Containers) == 0 {
		return nil, nil, &configError{Reason: "CreateContainerConfigError", Msg: "the Pod has no container"}
	}
	c := &pod.Spec.Containers[0]
	if len(pod.Spec.Containers) > 1 || len(pod.Spec.InitContainers) > 0 {
		r.log.Warn("the stand-in node runs only the first container; the others are ignored")
	}
	if err := checkVolumes(pod, c); err != nil {
		return nil, nil, err
	}
	env, err := containerEnv(ctx, objectsFromAPI{r.p.client}, pod, c)
	if err != nil {
		return nil, nil, err
	}
	path, args, err := commandLine(c, env, r.p.path)
	if err != nil {
		return nil, nil, err
	}
	if pol := pod.Spec.RestartPolicy; pol != "" && pol != corev1.RestartPolicyNever {
		note := fmt.Sprintf("the stand-in node does not restart containers: restartPolicy %s is treated as Never", pol)
		r.log.Warn(note)
		r.p.setState(r, func(s *podState) { s.note = note })
	}
	if err := os.MkdirAll(r.dir, 0o755); err != nil {
		return nil, nil, fmt.Errorf("create the Pod directory: %w", err)
	}
	logFile, err := os.OpenFile(r.logPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, nil, fmt.Errorf("open the container log: %w", err)
	}
	cmd := &exec.Cmd{
		Path:   path,
		Args:   append([]string{c.Command[0]}, args...),
		Dir:    r.dir,
		Stdout: logFile,
		Stderr: logFile,
	}
	if c.WorkingDir != "" {
		cmd.Dir = c.WorkingDir
	}
	for _, e := range env {
		cmd.Env = append(cmd.Env, e.Name+"="+e.Value)
	}
	cmd.Env = append(cmd.Env, "PATH="+r.p.path, "HOME="+os.Getenv("HOME"))
	return cmd, logFile, nil
}

// fail reports that the Pod's process could not start.
func (r *podRun) fail(err error) {
	reason, msg := "CreateContainerError", err.Error()
	var ce *configError
	if errors.As(err, &ce) {
		reason = ce.Reason
	}
	r.log.Warn("pod failed before its process started", "reason", reason, "err", msg)
	r.p.setState(r, func(s *podState) {
		s.failed, s.waitReason, s.waitMessage = true, reason, msg
	})
}

// exitOf is the exit code and signal of a process that Wait returned err for.
func exitOf(cmd *exec.Cmd, err error) (int, syscall.Signal) {
	ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ok {
		if err != nil {
			return 1, 0
		}
		return 0, 0
	}
	if ws.Signaled() {
		return 128 + int(ws.Signal()), ws.Signal()
	}
	return ws.ExitStatus(), 0
}
