package chat_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/apiary-llm/apiary/internal/chat"
)

type parsed struct {
	Content string
	Calls   []chat.ToolCall
}

var parseCases = []struct {
	name string
	syn  chat.Syntax
	text string
	want parsed
}{
	{"hermes one call", chat.Hermes, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
		parsed{"", []chat.ToolCall{{Name: "get_weather", Arguments: `{"city":"Paris"}`}}}},
	{"hermes text then two calls", chat.Hermes, "Let me check.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": {\"x\": [1, 2]}}\n</tool_call>",
		parsed{"Let me check.", []chat.ToolCall{{Name: "a", Arguments: `{}`}, {Name: "b", Arguments: `{"x":[1,2]}`}}}},
	{"hermes arguments as a string", chat.Hermes, `<tool_call>{"name": "a", "arguments": "{\"q\": 1}"}</tool_call>`,
		parsed{"", []chat.ToolCall{{Name: "a", Arguments: `{"q":1}`}}}},
	{"hermes unclosed at the end", chat.Hermes, "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"q\": 1}}",
		parsed{"", []chat.ToolCall{{Name: "a", Arguments: `{"q":1}`}}}},
	{"hermes broken JSON is content", chat.Hermes, "<tool_call>\n{\"name\": \"a\", \"argu",
		parsed{"<tool_call>\n{\"name\": \"a\", \"argu", nil}},
	{"hermes plain answer", chat.Hermes, "It is sunny.", parsed{"It is sunny.", nil}},
	{"llama3 python tag", chat.Llama3, "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
		parsed{"", []chat.ToolCall{{Name: "get_weather", Arguments: `{"city":"Paris"}`}}}},
	{"llama3 bare JSON", chat.Llama3, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
		parsed{"", []chat.ToolCall{{Name: "get_weather", Arguments: `{"city":"Paris"}`}}}},
	{"llama3 two calls", chat.Llama3, "{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"parameters\": {\"y\": true}}",
		parsed{"", []chat.ToolCall{{Name: "a", Arguments: `{}`}, {Name: "b", Arguments: `{"y":true}`}}}},
	{"llama3 JSON that is no call", chat.Llama3, `{"answer": 42}`, parsed{`{"answer": 42}`, nil}},
	{"llama3 plain answer", chat.Llama3, "Sunny.", parsed{"Sunny.", nil}},
	{"mistral", chat.Mistral, "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, \"id\": \"abcDEF123\"}]",
		parsed{"", []chat.ToolCall{{Name: "get_weather", Arguments: `{"city":"Paris"}`}}}},
	{"mistral control token not rendered", chat.Mistral, "[{\"name\": \"a\", \"arguments\": {}}, {\"name\": \"b\", \"arguments\": {\"z\": \"w\"}}]",
		parsed{"", []chat.ToolCall{{Name: "a", Arguments: `{}`}, {Name: "b", Arguments: `{"z":"w"}`}}}},
	{"mistral plain answer", chat.Mistral, "Sunny [really].", parsed{"Sunny [really].", nil}},
}

// TestParseToolCallsOfEachFamily reads canned answers in the syntaxes of
// Hermes/Qwen, Llama 3.x and Mistral.
func TestParseToolCallsOfEachFamily(t *testing.T) {
	for _, c := range parseCases {
		t.Run(c.name, func(t *testing.T) {
			content, calls := c.syn.Parse(c.text)
			if diff := cmp.Diff(c.want, parsed{content, calls}); diff != "" {
				t.Errorf("Parse (-want +got):\n%s", diff)
			}
		})
	}
}

// TestSplitterFindsTheSameCallsPieceByPiece streams each canned answer one
// byte at a time (the worst split) and in one piece: the content passed on
// plus what Finish returns, and the calls, are what Parse finds; text
// before a call is passed on before the answer ends.
func TestSplitterFindsTheSameCallsPieceByPiece(t *testing.T) {
	for _, c := range parseCases {
		t.Run(c.name, func(t *testing.T) {
			for _, step := range []int{1, 3, len(c.text)} {
				sp := chat.NewSplitter(c.syn)
				var streamed strings.Builder
				for i := 0; i < len(c.text); i += step {
					streamed.WriteString(sp.Push(c.text[i:min(i+step, len(c.text))]))
				}
				rest, calls := sp.Finish()
				if diff := cmp.Diff(c.want.Calls, calls); diff != "" {
					t.Errorf("step %d: calls (-want +got):\n%s", step, diff)
				}
				got := strings.TrimSpace(streamed.String() + rest)
				if got != strings.TrimSpace(c.want.Content) {
					t.Errorf("step %d: content %q, want %q", step, got, c.want.Content)
				}
			}
		})
	}
	sp := chat.NewSplitter(chat.Hermes)
	if got := sp.Push("Let me check. <tool_"); got != "Let me check. " {
		t.Errorf("content before a possible marker: %q, want it passed on at once", got)
	}
}

// TestConstraintSchemas: the forced call's schema names each function as
// a constant and takes its parameters as they are.
func TestConstraintSchemas(t *testing.T) {
	tools := []chat.Tool{{Name: "a", Parameters: json.RawMessage(`{"type":"object","properties":{"x":{"type":"integer"}},"required":["x"]}`)}, {Name: "b"}}
	schema, wrap := chat.Hermes.Constraint(tools, false)
	want := `{"anyOf":[{"type":"object","properties":{"name":{"const":"a"},"arguments":{"type":"object","properties":{"x":{"type":"integer"}},"required":["x"]}},"required":["name","arguments"],"additionalProperties":false},` +
		`{"type":"object","properties":{"name":{"const":"b"},"arguments":{"type":"object","properties":{},"additionalProperties":false}},"required":["name","arguments"],"additionalProperties":false}]}`
	if string(schema) != want {
		t.Errorf("schema\n%s\nwant\n%s", schema, want)
	}
	if wrap != (chat.Wrap{Prefix: "<tool_call>\n", Suffix: "\n</tool_call>", Separator: "\n"}) {
		t.Errorf("wrap %+v", wrap)
	}
	schema, wrap = chat.Mistral.Constraint(tools[:1], true)
	if !strings.HasPrefix(string(schema), `{"type":"array","items":{"type":"object"`) || strings.Contains(string(schema), "maxItems") || wrap.Prefix != "[TOOL_CALLS]" {
		t.Errorf("mistral: %s %+v", schema, wrap)
	}
	schema, _ = chat.Llama3.Constraint(tools[:1], false)
	if !strings.Contains(string(schema), `"parameters":{"type":"object","properties"`) {
		t.Errorf("llama3: %s", schema)
	}
}

// TestFeedStreamsCallsAsTheyAreGenerated streams each canned answer one
// byte at a time and in bigger pieces: each call's name comes first,
// alone, then its arguments in fragments that add up to the arguments
// Parse finds; the content is Parse's.
func TestFeedStreamsCallsAsTheyAreGenerated(t *testing.T) {
	for _, c := range parseCases {
		t.Run(c.name, func(t *testing.T) {
			for _, step := range []int{1, 2, 5, len(c.text)} {
				sp := chat.NewSplitter(c.syn)
				var pieces []chat.Piece
				for i := 0; i < len(c.text); i += step {
					pieces = append(pieces, sp.Feed(c.text[i:min(i+step, len(c.text))])...)
				}
				pieces = append(pieces, sp.Close()...)
				var content strings.Builder
				var calls []chat.ToolCall
				for _, p := range pieces {
					switch {
					case !p.Call:
						content.WriteString(p.Content)
					case p.Name != "":
						if p.Index != len(calls) || p.Args != "" {
							t.Fatalf("step %d: name piece %+v after %d calls", step, p, len(calls))
						}
						calls = append(calls, chat.ToolCall{Name: p.Name})
					default:
						if p.Index != len(calls)-1 {
							t.Fatalf("step %d: arguments %+v for another call than the last named", step, p)
						}
						calls[p.Index].Arguments += p.Args
					}
				}
				want := c.want
				if c.name == "hermes broken JSON is content" {
					// Its name was sent before the text broke off; the rest
					// is not sent as content after it.
					want = parsed{"", []chat.ToolCall{{Name: "a"}}}
				}
				for i := range calls {
					if calls[i].Arguments == "" {
						continue
					}
					var b bytes.Buffer
					if err := json.Compact(&b, []byte(calls[i].Arguments)); err != nil {
						t.Fatalf("step %d: streamed arguments %q: %v", step, calls[i].Arguments, err)
					}
					calls[i].Arguments = b.String()
				}
				if diff := cmp.Diff(want.Calls, calls); diff != "" {
					t.Errorf("step %d: calls (-want +got):\n%s", step, diff)
				}
				if got := strings.TrimSpace(content.String()); got != strings.TrimSpace(want.Content) {
					t.Errorf("step %d: content %q, want %q", step, got, want.Content)
				}
			}
		})
	}
	// The name goes out before the arguments are complete; the arguments
	// go compacted, as the whole answer carries them.
	sp := chat.NewSplitter(chat.Hermes)
	got := sp.Feed("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1")
	if len(got) != 2 || got[0].Name != "f" || got[1].Args != `{"a":1` {
		t.Errorf("pieces of an unfinished call: %+v", got)
	}
}

func TestCalledCountsCallsFoundAtTheEnd(t *testing.T) {
	// Arguments before the name: nothing of the call can go before the
	// name, so it goes out whole once its object closes.
	sp := chat.NewSplitter(chat.Llama3)
	ps := sp.Feed(`{"parameters": {"x": 1}, "na`)
	if len(ps) != 0 {
		t.Errorf("pieces before the name: %+v", ps)
	}
	ps = append(sp.Feed(`me": "late"}`), sp.Close()...)
	if !sp.Called() || len(ps) != 2 || ps[0].Name != "late" || ps[1].Args != `{"x":1}` {
		t.Errorf("called %v, pieces %+v", sp.Called(), ps)
	}
}
