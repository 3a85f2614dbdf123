package responses

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/apiary-llm/apiary/internal/openai"
)

// Fields the translation does not know, at the top and inside tools,
// items and text.format, are ignored: the chat body is the one the same
// request makes without them. These are what OpenAI's SDKs and
// @openai/agents send that a worker has no use for.
func TestUnknownFieldsIgnored(t *testing.T) {
	plain := `{"model":"m","input":[{"role":"user","content":"x"}],"tools":[{"type":"function","name":"f","parameters":{"type":"object"}}],
		"text":{"format":{"type":"json_schema","name":"n","schema":{"type":"object"}}}}`
	extra := `{"model":"m","input":[{"role":"user","content":"x","id":"msg_1","providerData":{}}],
		"tools":[{"type":"function","name":"f","parameters":{"type":"object"},"defer_loading":false}],
		"text":{"format":{"type":"json_schema","name":"n","schema":{"type":"object"},"x":1},"verbosity":"low"},
		"conversation":null,"prompt":null,"prompt_cache_retention":"24h","prompt_cache_options":{"a":1},"context_management":[{"type":"compaction"}],
		"include":["message.output_text.logprobs"],"truncation":"auto","service_tier":"flex","prompt_cache_key":"k","safety_identifier":"s",
		"reasoning":{"effort":null,"summary":null},"max_tool_calls":3,"stream_options":{"include_obfuscation":false},"frob":{"nested":[1]}}`
	_, want, err := Chat([]byte(plain))
	if err != nil {
		t.Fatal(err)
	}
	_, got, err := Chat([]byte(extra))
	if err != nil {
		t.Fatalf("extra fields: %v", err)
	}
	var w, g any
	_ = json.Unmarshal(want, &w)
	_ = json.Unmarshal(got, &g)
	if diff := cmp.Diff(w, g); diff != "" {
		t.Errorf("the chat body changed with fields it ignores (-without +with):\n%s", diff)
	}
}

// What would change the answer and cannot be served is refused with a
// 400 naming the field; a known field of the wrong type is refused
// naming it.
func TestRefusedFields(t *testing.T) {
	for in, param := range map[string]string{
		`{"model":"m","input":"x","conversation":"conv_1"}`:             "conversation",
		`{"model":"m","input":"x","conversation":{"id":"conv_1"}}`:      "conversation",
		`{"model":"m","input":"x","prompt":{"id":"pmpt_1"}}`:            "prompt",
		`{"model":"m","input":"x","reasoning":{"effort":"high"}}`:       "reasoning",
		`{"model":"m","input":"x","reasoning":{"summary":"auto"}}`:      "reasoning",
		`{"model":"m","input":"x","background":true}`:                   "background",
		`{"model":"m","input":"x","top_logprobs":2}`:                    "top_logprobs",
		`{"model":"m","input":"x","max_output_tokens":"9"}`:             "max_output_tokens",
		`{"model":"m","input":"x","tools":{"type":"function"}}`:         "tools",
		`{"model":"m","input":"x","text":{"format":{"type":7}}}`:        "text.format.type",
		`{"model":"m","input":"x","stream":"yes"}`:                      "stream",
		`{"model":"m","input":"x","reasoning":{"effort":"none"},"a":1}`: "",
	} {
		_, _, err := Chat([]byte(in))
		if param == "" {
			if err != nil {
				t.Errorf("%s: %v, want it taken", in, err)
			}
			continue
		}
		if !errors.Is(err, ErrBadRequest) || openai.AsError(err).Param != param || openai.AsError(err).Status != 400 {
			t.Errorf("%s: %v, want a refusal of %s", in, err, param)
		}
	}
}

// tool_choice "required" (or a named function) with a structured
// text.format is what @openai/agents sends for a tool-using agent with
// an output type: the forced call is constrained by the tool's
// parameters, so the format is not sent with it (the chat endpoint
// refuses both at once); without a forced call the format constrains the
// answer. Each body is one the chat endpoint takes.
func TestForcedCallWithFormat(t *testing.T) {
	const tools = `"tools":[{"type":"function","name":"f","parameters":{"type":"object","properties":{"a":{"type":"string"}},"required":["a"]}}]`
	const format = `"text":{"format":{"type":"json_schema","name":"out","strict":true,"schema":{"type":"object","properties":{"n":{"type":"integer"}},"required":["n"],"additionalProperties":false}}}`
	for _, c := range []struct {
		choice     string
		wantFormat bool
	}{
		{`"tool_choice":"required",`, false},
		{`"tool_choice":{"type":"function","name":"f"},`, false},
		{`"tool_choice":"auto",`, true},
		{``, true},
		{`"tool_choice":"none",`, true},
	} {
		in := `{"model":"m","input":"x",` + c.choice + tools + `,` + format + `}`
		_, body, err := Chat([]byte(in))
		if err != nil {
			t.Errorf("%s: %v", c.choice, err)
			continue
		}
		req, err := openai.DecodeChatCompletionRequest(body, openai.Limits{})
		if err != nil {
			t.Errorf("%s: the chat endpoint refuses %s: %v", c.choice, body, err)
			continue
		}
		if got := req.ResponseFormat.Schema() != nil; got != c.wantFormat {
			t.Errorf("%s: response_format sent %v, want %v (%s)", c.choice, got, c.wantFormat, body)
		}
	}
	// A format of text is no constraint; one the translation does not
	// know is refused, forced call or not.
	if _, _, err := Chat([]byte(`{"model":"m","input":"x","tool_choice":"required",` + tools + `,"text":{"format":{"type":"yaml"}}}`)); openai.AsError(err).Param != "text.format.type" {
		t.Errorf("an unknown format with a forced call: %v", err)
	}
}
