package llamacpp

/*
#include <stdlib.h>
#include "llama.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"unsafe"

	"github.com/apiary-llm/apiary/internal/engine"
)

// A slot keeps the KV of what it last decoded after its sequence ends
// (e.cache, slotcache.go, owned by the decode loop): the next request
// whose prompt starts with those tokens decodes only the rest.
// ExportSlots and ImportSlot move that state to and from llama.cpp's
// sequence state, so that a worker's cache survives a swap (see package
// kvcache).

// holdsFromZero reports whether the memory of seq holds positions 0..n-1
// and nothing after.
func (e *Engine) holdsFromZero(seq C.llama_seq_id, n int) bool {
	mem := C.llama_get_memory(e.lctx)
	return int(C.llama_memory_seq_pos_min(mem, seq)) == 0 && int(C.llama_memory_seq_pos_max(mem, seq)) == n-1
}

// PromptTokensReused counts the prompt tokens the engine took from a
// slot's kept KV instead of decoding them.
func (e *Engine) PromptTokensReused() int64 { return e.promptReused.Load() }

// KVCacheUsage is the share of the KV cache (every slot's context) the
// running sequences hold, 0…1, as of the decode loop's last step: what
// an inference gateway's endpoint picker reads as KV-cache utilisation.
// A slot's kept memory of an ended sequence counts as free: a request
// may take it.
func (e *Engine) KVCacheUsage() float64 {
	ctxPerSlot, slots, _ := e.KVLayout()
	if ctxPerSlot*slots <= 0 {
		return 0
	}
	return min(1, float64(e.kvInUse.Load())/float64(ctxPerSlot*slots))
}

// KVLayout is what shapes the engine's KV cache: tokens a slot, slots,
// and the K and V cache types ("f16/f16").

func (e *Engine) KVLayout() (ctxPerSlot, slots int, kvType string) {
	return e.nCtxSeq, e.slots, e.kvType
}

// inLoop runs f on the decode loop when it has no sequence, and returns
// f's error.
func (e *Engine) inLoop(ctx context.Context, f func() error) error {
	done := make(chan error, 1)
	select {
	case e.ctl <- func() { done <- f() }:
	case <-ctx.Done():
		return ctx.Err()
	case <-e.quit:
		return engine.ErrClosed
	}
	return <-done
}

// ExportSlots calls put, on the decode loop, for every slot that keeps
// tokens: the tokens and llama.cpp's sequence state of their KV. state
// is valid only during the call.
func (e *Engine) ExportSlots(ctx context.Context, put func(slot int, tokens []int, state []byte) error) error {
	return e.inLoop(ctx, func() error {
		for slot, toks := range e.cache.held {
			if len(toks) == 0 {
				continue
			}
			seq := C.llama_seq_id(slot)
			size := C.llama_state_seq_get_size(e.lctx, seq)
			if size == 0 {
				return fmt.Errorf("llama.cpp has no state for slot %d", slot)
			}
			buf := C.malloc(size)
			if buf == nil {
				return fmt.Errorf("out of memory for slot %d's state (%d bytes)", slot, uint64(size))
			}
			got := C.llama_state_seq_get_data(e.lctx, (*C.uint8_t)(buf), size, seq)
			var err error
			if got == 0 {
				err = fmt.Errorf("llama.cpp could not copy slot %d's state (see its log)", slot)
			} else {
				err = put(slot, toks, unsafe.Slice((*byte)(buf), int(got)))
			}
			C.free(buf)
			if err != nil {
				return err
			}
		}
		return nil
	})
}

// ImportSlot loads into slot a state ExportSlots gave for tokens, on the
// decode loop, while no sequence runs. A state llama.cpp refuses, or one
// that does not hold exactly tokens' positions, leaves the slot empty and
// is an error.
func (e *Engine) ImportSlot(ctx context.Context, slot int, tokens []int, state []byte) error {
	if slot < 0 || slot >= e.slots {
		return fmt.Errorf("slot %d: the engine has %d slots", slot, e.slots)
	}
	if len(tokens) == 0 || len(tokens) >= e.nCtxSeq || len(state) == 0 {
		return fmt.Errorf("slot %d: %d tokens and %d bytes of state is not a state this engine keeps", slot, len(tokens), len(state))
	}
	return e.inLoop(ctx, func() error {
		mem := C.llama_get_memory(e.lctx)
		seq := C.llama_seq_id(slot)
		C.llama_memory_seq_rm(mem, seq, -1, -1)
		e.cache.held[slot] = e.cache.held[slot][:0]
		got := C.llama_state_seq_set_data(e.lctx, (*C.uint8_t)(unsafe.Pointer(&state[0])), C.size_t(len(state)), seq)
		if got == 0 {
			C.llama_memory_seq_rm(mem, seq, -1, -1)
			return errors.New("llama.cpp refused the saved state (see its log for why)")
		}
		if !e.holdsFromZero(seq, len(tokens)) {
			C.llama_memory_seq_rm(mem, seq, -1, -1)
			return fmt.Errorf("the saved state of slot %d does not hold its %d tokens", slot, len(tokens))
		}
		e.cache.held[slot] = slices.Clone(tokens)
		return nil
	})
}
