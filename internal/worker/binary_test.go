package worker

// Helpers of the integration tests: build (once) and run the real apiary
// binary, and follow its JSON logs.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/testbin"
	"github.com/apiary-llm/apiary/internal/testmodel"
)

// apiaryBin is the binary under test: $APIARY_BIN (set by make test), or
// one built once per test run by testbin. A failed build fails the test.
func apiaryBin(t *testing.T) string { return testbin.Path(t) }

// testModelPath writes the tiny test model as tiny.gguf in a temp dir.
func testModelPath(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tiny.gguf")
	if err := testmodel.WriteFile(path, testmodel.Options{Seed: 7}); err != nil {
		t.Fatal(err)
	}
	return path
}

// toolModelPath writes the test model with its Hermes-style tool chat
// template (testmodel.ToolChatTemplate) as tiny.gguf in a temp dir.
func toolModelPath(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tiny.gguf")
	if err := testmodel.WriteFile(path, testmodel.Options{Seed: 7, ToolTemplate: true}); err != nil {
		t.Fatal(err)
	}
	return path
}

// proc is a running apiary process whose stderr is collected; its JSON log
// records can be waited for.
type proc struct {
	cmd    *exec.Cmd
	exited chan struct{} // closed once the process was reaped

	mu      sync.Mutex
	stderr  bytes.Buffer     // guarded by mu
	records []map[string]any // guarded by mu
	notify  chan struct{}    // capacity 1: "records grew"
}

// startApiary runs the binary with args and extra environment; the process
// is killed when the test ends if it is still running.
func startApiary(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	return startCommand(t, env, apiaryBin(t), args...)
}

// startCommand runs name with args (apiary, or apiary under an emulator)
// and collects its stderr as startApiary does.
func startCommand(t *testing.T, env []string, name string, args ...string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(name, args...), exited: make(chan struct{}), notify: make(chan struct{}, 1)}
	p.cmd.Env = append(os.Environ(), env...)
	return p.start(t)
}

// start starts p's command, set up by the caller, and collects its stderr.
func (p *proc) start(t *testing.T) *proc {
	t.Helper()
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { // ends when the process closes stderr, then reaps it
		sc := bufio.NewScanner(stderr)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			line := sc.Bytes()
			var rec map[string]any
			p.mu.Lock()
			p.stderr.Write(line)
			p.stderr.WriteByte('\n')
			if json.Unmarshal(line, &rec) == nil {
				p.records = append(p.records, rec)
			}
			p.mu.Unlock()
			select {
			case p.notify <- struct{}{}:
			default:
			}
		}
		_ = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			_ = p.cmd.Process.Kill()
			<-p.exited
			t.Logf("apiary stderr:\n%s", p.output())
		}
	})
	return p
}

func (p *proc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stderr.String()
}

// waitLog waits for a JSON log record with message msg for which match
// (nil: any) holds, and returns it.
func (p *proc) waitLog(t *testing.T, msg string, match func(map[string]any) bool) map[string]any {
	t.Helper()
	timeout := time.NewTimer(60 * time.Second)
	defer timeout.Stop()
	for seen := 0; ; {
		p.mu.Lock()
		recs := p.records[seen:]
		seen = len(p.records)
		p.mu.Unlock()
		for _, rec := range recs {
			if rec["msg"] == msg && (match == nil || match(rec)) {
				return rec
			}
		}
		select {
		case <-p.notify:
		case <-p.exited:
			p.mu.Lock()
			more := len(p.records) > seen
			p.mu.Unlock()
			if !more {
				t.Fatalf("apiary exited before logging %q; stderr:\n%s", msg, p.output())
			}
		case <-timeout.C:
			t.Fatalf("apiary did not log %q within 60s; stderr:\n%s", msg, p.output())
		}
	}
}

// exitCode waits for the process to end and returns its exit code.
func (p *proc) exitCode(t *testing.T) int {
	t.Helper()
	select {
	case <-p.exited:
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(60 * time.Second):
		t.Fatalf("apiary did not exit within 60s; stderr:\n%s", p.output())
		return -1
	}
}

func (p *proc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %v: %v", sig, err)
	}
}

// startWorkerBinary runs `apiary worker` on a free loopback port with the
// given extra flags and waits until it is ready; it returns the process and
// the worker's base URL. It runs llama.cpp on one thread: on a busy machine
// (tests of other packages run at the same time) more threads than free
// CPUs make llama.cpp's spinning thread barriers a hundred times slower.
func startWorkerBinary(t *testing.T, env []string, flags ...string) (*proc, string) {
	t.Helper()
	return startWorkerBinaryOn(t, testModelPath(t), env, flags...)
}

// startWorkerBinaryOn is startWorkerBinary with another model file.
func startWorkerBinaryOn(t *testing.T, model string, env []string, flags ...string) (*proc, string) {
	t.Helper()
	args := append([]string{"worker", "--model", model, "--port", "0", "--log-json", "--threads", "1"}, flags...)
	p := startApiary(t, env, args...)
	rec := p.waitLog(t, "listening", nil)
	addr, _ := rec["addr"].(string)
	p.waitLog(t, "worker status changed", func(r map[string]any) bool { return r["to"] == "ready" })
	return p, "http://" + addr
}

// A worker serves on a socket it inherits (--listen-fd, as a hive starts
// it): the port is the one bound for it, and a --port that disagrees is
// refused.
func TestBinaryInheritedListener(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	f, err := ln.(*net.TCPListener).File()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	run := func(portFlag int) *proc {
		p := &proc{cmd: exec.Command(apiaryBin(t), "worker", "--model", testModelPath(t), "--port", strconv.Itoa(portFlag),
			"--listen-fd", "3", "--log-json", "--threads", "1"), exited: make(chan struct{}), notify: make(chan struct{}, 1)}
		p.cmd.ExtraFiles = []*os.File{f}
		return p.start(t)
	}

	wrong := run(port + 1)
	if code := wrong.exitCode(t); code != 2 || !strings.Contains(wrong.output(), "but --port says") {
		t.Errorf("--port disagreeing with the socket: exit %d, stderr:\n%s", code, wrong.output())
	}

	p := run(port)
	rec := p.waitLog(t, "listening", nil)
	if rec["addr"] != ln.Addr().String() {
		t.Errorf("worker listens on %v, want the inherited %s", rec["addr"], ln.Addr())
	}
	p.waitLog(t, "worker status changed", func(r map[string]any) bool { return r["to"] == "ready" })
	resp, err := http.Get("http://" + ln.Addr().String() + "/health")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("health on the inherited socket: %v %v", resp, err)
	}
	resp.Body.Close()
}
