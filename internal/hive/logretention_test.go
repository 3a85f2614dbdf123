package hive

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Issue 12: worker log files were never removed. Those of ended workers
// last written before the cutoff go; recent ones, live workers' and other
// files stay.
func TestPruneLogs(t *testing.T) {
	dir := t.TempDir()
	old := time.Now().Add(-48 * time.Hour)
	for name, mtime := range map[string]time.Time{
		"worker-old.log": old, "worker-live.log": old, "worker-new.log": time.Now(), "notes.txt": old,
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
	if err != nil || n != 1 {
		t.Fatalf("removed %d, %v; want 1", n, err)
	}
	for name, want := range map[string]bool{"worker-old.log": false, "worker-live.log": true, "worker-new.log": true, "notes.txt": true} {
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

// Issue 12: a worker that logs without end filled the disk. Its log file
// stops at a bound with a line that says so; the log goes on in memory.
func TestWorkerLogFileIsBounded(t *testing.T) {
	p := filepath.Join(t.TempDir(), "worker-chatty.log")
	l := newWorkerLog(p)
	l.maxFile = 1000
	line := []byte("0123456789012345678901234567890123456789\n") // 41 bytes
	for range 100 {
		_, _ = l.Write(line)
	}
	l.close()
	st, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if st.Size() > 1000+200 {
		t.Errorf("log file of %d bytes, bound 1000", st.Size())
	}
	b, _ := os.ReadFile(p)
	if !strings.Contains(string(b), "kept in memory only") {
		t.Errorf("the file does not say it stopped:\n%s", b[max(0, len(b)-200):])
	}
	if got := l.Tail(1); got != strings.TrimSpace(string(line)) {
		t.Errorf("the ring's last line %q", got)
	}
}
