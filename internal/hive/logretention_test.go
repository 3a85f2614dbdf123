package hive

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Ended workers' log files last written before the cutoff go, a rotated
// one with its .log: a worker's files are judged by the newest of them.
// Recent ones, live workers' and other files stay.
func TestPruneLogs(t *testing.T) {
	dir := t.TempDir()
	old := time.Now().Add(-48 * time.Hour)
	now := time.Now()
	for name, mtime := range map[string]time.Time{
		"worker-old.log": old, "worker-old.log.1": old,
		"worker-live.log": old, "worker-live.log.1": old,
		"worker-new.log": now, "worker-new.log.1": old, // rotated long ago, written since
		"worker-orphan.log.1": old, // a rotation that did not make the new file
		"worker-x.log.bak":    old, ".log": old, "notes.txt": old,
	} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, mtime, mtime); err != nil {
			t.Fatal(err)
		}
	}
	n, err := pruneLogs(dir, time.Now().Add(-24*time.Hour), map[string]bool{"worker-live": true})
	if err != nil || n != 3 {
		t.Fatalf("removed %d, %v; want 3", n, err)
	}
	for name, want := range map[string]bool{
		"worker-old.log": false, "worker-old.log.1": false, "worker-orphan.log.1": false,
		"worker-live.log": true, "worker-live.log.1": true, "worker-new.log": true, "worker-new.log.1": true,
		"worker-x.log.bak": true, ".log": true, "notes.txt": true,
	} {
		if _, err := os.Stat(filepath.Join(dir, name)); (err == nil) != want {
			t.Errorf("%s: exists %v, want %v", name, err == nil, want)
		}
	}
}

// A hive prunes at its start: the log of a worker an earlier hive ran a
// retention ago is gone once the hive serves.
func TestHivePrunesOldLogsAtStart(t *testing.T) {
	dir := t.TempDir()
	logs := filepath.Join(dir, "hive", "logs")
	if err := os.MkdirAll(logs, 0o755); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(logs, "worker-gone.log")
	if err := os.WriteFile(p, []byte("last words"), 0o644); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-2 * time.Hour)
	if err := os.Chtimes(p, old, old); err != nil {
		t.Fatal(err)
	}
	th := startHive(t, func(c *Config) { c.DataDir = dir; c.LogRetention = time.Hour })
	deadline := time.Now().Add(waitLimit)
	for {
		if _, err := os.Stat(p); os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the old log is still there; hive log:\n%s", th.logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}
