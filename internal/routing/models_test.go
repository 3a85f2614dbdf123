package routing

import (
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/apiary-llm/apiary/internal/modelconfig"
)

// TestRewriteBody: a configured name or alias becomes the model's file,
// and the model's sampling defaults fill what the request leaves out.
func TestRewriteBody(t *testing.T) {
	f, err := modelconfig.Parse([]byte(`
models:
  qwen:
    file: qwen-file
    aliases: [gpt-4o-mini]
    defaults: {temperature: 0.2, max_tokens: 64, stop: [END]}
  tiny: {}
`))
	if err != nil {
		t.Fatal(err)
	}
	s := &Service{}
	s.models.Store(f)
	for _, c := range []struct {
		name, body string
		want       map[string]any
	}{
		{"alias with defaults", `{"model":"gpt-4o-mini","prompt":"hi","temperature":1}`,
			map[string]any{"model": "qwen-file", "prompt": "hi", "temperature": 1.0, "max_tokens": 64.0, "stop": []any{"END"}}},
		{"name, null is unset", `{"model":"qwen","prompt":"hi","max_tokens":null}`,
			map[string]any{"model": "qwen-file", "prompt": "hi", "temperature": 0.2, "max_tokens": 64.0, "stop": []any{"END"}}},
		{"max_completion_tokens is max_tokens", `{"model":"qwen","messages":[],"max_completion_tokens":5}`,
			map[string]any{"model": "qwen-file", "messages": []any{}, "temperature": 0.2, "max_completion_tokens": 5.0, "stop": []any{"END"}}},
		{"configured, same file, no defaults: as it came", `{"model":"tiny","prompt":"x"}`, map[string]any{"model": "tiny", "prompt": "x"}},
		{"not configured: as it came", `{"model":"other","prompt":"x"}`, map[string]any{"model": "other", "prompt": "x"}},
	} {
		var req struct{ Model string }
		_ = json.Unmarshal([]byte(c.body), &req)
		out, err := rewriteBody([]byte(c.body), req.Model, s.resolve(req.Model))
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		var got map[string]any
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff(c.want, got); d != "" {
			t.Errorf("%s (-want +got):\n%s", c.name, d)
		}
	}
}

// TestSlotsOfAConfiguredModel: the router sends one worker of a
// configured model up to the model's slots, others up to WorkerSlots,
// and a new config applies at once.
func TestSlotsOfAConfiguredModel(t *testing.T) {
	s := &Service{cfg: Config{WorkerSlots: 1}}
	if n := s.slotsOf("tiny"); n != 1 {
		t.Errorf("no config: %d slots", n)
	}
	f, err := modelconfig.Parse([]byte("models:\n  small: {file: tiny, slots: 4, pools: [a]}\n"))
	if err != nil {
		t.Fatal(err)
	}
	s.models.Store(f)
	if n, m := s.slotsOf("tiny"), s.slotsOf("other"); n != 4 || m != 1 {
		t.Errorf("slots of tiny %d (want 4), of other %d (want 1)", n, m)
	}
	if p := s.allowedPools("tiny"); len(p) != 1 || p[0] != "a" {
		t.Errorf("allowed pools of tiny: %v", p)
	}
	if p := s.allowedPools("small"); p != nil {
		t.Errorf("allowed pools by name, not file: %v", p)
	}
}
