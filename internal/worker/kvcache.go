package worker

import (
	"context"
	"errors"
	"time"

	"github.com/apiary-llm/apiary/internal/engine"
	"github.com/apiary-llm/apiary/internal/kvcache"
	"github.com/apiary-llm/apiary/internal/version"
)

// kvEngine is an engine whose slots' KV cache can be saved and restored
// (llamacpp.Engine).
type kvEngine interface {
	KVLayout() (ctxPerSlot, slots int, kvType string)
	ExportSlots(ctx context.Context, put func(slot int, tokens []int, state []byte) error) error
	ImportSlot(ctx context.Context, slot int, tokens []int, state []byte) error
}

// kvSaveWait bounds the wait for the decode loop to take the save (it
// takes it as soon as no generation runs, which after a drain is at once).
// Writing the state is not cut short: it is bounded by its size, the
// slots' KV, at most KVCacheDisk.
const kvSaveWait = 10 * time.Second

// kvKey is what a save of this worker's KV cache must match.
func (w *Worker) kvKey(eng kvEngine) (kvcache.Key, error) {
	id, err := kvcache.Identify(w.cfg.ModelPath)
	if err != nil {
		return kvcache.Key{}, err
	}
	ctx, slots, kvType := eng.KVLayout()
	return kvcache.Key{Model: id, CtxPerSlot: ctx, Slots: slots, KVType: kvType, LlamaCpp: version.LlamaCpp}, nil
}

// kvTarget is the engine and key of the worker's KV saves; ok is false
// without KVCacheDir, with an engine that keeps no KV, or when the key
// cannot be made (logged with why, after not).
func (w *Worker) kvTarget(eng engine.Engine, not string) (kvEngine, kvcache.Key, bool) {
	ke, ok := eng.(kvEngine)
	if w.cfg.KVCacheDir == "" || !ok {
		return nil, kvcache.Key{}, false
	}
	key, err := w.kvKey(ke)
	if err != nil {
		w.log.Warn(not, "err", err)
		return nil, kvcache.Key{}, false
	}
	return ke, key, true
}

// restoreKV loads the slots saved by the last worker of this model under
// KVCacheDir, before the worker reports ready. A save made for another
// model file or other context settings, or damaged, is refused (logged,
// removed) and the worker starts with empty slots.
func (w *Worker) restoreKV(ctx context.Context, eng engine.Engine) {
	ke, key, ok := w.kvTarget(eng, "saved KV cache not looked for")
	if !ok {
		return
	}
	start := time.Now()
	m, err := kvcache.Restore(w.cfg.KVCacheDir, key, func(slot int, tokens []int, state []byte) error {
		return ke.ImportSlot(ctx, slot, tokens, state)
	})
	switch {
	case errors.Is(err, kvcache.ErrNoSave):
		w.log.Info("no saved KV cache to restore", "dir", w.cfg.KVCacheDir)
	case err != nil:
		w.log.Warn("saved KV cache not used", "err", err)
	default:
		w.log.Info("KV cache restored", "slots", len(m.Slots), "tokens", m.Tokens(), "bytes", m.Bytes(),
			"saved_at", m.SavedAt, "restore_ms", time.Since(start).Milliseconds())
	}
}

// saveKV saves the slots' KV cache under KVCacheDir when the worker has
// drained, before the engine is closed, and then removes the least
// recently used saves past KVCacheDisk. Every graceful stop saves (an
// eviction, an idle stop, an operator's stop): the next worker of the
// model restores what is still on disk.
func (w *Worker) saveKV(eng engine.Engine) {
	ke, key, ok := w.kvTarget(eng, "KV cache not saved")
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), kvSaveWait)
	defer cancel()
	start := time.Now()
	m, err := kvcache.Save(w.cfg.KVCacheDir, key, func(put kvcache.Put) error {
		return ke.ExportSlots(ctx, put)
	})
	switch {
	case errors.Is(err, kvcache.ErrNothingToSave):
		w.log.Info("KV cache not saved: no slot holds a prompt")
		return
	case err != nil:
		w.log.Warn("KV cache not saved", "err", err)
		return
	}
	w.log.Info("KV cache saved", "slots", len(m.Slots), "tokens", m.Tokens(), "bytes", m.Bytes(),
		"save_ms", time.Since(start).Milliseconds())
	removed, err := kvcache.Prune(w.cfg.KVCacheDir, w.cfg.KVCacheDisk)
	if len(removed) > 0 || err != nil {
		w.log.Info("KV cache saves removed to stay within the disk budget", "removed", removed,
			"budget_bytes", w.cfg.KVCacheDisk, "err", err)
	}
}
