package routing

import (
	"hash/maphash"
	"strings"
	"testing"

	"github.com/apiary-llm/apiary/internal/api"
)

func chatBody(system string, turns ...string) []byte {
	var b strings.Builder
	b.WriteString(`{"model":"m","messages":[{"role":"system","content":"` + system + `"}`)
	for i, t := range turns {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		b.WriteString(`,{"role":"` + role + `","content":"` + t + `"}`)
	}
	b.WriteString(`],"max_tokens":8}`)
	return []byte(b.String())
}

// A conversation's next turn shares the blocks of the turn before;
// another system prompt shares none; fields outside the prompt do not
// count.
func TestRequestPrefixChainsBlocks(t *testing.T) {
	seed := maphash.MakeSeed()
	sysA, sysB := strings.Repeat("You keep bees. ", 80), strings.Repeat("You tend goats. ", 80)
	turn1 := requestPrefix(seed, chatBody(sysA, "hello"))
	turn2 := requestPrefix(seed, chatBody(sysA, "hello", "hi there", "and now?"))
	other := requestPrefix(seed, chatBody(sysB, "hello"))
	if len(turn1.hashes) < 4 {
		t.Fatalf("a %d-byte text gave %d blocks", turn1.bytes, len(turn1.hashes))
	}
	if n := matchedBlocks(turn1.hashes, turn2.hashes); n != len(turn1.hashes) {
		t.Errorf("turn 2 shares %d of turn 1's %d blocks, want all", n, len(turn1.hashes))
	}
	if n := matchedBlocks(turn1.hashes, other.hashes); n != 0 {
		t.Errorf("another system prompt shares %d blocks, want 0", n)
	}
	streamed := requestPrefix(seed, []byte(strings.Replace(string(chatBody(sysA, "hello")), `"max_tokens":8`, `"max_tokens":99,"stream":true`, 1)))
	if n := matchedBlocks(turn1.hashes, streamed.hashes); n != len(turn1.hashes) {
		t.Errorf("other sampling fields changed the blocks: %d of %d shared", n, len(turn1.hashes))
	}
	if k := requestPrefix(seed, []byte("not json")); len(k.hashes) != 0 {
		t.Errorf("a body that is no JSON gave %d blocks", len(k.hashes))
	}
}

func inflightOf(ns ...int) []*int {
	out := make([]*int, len(ns))
	for i := range ns {
		out[i] = &ns[i]
	}
	return out
}

// The prefix policy, pure: the worker holding the prefix wins unless its
// load makes a cold one faster, with the rates the answers measured.
func TestPickPrefix(t *testing.T) {
	cands := []Candidate{{Key: WorkerKey{"p", "a"}}, {Key: WorkerKey{"p", "b"}}, {Key: WorkerKey{"p", "c"}}}
	for _, tc := range []struct {
		name     string
		inflight []int
		est      []prefixEstimate
		want     int
		hit      bool
	}{
		{"nothing cached: least loaded", []int{1, 0, 1}, []prefixEstimate{{}, {}, {}}, 1, false},
		{"the warm worker, though busier", []int{1, 0, 0}, []prefixEstimate{{cachedBytes: 3840}, {}, {}}, 0, true},
		{"the warm worker's slots are full", []int{2, 0, 0}, []prefixEstimate{{cachedBytes: 3840}, {}, {}}, 1, false},
		{"a slow warm worker loses to a fast cold one",
			[]int{1, 0, 0}, []prefixEstimate{{cachedBytes: 1024, msPerByte: 1}, {msPerByte: 0.01}, {msPerByte: 0.02}}, 1, false},
		{"unmeasured workers count at the median rate",
			[]int{0, 0, 0}, []prefixEstimate{{cachedBytes: 512}, {msPerByte: 0.5}, {cachedBytes: 256, msPerByte: 0.5}}, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			i, why := pickPrefix(cands, inflightOf(tc.inflight...), 2, nil, 4000, tc.est)
			if i != tc.want || why.hit != tc.hit {
				t.Errorf("picked %d (hit %v: %s), want %d (hit %v)", i, why.hit, why.String(4000), tc.want, tc.hit)
			}
		})
	}
	if i, _ := pickPrefix(cands, inflightOf(2, 2, 2), 2, nil, 4000, make([]prefixEstimate, 3)); i != -1 {
		t.Errorf("every slot taken: picked %d, want -1", i)
	}
}

// The index learns which slot holds what from the workers' reports: a
// slot that serves another conversation no longer holds the first.
func TestPrefixIndexFollowsSlots(t *testing.T) {
	seed := maphash.MakeSeed()
	a := requestPrefix(seed, chatBody(strings.Repeat("You keep bees. ", 80), "hi"))
	b := requestPrefix(seed, chatBody(strings.Repeat("You tend goats. ", 80), "hi"))
	x := newPrefixIndex()
	w := WorkerKey{"p", "w"}
	cands := []Candidate{{Key: w}}
	est := make([]prefixEstimate, 1)
	x.record(w, a, api.PrefixReport{Slot: 0, Slots: 2, Prompt: 300, Cached: 0, PromptMS: 30}, true, 0, 1)
	x.record(w, b, api.PrefixReport{Slot: 1, Slots: 2, Prompt: 300, Cached: 0, PromptMS: 30}, true, 0, 1)
	x.estimates(cands, a, est)
	if est[0].cachedBytes != len(a.hashes)*prefixBlock || est[0].msPerByte <= 0 {
		t.Errorf("after a in slot 0 and b in slot 1: %+v, want a's %d bytes and a rate", est[0], len(a.hashes)*prefixBlock)
	}
	x.record(w, b, api.PrefixReport{Slot: 0, Slots: 2, Prompt: 300, Cached: 0, PromptMS: 30}, true, 0, 1)
	x.estimates(cands, a, est)
	if est[0].cachedBytes != 0 {
		t.Errorf("slot 0 now serves b: a still counted %d bytes cached", est[0].cachedBytes)
	}
}

func TestPrefixReportRoundTrip(t *testing.T) {
	r := api.PrefixReport{Slot: 1, Slots: 2, Prompt: 1034, Cached: 1010, PromptMS: 12.5}
	got, ok := api.ParsePrefixReport(r.String())
	if !ok || got != r {
		t.Errorf("parsed %q as %+v (%v), want %+v", r.String(), got, ok, r)
	}
	for _, bad := range []string{"", "slot=2 slots=2 prompt=1 cached=0 prompt_ms=1", "slot=0 slots=1 prompt=1 cached=2 prompt_ms=1", "garbage"} {
		if _, ok := api.ParsePrefixReport(bad); ok {
			t.Errorf("%q parsed as a report", bad)
		}
	}
}
