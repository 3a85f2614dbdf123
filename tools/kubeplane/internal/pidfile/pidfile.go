// Package pidfile records the processes a cluster starts so that another
// process (kube.sh down) can find and stop them later: a file holds a pid
// and the process's start time, which together name one process even
// after the pid is reused.
package pidfile

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Record names one process.
type Record struct {
	PID        int
	StartTicks uint64 // field 22 of /proc/PID/stat
}

// Of returns the record of the live process pid.
func Of(pid int) (Record, error) {
	t, err := startTicks(pid)
	if err != nil {
		return Record{}, fmt.Errorf("process %d: %w", pid, err)
	}
	return Record{PID: pid, StartTicks: t}, nil
}

// Write stores r at path (atomically: a reader sees the whole record or none).
func Write(path string, r Record) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, fmt.Appendf(nil, "%d %d\n", r.PID, r.StartTicks), 0o644); err != nil {
		return fmt.Errorf("write pid file: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write pid file: %w", err)
	}
	return nil
}

// Read loads the record at path.
func Read(path string) (Record, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Record{}, err
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return Record{}, fmt.Errorf("pid file %s is not \"PID START\"; remove it", path)
	}
	pid, err1 := strconv.Atoi(f[0])
	t, err2 := strconv.ParseUint(f[1], 10, 64)
	if err1 != nil || err2 != nil || pid <= 0 {
		return Record{}, fmt.Errorf("pid file %s is not \"PID START\"; remove it", path)
	}
	return Record{PID: pid, StartTicks: t}, nil
}

// Alive reports whether the recorded process still runs (a zombie does not).
func (r Record) Alive() bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", r.PID))
	if err != nil {
		return false
	}
	st, t, err := parseStat(string(b))
	return err == nil && t == r.StartTicks && st != "Z" && st != "X"
}

// GroupAlive reports whether any live process is in the process group
// r.PID that started no earlier than the group's leader did (so a reused
// group id is not mistaken for it).
func (r Record) GroupAlive() bool { return len(r.groupMembers()) > 0 }

func (r Record) groupMembers() []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 20 || f[0] == "Z" || f[0] == "X" {
			continue
		}
		pgid, _ := strconv.Atoi(f[2])
		t, _ := strconv.ParseUint(f[19], 10, 64)
		if pgid == r.PID && t >= r.StartTicks {
			out = append(out, pid)
		}
	}
	return out
}

// StopGroup sends SIGTERM to the process group that r leads, waits up to
// grace for all of it to go, then sends SIGKILL and waits up to a few more
// seconds. It returns nil once nothing of the group runs.
func (r Record) StopGroup(grace time.Duration) error {
	if !r.GroupAlive() {
		return nil
	}
	r.signalGroup(syscall.SIGTERM)
	if waitGone(r, grace) {
		return nil
	}
	r.signalGroup(syscall.SIGKILL)
	if waitGone(r, 5*time.Second) {
		return nil
	}
	return fmt.Errorf("process group %d survived SIGKILL; look for it with `ps -g %d`", r.PID, r.PID)
}

func (r Record) signalGroup(sig syscall.Signal) {
	if r.Alive() {
		_ = syscall.Kill(-r.PID, sig)
		return
	}
	// The leader is gone: signal the members one by one, each checked to
	// belong to this group, rather than a group id that may be reused.
	for _, pid := range r.groupMembers() {
		_ = syscall.Kill(pid, sig)
	}
}

func waitGone(r Record, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		if !r.GroupAlive() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func startTicks(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	_, t, err := parseStat(string(b))
	return t, err
}

// parseStat returns the state and start time of a /proc/PID/stat line; the
// command name in parentheses may hold spaces, so fields count from the
// last ')'.
func parseStat(s string) (state string, ticks uint64, err error) {
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return "", 0, errors.New("malformed /proc stat")
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return "", 0, errors.New("malformed /proc stat")
	}
	ticks, err = strconv.ParseUint(f[19], 10, 64)
	return f[0], ticks, err
}
