package hive

import (
	"path/filepath"
	"strconv"

	"github.com/apiary-llm/apiary/internal/kvcache"
)

// kvCacheDir holds the KV cache saves of this hive's workers (package
// kvcache): DATA_DIR/hive/kvcache/<model>-<identity>/.
func (d *dataDir) kvCacheDir() string { return filepath.Join(d.root, "hive", "kvcache") }

// kvCacheArgs are the worker flags that make it save its KV cache on a
// graceful stop and restore it at start; none when KVCacheDisk is 0.
func (h *Hive) kvCacheArgs() []string {
	if h.cfg.KVCacheDisk == 0 {
		return nil
	}
	return []string{"--kv-cache-dir", h.data.kvCacheDir(), "--kv-cache-disk", strconv.FormatUint(h.cfg.KVCacheDisk, 10)}
}

// pruneKVCache removes saves left unfinished (a worker killed while it
// saved: no worker runs yet) and brings the rest within KVCacheDisk at start (all of them
// removed when it is 0): a budget lowered since the last run, or saves
// turned off, takes effect at once. Workers prune after each save.
func (h *Hive) pruneKVCache() {
	if tmp, err := kvcache.RemoveUnfinished(h.data.kvCacheDir()); len(tmp) > 0 || err != nil {
		h.log.Info("unfinished KV cache saves removed", "removed", len(tmp), "err", err)
	}
	removed, err := kvcache.Prune(h.data.kvCacheDir(), int64(min(h.cfg.KVCacheDisk, 1<<62)))
	if len(removed) > 0 || err != nil {
		h.log.Info("KV cache saves removed to stay within --kv-cache-disk", "removed", len(removed),
			"budget_bytes", h.cfg.KVCacheDisk, "err", err)
	}
}
