package benchmark

import (
	"bufio"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// Machine describes the machine a benchmark ran on.
type Machine struct {
	CPU      string // model name
	Cores    int    // logical CPUs
	Flags    string // the SIMD flags llama.cpp cares about
	MemBytes uint64
	Kernel   string
	OS       string
}

// ThisMachine reads /proc and /etc/os-release; what it cannot read stays
// empty.
func ThisMachine() Machine {
	m := Machine{Cores: runtime.NumCPU()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			k, v, ok := strings.Cut(line, ":")
			if !ok {
				continue
			}
			switch strings.TrimSpace(k) {
			case "model name":
				if m.CPU == "" {
					m.CPU = strings.TrimSpace(v)
				}
			case "flags":
				if m.Flags == "" {
					m.Flags = simdFlags(strings.Fields(v))
				}
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		sc := bufio.NewScanner(strings.NewReader(string(b)))
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
				kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
				m.MemBytes = kb << 10
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/etc/os-release"); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "PRETTY_NAME="); ok {
				m.OS = strings.Trim(v, `"`)
			}
		}
	}
	return m
}

// simdFlags keeps the CPU flags that decide ggml's kernels, in a fixed order.
func simdFlags(flags []string) string {
	have := make(map[string]bool, len(flags))
	for _, f := range flags {
		have[f] = true
	}
	var out []string
	for _, f := range []string{"sse3", "ssse3", "avx", "avx2", "fma", "f16c", "bmi2", "avx_vnni",
		"avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "amx_tile"} {
		if have[f] {
			out = append(out, f)
		}
	}
	return strings.Join(out, " ")
}

// LoadAverage is /proc/loadavg's first three figures, "" if unreadable.
func LoadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

// cpuSnapshot is the CPU time used so far, in clock ticks (USER_HZ): by the
// whole machine, including time stolen by the hypervisor, and by some of
// its processes.
type cpuSnapshot struct {
	at    time.Time
	busy  uint64   // user+nice+system+irq+softirq+steal of all CPUs
	procs []uint64 // utime+stime of each process asked for
	ok    bool     // false if /proc could not be read
}

// userHZ is the unit of /proc's CPU times; Linux fixes it at 100 for user
// space on every architecture Go runs on.
const userHZ = 100

// takeCPUSnapshot reads /proc/stat and /proc/PID/stat of pids.
func takeCPUSnapshot(pids ...int) cpuSnapshot {
	s := cpuSnapshot{at: time.Now()}
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return s
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line) // cpu user nice system idle iowait irq softirq steal …
	if len(f) < 9 || f[0] != "cpu" {
		return s
	}
	for _, i := range []int{1, 2, 3, 6, 7, 8} {
		n, _ := strconv.ParseUint(f[i], 10, 64)
		s.busy += n
	}
	for _, pid := range pids {
		t, ok := processTicks(pid)
		if !ok {
			return s
		}
		s.procs = append(s.procs, t)
	}
	s.ok = true
	return s
}

// processTicks is utime+stime of the process (all its threads).
func processTicks(pid int) (uint64, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	// Fields after the command name, which may hold spaces, in parentheses.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(string(b[i+1:])) // state is f[0]; utime field 14 is f[11]
	if len(f) < 13 {
		return 0, false
	}
	u, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return u + st, true
}

// foreignCores is how many CPUs, on average between the two snapshots,
// went to anything but the processes they were taken for (other processes,
// the kernel on their behalf, the hypervisor's steal); -1 if unknown.
func foreignCores(before, after cpuSnapshot) float64 {
	wall := after.at.Sub(before.at).Seconds()
	if !before.ok || !after.ok || len(before.procs) != len(after.procs) || wall <= 0 {
		return -1
	}
	busy := float64(after.busy) - float64(before.busy)
	for i := range before.procs {
		busy -= float64(after.procs[i]) - float64(before.procs[i])
	}
	return max(0, busy/userHZ/wall)
}
