package kvcache

import (
	"cmp"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// entry is one save on disk, as Prune sees it.
type entry struct {
	dir      string
	bytes    int64
	lastUsed time.Time // when it was saved or last restored
}

// plan picks the saves to remove so that the rest fit in limit bytes:
// the least recently used first. A limit of 0 or less removes them all.
func plan(entries []entry, limit int64) []string {
	sorted := slices.Clone(entries)
	slices.SortFunc(sorted, func(a, b entry) int {
		return cmp.Or(a.lastUsed.Compare(b.lastUsed), strings.Compare(a.dir, b.dir))
	})
	var total int64
	for _, e := range sorted {
		total += e.bytes
	}
	var out []string
	for _, e := range sorted {
		if total <= limit && limit > 0 {
			break
		}
		out = append(out, e.dir)
		total -= e.bytes
	}
	return out
}

// Prune removes saves under root, least recently used first, until the
// rest hold at most limit bytes (0: remove every save). Directories
// being written (*.tmp) are left alone. It returns the saves it removed.
func Prune(root string, limit int64) ([]string, error) {
	des, err := os.ReadDir(root)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var entries []entry
	for _, de := range des {
		if !de.IsDir() || strings.HasSuffix(de.Name(), ".tmp") {
			continue
		}
		dir := filepath.Join(root, de.Name())
		e := entry{dir: dir}
		if st, err := os.Stat(filepath.Join(dir, manifestName)); err == nil {
			e.lastUsed = st.ModTime()
		} // else: no manifest, a save never finished: removed first
		files, err := os.ReadDir(dir)
		if err != nil {
			return nil, err
		}
		for _, f := range files {
			if info, err := f.Info(); err == nil {
				e.bytes += info.Size()
			}
		}
		entries = append(entries, e)
	}
	var removed []string
	var errs []error
	for _, dir := range plan(entries, limit) {
		if err := os.RemoveAll(dir); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, dir)
	}
	return removed, errors.Join(errs...)
}

// RemoveUnfinished removes the saves under root that were being written
// (*.tmp: a worker killed while saving). Call it only while no worker
// of root saves (a hive at start).
func RemoveUnfinished(root string) ([]string, error) {
	dirs, err := filepath.Glob(filepath.Join(root, "*.tmp"))
	if err != nil {
		return nil, err
	}
	var errs []error
	for _, d := range dirs {
		errs = append(errs, os.RemoveAll(d))
	}
	return dirs, errors.Join(errs...)
}
