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

// pruneLogs removes the log files in dir of the workers whose log was
// last written before cutoff, except those of the workers in live: a hive
// that runs for months keeps a month of them (--log-retention), not every
// log of every worker it ever ran. A worker's files (<id>.log and the
// rotated <id>.log.N) go together, judged by the newest of them. It
// returns how many files it removed.
func pruneLogs(dir string, cutoff time.Time, live map[string]bool) (int, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	type files struct {
		names  []string // rotated ones first
		newest time.Time
	}
	byID := map[string]*files{}
	for _, e := range entries {
		id, rotated, ok := logFileID(e.Name())
		if !ok || !e.Type().IsRegular() || live[id] {
			continue
		}
		info, err := e.Info()
		if err != nil {
			continue
		}
		g := byID[id]
		if g == nil {
			g = &files{}
			byID[id] = g
		}
		if rotated {
			g.names = append([]string{e.Name()}, g.names...)
		} else {
			g.names = append(g.names, e.Name())
		}
		if info.ModTime().After(g.newest) {
			g.newest = info.ModTime()
		}
	}
	removed := 0
	for _, g := range byID {
		if !g.newest.Before(cutoff) {
			continue
		}
		for _, name := range g.names {
			if os.Remove(filepath.Join(dir, name)) == nil {
				removed++
			}
		}
	}
	return removed, nil
}

// logFileID is the worker id of a log file's name, <id>.log or a rotated
// <id>.log.N, and whether it is a rotated one.
func logFileID(name string) (id string, rotated, ok bool) {
	if id, ok := strings.CutSuffix(name, ".log"); ok {
		return id, false, id != ""
	}
	i := strings.LastIndex(name, ".log.")
	if i <= 0 {
		return "", false, false
	}
	n := name[i+len(".log."):]
	if n == "" || strings.Trim(n, "0123456789") != "" {
		return "", false, false
	}
	return name[:i], true, true
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
