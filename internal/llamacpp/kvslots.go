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
	"time"
	"unsafe"

	"github.com/apiary-llm/apiary/internal/engine"
)

// A slot keeps the KV of its last prompt after its sequence ends
// (e.kept, owned by the decode loop): the next request whose prompt
// starts with those tokens decodes only the rest. ExportSlots and
// ImportSlot move that state to and from llama.cpp's sequence state, so
// that a worker's cache survives a swap (see package kvcache).

// keep is what release does with the memory of s's slot: on a clean end
// the slot keeps the KV of the prompt tokens s decoded (its generated
// tokens are dropped); after an error, or when the memory cannot keep a
// prefix whole from position 0 (recurrent models, a sliding window that
// moved on), it keeps nothing.
func (e *Engine) keep(s *sequence, err error) {
	mem := C.llama_get_memory(e.lctx)
	seq := C.llama_seq_id(s.seq)
	n := s.promptPos
	e.kept[s.seq] = nil
	if err != nil || s.follow != nil || n == 0 || !bool(C.llama_memory_seq_rm(mem, seq, C.llama_pos(n), -1)) ||
		!e.holdsFromZero(seq, n) {
		C.llama_memory_seq_rm(mem, seq, -1, -1)
		return
	}
	e.kept[s.seq] = slices.Clone(s.req.Prompt[:n])
}

// holdsFromZero reports whether the memory of seq holds positions 0..n-1
// and nothing after.
func (e *Engine) holdsFromZero(seq C.llama_seq_id, n int) bool {
	mem := C.llama_get_memory(e.lctx)
	return int(C.llama_memory_seq_pos_min(mem, seq)) == 0 && int(C.llama_memory_seq_pos_max(mem, seq)) == n-1
}

// place gives the choices of one request free slots: the first choice
// the slot whose kept tokens share the longest prefix with its prompt
// (on a tie, the one keeping the fewest tokens), which it then reuses;
// the others any free slot, cleared.
func (e *Engine) place(u []*sequence, active []*sequence) {
	lead := u[0]
	best, bestN := -1, -1
	for i, a := range active {
		if a != nil {
			continue
		}
		n := commonPrefix(e.kept[i], lead.req.Prompt)
		if n > bestN || n == bestN && len(e.kept[i]) < len(e.kept[best]) {
			best, bestN = i, n
		}
	}
	mem := C.llama_get_memory(e.lctx)
	for _, s := range u {
		slot := best
		if s != lead {
			slot = slices.Index(active, nil)
		}
		s.seq = slot
		s.taken = time.Now()
		active[slot] = s
		if s == lead {
			e.reuse(s)
			continue
		}
		C.llama_memory_seq_rm(mem, C.llama_seq_id(slot), -1, -1)
		e.kept[slot] = nil
	}
}

// reuse starts s after the prefix of its prompt that its slot keeps (at
// most all of it but the last token, whose logits s samples from), and
// drops the rest of what the slot kept.
func (e *Engine) reuse(s *sequence) {
	mem := C.llama_get_memory(e.lctx)
	seq := C.llama_seq_id(s.seq)
	n := min(commonPrefix(e.kept[s.seq], s.req.Prompt), len(s.req.Prompt)-1)
	e.kept[s.seq] = nil
	if n <= 0 || !bool(C.llama_memory_seq_rm(mem, seq, C.llama_pos(n), -1)) || !e.holdsFromZero(seq, n) {
		C.llama_memory_seq_rm(mem, seq, -1, -1)
		return
	}
	s.promptPos, s.nPast = n, n
	e.promptReused.Add(int64(n))
	e.log.Info("prompt prefix reused", "slot", s.seq, "reused_tokens", n, "prompt_tokens", len(s.req.Prompt))
}

// commonPrefix is the length of the longest common prefix of a and b.
func commonPrefix(a, b []int) int {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

// PromptTokensReused counts the prompt tokens the engine took from a
// slot's kept KV instead of decoding them.
func (e *Engine) PromptTokensReused() int64 { return e.promptReused.Load() }

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
		for slot, toks := range e.kept {
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
		e.kept[slot] = nil
		got := C.llama_state_seq_set_data(e.lctx, (*C.uint8_t)(unsafe.Pointer(&state[0])), C.size_t(len(state)), seq)
		if got == 0 {
			C.llama_memory_seq_rm(mem, seq, -1, -1)
			return errors.New("llama.cpp refused the saved state (see its log for why)")
		}
		if !e.holdsFromZero(seq, len(tokens)) {
			C.llama_memory_seq_rm(mem, seq, -1, -1)
			return fmt.Errorf("the saved state of slot %d does not hold its %d tokens", slot, len(tokens))
		}
		e.kept[slot] = slices.Clone(tokens)
		return nil
	})
}
