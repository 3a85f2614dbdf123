package benchmark

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ServerConfig describes a server process to start.
type ServerConfig struct {
	Name string   // for messages and the report
	Path string   // executable
	Args []string // its arguments
	Port int      // the port Args make it listen on, on 127.0.0.1
	// Log receives the process's stdout and stderr; nil discards them.
	Log io.Writer
	// ReadyTimeout bounds the wait for GET /health to report ready.
	ReadyTimeout time.Duration
}

// Server is a running server process.
type Server struct {
	Name    string
	URL     string // http://127.0.0.1:PORT
	cmd     *exec.Cmd
	waitErr chan error
	once    sync.Once
	err     error
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("finding a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// StartServer starts the process in its own process group and waits until
// its GET /health says it is ready: HTTP 200 with "status" "ok"
// (llama-server) or "ready" (apiary). The process is stopped if ctx ends.
func StartServer(ctx context.Context, cfg ServerConfig) (*Server, error) {
	if cfg.ReadyTimeout <= 0 {
		cfg.ReadyTimeout = 2 * time.Minute
	}
	cmd := exec.CommandContext(ctx, cfg.Path, cfg.Args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	cmd.Stdout, cmd.Stderr = cfg.Log, cfg.Log
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", cfg.Name, err)
	}
	s := &Server{
		Name:    cfg.Name,
		URL:     "http://127.0.0.1:" + strconv.Itoa(cfg.Port),
		cmd:     cmd,
		waitErr: make(chan error, 1),
	}
	go func() { s.waitErr <- cmd.Wait() }()

	if err := s.waitReady(ctx, cfg.ReadyTimeout); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// waitReady polls GET /health; a server process offers nothing to wait on.
func (s *Server) waitReady(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	client := &http.Client{Timeout: 2 * time.Second}
	last := "no answer"
	for {
		select {
		case err := <-s.waitErr:
			s.waitErr <- err
			return fmt.Errorf("%s exited before it was ready: %v (see its log)", s.Name, err)
		case <-ctx.Done():
			return fmt.Errorf("%s not ready after %s (last health: %s): %w", s.Name, timeout, last, ctx.Err())
		case <-tick.C:
		}
		ready, status, err := health(ctx, client, s.URL)
		if err != nil {
			last = err.Error()
			continue
		}
		if ready {
			return nil
		}
		last = status
	}
}

// health asks url's GET /health whether the server is ready.
func health(ctx context.Context, client *http.Client, url string) (ready bool, status string, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/health", nil)
	if err != nil {
		return false, "", err
	}
	resp, err := client.Do(req)
	if err != nil {
		return false, "", err
	}
	defer resp.Body.Close()
	var h struct {
		Status string `json:"status"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<16)).Decode(&h); err != nil {
		return false, resp.Status, nil
	}
	status = fmt.Sprintf("%s %q", resp.Status, h.Status)
	return resp.StatusCode == http.StatusOK && (h.Status == "ok" || h.Status == "ready"), status, nil
}

// PID is the server's process id.
func (s *Server) PID() int { return s.cmd.Process.Pid }

// PeakRSS is the process's peak resident memory (VmHWM) in bytes, 0 if
// unknown.
func (s *Server) PeakRSS() uint64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", s.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				return 0
			}
			return kb << 10
		}
	}
	return 0
}

// Close stops the server: SIGTERM to its process group, SIGKILL after ten
// seconds. It returns nil for an exit caused by the signal. Close is
// idempotent.
func (s *Server) Close() error {
	s.once.Do(func() {
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGTERM)
		var err error
		select {
		case err = <-s.waitErr:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
			err = <-s.waitErr
		}
		if err != nil && !stoppedBySignal(err) {
			s.err = fmt.Errorf("%s: %w", s.Name, err)
		}
	})
	return s.err
}

// stoppedBySignal reports an exit that stopping the server explains: killed
// by a signal, or exited with 0 or 128+SIGTERM after handling SIGTERM.
func stoppedBySignal(err error) bool {
	if errors.Is(err, context.Canceled) {
		return true // exec reports a stop through cmd.Cancel so
	}
	var exit *exec.ExitError
	if !errors.As(err, &exit) {
		return false
	}
	if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return true
	}
	code := exit.ExitCode()
	return code == 0 || code == 128+int(syscall.SIGTERM)
}
