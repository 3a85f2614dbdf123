package routing

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/maphash"
	"slices"
	"sync"

	"github.com/apiary-llm/apiary/internal/api"
)

// Routing policies (Config.Routing).
const (
	// RoutePrefix sends a request to the worker whose cache holds most
	// of its prompt, unless that worker's load makes a colder one faster.
	RoutePrefix = "prefix"
	// RouteLeastLoaded sends it to the worker with the fewest requests.
	RouteLeastLoaded = "least-loaded"
)

// The queen does not tokenize: it hashes the request's text in blocks
// of prefixBlock bytes (about 64 tokens of English), each hash chained
// to the one before, so that hash i stands for the whole text up to the
// end of block i. A worker's answer says which of its slots now holds
// the request (api.PrefixReport); the queen keeps, per worker and slot,
// the hashes of the request that slot last served. A request's cached
// prefix on a worker is then its longest run of hashes that a slot of
// the worker has: the worker's engine finds at least that much in the
// slot's memory, since the slot holds the tokens of that text.
const (
	prefixBlock = 256
	// maxPrefixBlocks bounds the hashes of one request (256 KiB of
	// text); a longer prompt's tail is not hashed.
	maxPrefixBlocks = 1024
	// maxIndexSlots bounds the slots kept per worker.
	maxIndexSlots = 64
	// maxIndexedWorkers bounds the workers the index keeps; past it a
	// new worker is not indexed (forget drops workers that went).
	maxIndexedWorkers = 4096
	// rateWeight is the weight of a new measurement in a worker's rate.
	rateWeight = 0.3
)

// prefixKey is a request's text as the router sees it: the chained hash
// of each whole block, and the text's length in bytes.
type prefixKey struct {
	hashes []uint64
	bytes  int
}

// promptText is the part of an OpenAI or Anthropic request body that
// becomes the prompt, in the order a chat template renders it: the
// tools, the system prompt, each message's role and content, or a
// completion's prompt. Fields are taken as their JSON text: equal text,
// equal bytes.
type promptText struct {
	Tools    json.RawMessage `json:"tools"`
	System   json.RawMessage `json:"system"`
	Messages []struct {
		Role    json.RawMessage `json:"role"`
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
	Prompt json.RawMessage `json:"prompt"`
}

// requestPrefix hashes the prompt text of body; a body it cannot read
// has no blocks (it is routed by load).
func requestPrefix(seed maphash.Seed, body []byte) prefixKey {
	var p promptText
	if json.Unmarshal(body, &p) != nil {
		return prefixKey{}
	}
	text := make([]byte, 0, len(body))
	text = append(append(text, p.Tools...), 0)
	text = append(append(text, p.System...), 0)
	for _, m := range p.Messages {
		text = append(append(text, m.Role...), 0)
		text = append(append(text, m.Content...), 0)
	}
	text = append(text, p.Prompt...)
	return hashBlocks(seed, text)
}

// hashBlocks is the chained hash of each whole prefixBlock of text.
func hashBlocks(seed maphash.Seed, text []byte) prefixKey {
	k := prefixKey{bytes: len(text)}
	n := min(len(text)/prefixBlock, maxPrefixBlocks)
	k.hashes = make([]uint64, n)
	var h maphash.Hash
	h.SetSeed(seed)
	var prev [8]byte
	for i := range n {
		h.Reset()
		h.Write(prev[:])
		h.Write(text[i*prefixBlock : (i+1)*prefixBlock])
		k.hashes[i] = h.Sum64()
		binary.LittleEndian.PutUint64(prev[:], k.hashes[i])
	}
	return k
}

// prefixIndex is what the queen knows of its workers' caches: per
// worker, the hashes each slot holds and the worker's measured prompt
// rate. One mutex guards it; it is never held across I/O, and the
// router takes it inside its own (never the other way round).
type prefixIndex struct {
	mu      sync.Mutex
	workers map[WorkerKey]*workerCache // guarded by mu; at most maxIndexedWorkers
}

// workerCache is one worker's entry.
type workerCache struct {
	slots [][]uint64 // the hashes each slot holds, as its answers said
	next  int        // the slot a report without one fills next
	// msPerByte is how long the worker took per byte of prompt text it
	// had to decode, scaled to one request at a time: an average of its
	// answers' prompt_ms / (uncached bytes × (1 + requests beside it)).
	// 0: not measured yet.
	msPerByte float64
}

func newPrefixIndex() *prefixIndex {
	return &prefixIndex{workers: map[WorkerKey]*workerCache{}}
}

// prefixEstimate is what the router knows of one candidate for one
// request: how many bytes of its text a slot holds, and the worker's
// rate (0: unknown).
type prefixEstimate struct {
	cachedBytes int
	msPerByte   float64
}

// estimates fills est[i] for cands[i] and key.
func (x *prefixIndex) estimates(cands []Candidate, key prefixKey, est []prefixEstimate) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for i, c := range cands {
		est[i] = prefixEstimate{}
		wc := x.workers[c.Key]
		if wc == nil {
			continue
		}
		est[i].msPerByte = wc.msPerByte
		best := 0
		for _, s := range wc.slots {
			if n := matchedBlocks(s, key.hashes); n > best {
				best = n
			}
		}
		est[i].cachedBytes = best * prefixBlock
	}
}

// matchedBlocks is how many leading hashes a and b share: chained, the
// last equal one vouches for all before it.
func matchedBlocks(a, b []uint64) int {
	n := min(len(a), len(b))
	for n > 0 && a[n-1] != b[n-1] {
		n--
	}
	return n
}

// record learns from a worker's answer to a request with key: the slot
// it names now holds the request's text, and the answer's prompt time
// updates the worker's rate (inflight: the worker's other requests when
// this one was sent). Without a report (a worker that sends none) the
// slots are filled in turn, as many as the router sends it at once.
func (x *prefixIndex) record(k WorkerKey, key prefixKey, rep api.PrefixReport, reported bool, inflight, slots int) {
	x.mu.Lock()
	defer x.mu.Unlock()
	wc := x.workers[k]
	if wc == nil {
		if len(x.workers) >= maxIndexedWorkers {
			for old := range x.workers { // one at random: still bounded
				delete(x.workers, old)
				break
			}
		}
		wc = &workerCache{}
		x.workers[k] = wc
	}
	n := slots
	if reported {
		n = rep.Slots
	}
	n = min(max(n, 1), maxIndexSlots)
	if len(wc.slots) != n {
		wc.slots = slices.Grow(wc.slots[:0], n)[:n]
		wc.next = 0
	}
	slot := wc.next % n
	if reported {
		slot = rep.Slot % n
	} else {
		wc.next++
	}
	wc.slots[slot] = append(wc.slots[slot][:0], key.hashes...)
	if reported && rep.Prompt > 0 {
		uncached := float64(key.bytes) * float64(rep.Prompt-rep.Cached) / float64(rep.Prompt)
		rate := rep.PromptMS / ((uncached + prefixBlock) * float64(1+inflight))
		if wc.msPerByte == 0 {
			wc.msPerByte = rate
		} else {
			wc.msPerByte += rateWeight * (rate - wc.msPerByte)
		}
	}
}

// forget drops a worker that is no longer a candidate.
func (x *prefixIndex) forget(k WorkerKey) {
	x.mu.Lock()
	delete(x.workers, k)
	x.mu.Unlock()
}

// routeWhy is a prefix decision and its reason, for X-Apiary-Route and
// the debug log.
type routeWhy struct {
	hit         bool // the chosen worker holds a prefix of the request
	cachedBytes int  // of the chosen worker
	bestBytes   int  // the most any candidate with a free slot holds
	costMS      float64
	coldMS      float64 // the cheapest worker holding less (-1: none)
	measured    bool    // some candidate's rate is measured: costs are in ms
	pinned      bool    // the session's worker (X-Session-Id), not chosen by prefix
}

// String is the header's value, e.g. "prefix hit: 3840 of 4211 bytes
// cached, est. 2.1 ms (a colder worker 48.0 ms)".
func (w routeWhy) String(total int) string {
	if w.pinned {
		return "session: the worker X-Session-Id is pinned to"
	}
	if !w.measured {
		switch {
		case w.hit:
			return fmt.Sprintf("prefix hit: %d of %d bytes cached (no rates measured yet)", w.cachedBytes, total)
		case w.bestBytes > 0:
			return fmt.Sprintf("prefix miss: the worker holding %d of %d bytes is busier", w.bestBytes, total)
		}
	}
	switch {
	case w.hit && w.coldMS >= 0:
		return fmt.Sprintf("prefix hit: %d of %d bytes cached, est. %.1f ms (a colder worker %.1f ms)", w.cachedBytes, total, w.costMS, w.coldMS)
	case w.hit:
		return fmt.Sprintf("prefix hit: %d of %d bytes cached, est. %.1f ms", w.cachedBytes, total, w.costMS)
	case w.bestBytes > 0:
		return fmt.Sprintf("prefix miss: the worker holding %d of %d bytes is busier; est. %.1f ms here", w.bestBytes, total, w.costMS)
	default:
		return fmt.Sprintf("prefix miss: no worker holds the first %d bytes; least loaded", prefixBlock)
	}
}

// pickPrefix is the prefix policy, pure: among the candidates with a
// free slot (inflight[i] < slots, not excluded), the one whose first
// token is expected soonest: the prompt bytes it must decode (those no
// slot holds, plus a block for the first token) × its rate × (1 + its
// requests in flight, which share its compute). A worker not measured
// yet counts at the median of those that are (all alike when none is):
// the rates come from the answers, never from a guess. Ties go to the
// fewer requests in flight, then as pick. -1: none has a free slot.
func pickPrefix(cands []Candidate, inflight []*int, slots int, exclude map[WorkerKey]bool, total int, est []prefixEstimate) (int, routeWhy) {
	var known []float64
	for _, e := range est {
		if e.msPerByte > 0 {
			known = append(known, e.msPerByte)
		}
	}
	fallback := 1.0
	if len(known) > 0 {
		slices.Sort(known)
		fallback = known[len(known)/2]
	}
	cost := func(i int) float64 {
		r := est[i].msPerByte
		if r <= 0 {
			r = fallback
		}
		return float64(max(total-est[i].cachedBytes, 0)+prefixBlock) * r * float64(1+*inflight[i])
	}
	best := -1
	var bestCost float64
	why := routeWhy{coldMS: -1, measured: len(known) > 0}
	for i := range cands {
		n := *inflight[i]
		if n >= slots || len(exclude) > 0 && exclude[cands[i].Key] {
			continue
		}
		why.bestBytes = max(why.bestBytes, est[i].cachedBytes)
		c := cost(i)
		if best < 0 || c < bestCost || c == bestCost && (n < *inflight[best] || n == *inflight[best] && cands[i].Reported < cands[best].Reported) {
			best, bestCost = i, c
		}
	}
	if best < 0 {
		return -1, why
	}
	why.cachedBytes, why.costMS = est[best].cachedBytes, bestCost
	why.hit = why.cachedBytes > 0
	if why.hit {
		for i := range cands {
			if *inflight[i] < slots && est[i].cachedBytes < why.cachedBytes && !exclude[cands[i].Key] {
				if c := cost(i); why.coldMS < 0 || c < why.coldMS {
					why.coldMS = c
				}
			}
		}
	}
	return best, why
}
