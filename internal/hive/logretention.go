package hive

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// pruneEvery is how often the hive removes old worker logs.
const pruneEvery = time.Hour

// pruneLogs removes the log files in dir last written before cutoff,
// except those of the workers in live: a hive that runs for months keeps
// a month of them (--log-retention), not every log of every worker it
// ever ran. It returns how many it removed.
func pruneLogs(dir string, cutoff time.Time, live map[string]bool) (int, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	removed := 0
	for _, e := range entries {
		id, ok := strings.CutSuffix(e.Name(), ".log")
		if !ok || !e.Type().IsRegular() || live[id] {
			continue
		}
		info, err := e.Info()
		if err != nil || !info.ModTime().Before(cutoff) {
			continue
		}
		if os.Remove(filepath.Join(dir, e.Name())) == nil {
			removed++
		}
	}
	return removed, nil
}

// pruneLogsLoop prunes the worker logs at once and then every pruneEvery
// until ctx ends; off when LogRetention is negative.
func (h *Hive) pruneLogsLoop(ctx context.Context) {
	if h.cfg.LogRetention < 0 {
		return
	}
	t := time.NewTicker(pruneEvery)
	defer t.Stop()
	for {
		live := map[string]bool{}
		for _, w := range h.reg.liveWorkers() {
			live[w.id] = true
		}
		n, err := pruneLogs(h.data.logsDir(), time.Now().Add(-h.cfg.LogRetention), live)
		switch {
		case err != nil:
			h.log.Warn("cannot prune worker logs", "dir", h.data.logsDir(), "err", err)
		case n > 0:
			h.log.Info("pruned worker logs", "removed", n, "retention", h.cfg.LogRetention.String())
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
