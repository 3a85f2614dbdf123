package hive

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/apiary-llm/apiary/internal/datadir"
	"github.com/apiary-llm/apiary/internal/procs"
)

// A hive keeps, in its data dir, one record per live child (pid, process
// group and start time). A hive that is killed cannot clean up; the next
// hive on the same data dir reads the records and kills whatever survived
// before it serves.

type childRecord struct {
	WorkerID  string         `json:"worker_id"`
	Process   procs.Identity `json:"process"`
	SpawnedAt time.Time      `json:"spawned_at"`
}

type dataDir struct {
	root string
	lock *os.File
}

func (d *dataDir) childrenDir() string { return filepath.Join(d.root, "hive", "children") }
func (d *dataDir) logsDir() string     { return filepath.Join(d.root, "hive", "logs") }

// openDataDir creates the hive's directories and takes an exclusive lock,
// so two hives never share one data dir. The kernel drops the lock when
// the hive dies, however it dies.
func openDataDir(root string) (*dataDir, error) {
	d := &dataDir{root: root}
	for _, dir := range []string{d.childrenDir(), d.logsDir()} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("%w %s: %w", datadir.ErrUnusable, root, err)
		}
	}
	f, err := os.OpenFile(filepath.Join(root, "hive", "lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("%w %s: lock: %w", datadir.ErrUnusable, root, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("another hive is using data dir %s", root)
		}
		return nil, fmt.Errorf("%w %s: lock: %w", datadir.ErrUnusable, root, err)
	}
	d.lock = f
	return d, nil
}

func (d *dataDir) close() {
	if d.lock != nil {
		d.lock.Close()
		d.lock = nil
	}
}

func (d *dataDir) recordPath(workerID string) string {
	return filepath.Join(d.childrenDir(), workerID+".json")
}

// writeRecord stores a child's record atomically (write, fsync, rename).
func (d *dataDir) writeRecord(r childRecord) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(d.childrenDir(), ".tmp-*")
	if err != nil {
		return fmt.Errorf("child record: %w", err)
	}
	_, werr := tmp.Write(b)
	serr := tmp.Sync()
	cerr := tmp.Close()
	if err := errors.Join(werr, serr, cerr); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("child record: %w", err)
	}
	if err := os.Rename(tmp.Name(), d.recordPath(r.WorkerID)); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("child record: %w", err)
	}
	return nil
}

func (d *dataDir) removeRecord(workerID string) {
	_ = os.Remove(d.recordPath(workerID))
}

// reapSurvivors kills the children a previous hive left behind and waits,
// up to timeout, until they are gone. It returns the pids it killed.
func (d *dataDir) reapSurvivors(logger *slog.Logger, timeout time.Duration) ([]int, error) {
	ents, err := os.ReadDir(d.childrenDir())
	if err != nil {
		return nil, fmt.Errorf("read child records: %w", err)
	}
	var all []int
	var groups []int
	for _, e := range ents {
		path := filepath.Join(d.childrenDir(), e.Name())
		if !strings.HasSuffix(e.Name(), ".json") {
			os.Remove(path) // a temp file from an interrupted write
			continue
		}
		b, err := os.ReadFile(path)
		var r childRecord
		if err == nil {
			err = json.Unmarshal(b, &r)
		}
		if err != nil {
			logger.Warn("unreadable child record, removing it", "path", path, "err", err)
			os.Remove(path)
			continue
		}
		killed, err := procs.KillSurvivors(r.Process)
		if err != nil {
			return all, fmt.Errorf("kill survivors of worker %s: %w", r.WorkerID, err)
		}
		if len(killed) > 0 {
			logger.Warn("killed worker processes left by a previous hive",
				"worker_id", r.WorkerID, "pid", r.Process.PID, "pids", killed)
			groups = append(groups, r.Process.PGID)
		}
		all = append(all, killed...)
		os.Remove(path)
	}
	// They are not our children, so there is nothing to wait on: watch
	// /proc until the groups are empty.
	deadline := time.Now().Add(timeout)
	for _, g := range groups {
		for {
			m, err := procs.GroupMembers(g)
			if err != nil {
				return all, err
			}
			if len(m) == 0 {
				break
			}
			if time.Now().After(deadline) {
				return all, fmt.Errorf("processes %v of a previous hive survive SIGKILL", m)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	return all, nil
}
