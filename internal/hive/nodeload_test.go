package hive

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/gpu"
)

// The node's load comes from /proc/stat (busy over total jiffies since the
// last read) and /proc/meminfo, with the devices' utilisation; it goes
// only as often as the queen asked.
func TestNodeLoadFromProc(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("meminfo", "MemTotal:       1000 kB\nMemFree:        100 kB\nMemAvailable:    250 kB\n")
	write("stat", "cpu  100 0 100 800 0 0 0 0 0 0\ncpu0 100 0 100 800 0 0 0 0 0 0\n")
	n := nodeLoad{proc: procRoot(dir)}
	if n.due(time.Now()) {
		t.Fatal("a load is due before the queen asked for one")
	}
	n.prev, _ = n.proc.cpu()
	// 100 more busy jiffies of 400.
	write("stat", "cpu  150 0 150 1100 0 0 0 0 0 0\n")
	util := 42
	l := n.read([]gpu.Device{{ID: 0, UtilPercent: &util}, {ID: 1}})
	if l.CPUPercent == nil || *l.CPUPercent != 25 || l.MemTotalBytes != 1000<<10 || l.MemAvailableBytes != 250<<10 {
		t.Fatalf("load %+v (cpu %v); want 25%% CPU, 1000 KiB total, 250 KiB available", l, l.CPUPercent)
	}
	if len(l.GPUs) != 1 || l.GPUs[0].ID != 0 || l.GPUs[0].UtilPercent != 42 {
		t.Fatalf("gpus %+v; want device 0 at 42%%", l.GPUs)
	}
	n.every, n.sent = 10*time.Second, time.Now()
	if n.due(n.sent.Add(5*time.Second)) || !n.due(n.sent.Add(10*time.Second)) {
		t.Fatal("a load every 10 s: due after 5 s, or not after 10 s")
	}
	if l := (&nodeLoad{proc: procRoot(filepath.Join(dir, "none"))}).read(nil); l.CPUPercent != nil || l.MemTotalBytes != 0 {
		t.Fatalf("without /proc: %+v; want nothing", l)
	}
}
