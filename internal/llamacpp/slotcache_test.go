package llamacpp_test

import (
	"strings"
	"testing"

	"github.com/apiary-llm/apiary/internal/engine"
	"github.com/google/go-cmp/cmp"
)

// A request whose prompt begins with what a slot's memory holds (a
// chat's next turn, the same system prompt) decodes only the rest, says
// so in CachedTokens, and generates what a cold engine generates.
func TestSlotMemoryIsReusedForASharedPrefix(t *testing.T) {
	e := loadCtx(t, 2, 512)
	system := strings.Repeat("You are a careful keeper of bees. ", 8)
	first := engine.Request{Prompt: prompt(t, e, system+"How do hives swarm?"), MaxTokens: 16, IgnoreEOS: true}
	_, res := collect(t, e, first)
	if res.CachedTokens != 0 {
		t.Errorf("first request: %d cached tokens, want 0 (nothing ran before)", res.CachedTokens)
	}
	second := engine.Request{Prompt: prompt(t, e, system+"What do drones eat?"), MaxTokens: 16, IgnoreEOS: true}
	before := e.PromptTokensDecoded()
	got, res := collect(t, e, second)
	decoded := int(e.PromptTokensDecoded() - before)
	shared := commonLen(first.Prompt, second.Prompt)
	if res.CachedTokens != shared {
		t.Errorf("second request: %d cached tokens, want the %d tokens the prompts share", res.CachedTokens, shared)
	}
	if decoded+res.CachedTokens != len(second.Prompt) {
		t.Errorf("second request decoded %d prompt tokens and found %d cached; want %d together", decoded, res.CachedTokens, len(second.Prompt))
	}

	// The same prompt on a fresh engine: greedy output unchanged.
	cold := loadCtx(t, 2, 512)
	want, _ := collect(t, cold, second)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("greedy output with a reused prefix differs from a cold run (-cold +reused):\n%s", diff)
	}

	// The whole previous exchange (prompt and answer) is kept: a next turn
	// that resends it finds all of it but the last token cached.
	turn, _ := collect(t, e, second)
	next := engine.Request{Prompt: append(append(append([]int{}, second.Prompt...), turn...), prompt(t, e, " more")[1:]...), MaxTokens: 4, IgnoreEOS: true}
	_, res = collect(t, e, next)
	if res.CachedTokens < len(second.Prompt)+len(turn)-1 {
		t.Errorf("next turn: %d cached tokens, want at least the previous prompt and answer, %d", res.CachedTokens, len(second.Prompt)+len(turn)-1)
	}
}

func commonLen(a, b []int) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

// A new conversation takes a free slot whose memory it would not waste
// (an empty one), not the slot of another conversation that shares only
// the first tokens with it: that conversation's next turn still finds
// its prefix.
func TestNewPromptSparesAnotherConversationsSlot(t *testing.T) {
	e := loadCtx(t, 2, 512)
	a := engine.Request{Prompt: prompt(t, e, "Q: "+strings.Repeat("the first conversation about bees. ", 6)), MaxTokens: 4, IgnoreEOS: true}
	b := engine.Request{Prompt: prompt(t, e, "Q: "+strings.Repeat("another one, about goats and hay. ", 6)), MaxTokens: 4, IgnoreEOS: true}
	collect(t, e, a)
	collect(t, e, b)
	_, res := collect(t, e, a)
	if res.CachedTokens != len(a.Prompt)-1 {
		t.Errorf("a again after b: %d cached tokens, want %d (b took the other slot)", res.CachedTokens, len(a.Prompt)-1)
	}
}
