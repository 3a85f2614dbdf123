package hive

import (
	"bufio"
	"bytes"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/gpu"
)

// The node's load, for the queen's per-node graphs: read from /proc (two
// small files) and the devices the heartbeat reads anyway, sent with a
// heartbeat at most as often as the queen's last answer asks
// (api.HeartbeatAnswer.LoadEverySeconds). No agent of its own.

// procRoot is where /proc is (tests point it at a directory of their own).
type procRoot string

// cpuTimes are /proc/stat's first line: the jiffies all the node's CPUs
// spent busy and in total since boot.
type cpuTimes struct{ busy, total uint64 }

// nodeLoad keeps the last CPU times read, to turn the next into a
// percentage; the heartbeat loop's alone.
type nodeLoad struct {
	proc procRoot
	prev cpuTimes
	// sent is when the last load went with a beat; every is how often the
	// queen asked for it (0: it did not).
	sent  time.Time
	every time.Duration
}

// due reports whether a load goes with the beat at now.
func (n *nodeLoad) due(now time.Time) bool { return n.every > 0 && now.Sub(n.sent) >= n.every }

// read returns the load now, from the devices devs the heartbeat read.
func (n *nodeLoad) read(devs []gpu.Device) *api.NodeLoad {
	out := &api.NodeLoad{}
	if cur, ok := n.proc.cpu(); ok {
		if d := cur.total - n.prev.total; n.prev.total > 0 && cur.total > n.prev.total && cur.busy >= n.prev.busy {
			pct := min(100, float64(cur.busy-n.prev.busy)/float64(d)*100)
			out.CPUPercent = &pct
		}
		n.prev = cur
	}
	out.MemTotalBytes, out.MemAvailableBytes = n.proc.memory()
	for _, d := range devs {
		if d.UtilPercent != nil {
			out.GPUs = append(out.GPUs, api.GPULoad{ID: d.ID, UtilPercent: *d.UtilPercent})
		}
	}
	return out
}

// readSmall reads at most 64 KiB of a /proc file (they are a few lines).
func (p procRoot) readSmall(name string) ([]byte, bool) {
	f, err := os.Open(string(p) + "/" + name)
	if err != nil {
		return nil, false
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, 64<<10))
	return data, err == nil
}

// cpu reads /proc/stat's "cpu" line: user nice system idle iowait irq
// softirq steal …; idle and iowait are not busy, guest time is already in
// user.
func (p procRoot) cpu() (cpuTimes, bool) {
	data, ok := p.readSmall("stat")
	if !ok {
		return cpuTimes{}, false
	}
	line, _, _ := bytes.Cut(data, []byte("\n"))
	fields := bytes.Fields(line)
	if len(fields) < 5 || string(fields[0]) != "cpu" {
		return cpuTimes{}, false
	}
	var t cpuTimes
	for i, f := range fields[1:min(len(fields), 9)] {
		v, err := strconv.ParseUint(string(f), 10, 64)
		if err != nil {
			return cpuTimes{}, false
		}
		t.total += v
		if i != 3 && i != 4 { // idle, iowait
			t.busy += v
		}
	}
	return t, true
}

// memory reads /proc/meminfo's MemTotal and MemAvailable, in bytes.
func (p procRoot) memory() (total, available uint64) {
	data, ok := p.readSmall("meminfo")
	if !ok {
		return 0, 0
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		fields := bytes.Fields(sc.Bytes())
		if len(fields) < 2 {
			continue
		}
		v, err := strconv.ParseUint(string(fields[1]), 10, 64)
		if err != nil {
			continue
		}
		switch string(fields[0]) {
		case "MemTotal:":
			total = v << 10
		case "MemAvailable:":
			available = v << 10
		}
	}
	return total, min(available, total)
}
