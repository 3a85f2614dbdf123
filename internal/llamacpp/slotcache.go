package llamacpp

/*
#include "llama.h"
*/
import "C"

// slotCache is what each slot's KV memory holds after its sequence
// ended: the token ids at positions 0, 1, …, so that the next request
// whose prompt begins with them decodes only the rest (a chat's next
// turn resends the whole conversation). It belongs to the decode loop.
// Bounded: one list a slot, each at most the slot's context.
type slotCache struct {
	held [][]int  // held[i]: the tokens in slot i's memory, in order
	used []uint64 // used[i]: when slot i was last taken (a counter), for least recently used
	tick uint64
}

func newSlotCache(slots int) *slotCache {
	return &slotCache{held: make([][]int, slots), used: make([]uint64, slots)}
}

// pick returns the free slot (active[i] == nil) to run prompt in: of
// the slots that would keep at least half of what they hold (an empty
// one keeps all of its nothing), the one sharing the longest prefix with
// prompt, the least recently used among equals; when every free slot
// would lose more than half, the least recently used. So a new
// conversation takes an empty slot, or one whose conversation has been
// idle longest, rather than the slot whose memory shares only the chat
// template's first tokens with it. -1 when none is free.
func (c *slotCache) pick(active []*sequence, prompt []int) int {
	best, bestLen := -1, -1
	for i, a := range active {
		if a != nil {
			continue
		}
		n := commonPrefix(c.held[i], prompt)
		if 2*n < len(c.held[i]) {
			continue
		}
		if n > bestLen || (n == bestLen && c.used[i] < c.used[best]) {
			best, bestLen = i, n
		}
	}
	if best < 0 {
		return c.pickLRU(active)
	}
	return best
}

// pickLRU returns the least recently used free slot, -1 when none is
// free: a slot whose memory is least likely to be asked for again.
func (c *slotCache) pickLRU(active []*sequence) int {
	best := -1
	for i, a := range active {
		if a == nil && (best < 0 || c.used[i] < c.used[best]) {
			best = i
		}
	}
	return best
}

// reuse readies slot s.seq for s: the part of its memory that s's
// prompt begins with is kept (s starts decoding after it; at least the
// prompt's last token is decoded, for its logits) and the rest removed.
// With follow set (a choice that copies another's prompt) the memory is
// emptied. It reports how many prompt tokens were kept.
func (c *slotCache) reuse(e *Engine, mem C.llama_memory_t, s *sequence) int {
	c.tick++
	c.used[s.seq] = c.tick
	seq := C.llama_seq_id(s.seq)
	n := 0
	if s.follow == nil {
		n = outsideImages(s.req.Images, min(commonPrefix(c.held[s.seq], s.req.Prompt), len(s.req.Prompt)-1))
	}
	if n > 0 && !bool(C.llama_memory_seq_rm(mem, seq, C.llama_pos(n), -1)) {
		n = 0 // recurrent memory cannot drop a tail: start over
	}
	if n > 0 && !windowKept(int(C.llama_memory_seq_pos_min(mem, seq)), n, int(C.llama_model_n_swa(e.model))) {
		n = 0 // a sliding window no longer holds what the next token attends to
	}
	if n == 0 {
		C.llama_memory_seq_rm(mem, seq, -1, -1)
	}
	c.held[s.seq] = c.held[s.seq][:n]
	s.promptPos, s.nPast = n, n
	return n
}

// keep records what slot s.seq holds once s ended: with ok, the tokens
// its memory has (the prompt, then the generated tokens decoded);
// without (an error left the memory in doubt), nothing, and the memory
// is emptied.
func (c *slotCache) keep(mem C.llama_memory_t, s *sequence, ok bool) {
	if !ok || s.nPast == 0 {
		C.llama_memory_seq_rm(mem, C.llama_seq_id(s.seq), -1, -1)
		c.held[s.seq] = c.held[s.seq][:0]
		return
	}
	h := c.held[s.seq][:0]
	p := s.req.Prompt
	if s.nPast <= len(p) {
		h = append(h, p[:s.nPast]...)
	} else {
		h = append(h, p...)
		h = append(h, s.outs[:min(len(s.outs), s.nPast-len(p))]...)
	}
	c.held[s.seq] = h
}

// windowKept reports whether memory whose lowest position is posMin
// still holds what a token at position n attends to: everything, or
// with a sliding window of nSWA tokens (0: none), the window before n.
func windowKept(posMin, n, nSWA int) bool {
	return posMin <= 0 || (nSWA > 0 && posMin <= n-nSWA)
}

func commonPrefix(a, b []int) int {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}
