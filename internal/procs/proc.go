package procs

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"syscall"
)

// Identity names a process across a daemon's restart: a pid alone may be
// reused, a pid with its start time (clock ticks since boot) may not.
type Identity struct {
	PID        int    `json:"pid"`
	PGID       int    `json:"pgid"`
	StartTicks uint64 `json:"start_ticks"`
}

// ErrNoProcess means no live process has the pid.
var ErrNoProcess = errors.New("no such process")

// Stat is the part of /proc/PID/stat this package reads.
type Stat struct {
	State      byte
	PPID       int
	PGID       int
	StartTicks uint64
}

// ReadStat reads /proc/PID/stat. A zombie is reported like any process;
// use Stat.Alive to tell.
func ReadStat(pid int) (Stat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
		return Stat{}, fmt.Errorf("%w: %d", ErrNoProcess, pid)
	}
	if err != nil {
		return Stat{}, fmt.Errorf("read stat of %d: %w", pid, err)
	}
	return ParseStat(b)
}

// ParseStat parses the text of /proc/PID/stat.
func ParseStat(b []byte) (Stat, error) {
	// The command name is in parentheses and may contain anything, so
	// fields are counted from the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return Stat{}, errors.New("malformed stat")
	}
	f := bytes.Fields(b[i+1:])
	// f[0] is field 3 (state); pgrp is field 5, starttime field 22.
	if len(f) < 20 || len(f[0]) != 1 {
		return Stat{}, errors.New("short stat")
	}
	ppid, err1 := strconv.Atoi(string(f[1]))
	pgid, err2 := strconv.Atoi(string(f[2]))
	start, err3 := strconv.ParseUint(string(f[19]), 10, 64)
	if err := errors.Join(err1, err2, err3); err != nil {
		return Stat{}, fmt.Errorf("malformed stat: %w", err)
	}
	return Stat{State: f[0][0], PPID: ppid, PGID: pgid, StartTicks: start}, nil
}

// Alive reports whether the process runs (neither zombie nor dead).
func (s Stat) Alive() bool { return s.State != 'Z' && s.State != 'X' && s.State != 'x' }

// StartTicks is the start time of pid in clock ticks since boot.
func StartTicks(pid int) (uint64, error) {
	s, err := ReadStat(pid)
	return s.StartTicks, err
}

// Alive reports whether the process id names is still the same, living
// process.
func (id Identity) Alive() bool {
	s, err := ReadStat(id.PID)
	return err == nil && s.Alive() && s.StartTicks == id.StartTicks
}

// GroupMembers lists the living processes whose process group is pgid
// (a zombie whose other threads still exit counts: it holds its files).
func GroupMembers(pgid int) ([]int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("list /proc: %w", err)
	}
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		s, err := ReadStat(pid)
		if err != nil || s.PGID != pgid {
			continue
		}
		// A zombie leader whose other threads are still exiting holds the
		// process's files (its listening socket) until the last is gone.
		if s.Alive() || tasks(pid) > 1 {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// tasks is how many threads pid still has (0 when it is gone).
func tasks(pid int) int {
	ents, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/task")
	if err != nil {
		return 0
	}
	return len(ents)
}

// KillSurvivors sends SIGKILL to the process id names and to every member
// of its process group, if they are still ours: the leader must be either
// gone or the very process recorded (same start time). A leader pid now
// held by another process means the group id may belong to someone else,
// and nothing is killed. It returns the pids it signalled.
func KillSurvivors(id Identity) ([]int, error) {
	s, err := ReadStat(id.PID)
	switch {
	case err == nil && s.Alive() && s.StartTicks != id.StartTicks:
		return nil, nil // pid reused
	case err != nil && !errors.Is(err, ErrNoProcess):
		return nil, err
	}
	pgid := id.PGID
	if pgid == 0 {
		pgid = id.PID
	}
	members, err := GroupMembers(pgid)
	if err != nil {
		return nil, err
	}
	if len(members) == 0 {
		return nil, nil
	}
	if err := killGroup(pgid, syscall.SIGKILL); err != nil {
		return nil, err
	}
	return members, nil
}

// ReadRSS is the resident set of pid in bytes, from /proc/PID/status.
func ReadRSS(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, fmt.Errorf("read status of %d: %w", pid, err)
	}
	for line := range bytes.Lines(b) {
		if rest, ok := bytes.CutPrefix(line, []byte("VmRSS:")); ok {
			f := bytes.Fields(rest)
			if len(f) != 2 || string(f[1]) != "kB" {
				break
			}
			kb, err := strconv.ParseUint(string(f[0]), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("VmRSS of %d: %w", pid, err)
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("no VmRSS for %d", pid)
}
