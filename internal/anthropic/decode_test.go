package anthropic_test

import (
	"errors"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/apiary-llm/apiary/internal/anthropic"
	"github.com/apiary-llm/apiary/internal/openai"
)

func ptr[T any](v T) *T { return &v }

func TestDecodeMapsToChat(t *testing.T) {
	got, err := anthropic.Decode([]byte(`{"model":"m","max_tokens":64,"system":[{"type":"text","text":"Be"},{"type":"text","text":"brief."}],
		"messages":[{"role":"user","content":"Hi"},{"role":"assistant","content":[{"type":"text","text":"Hello"}]},{"role":"user","content":"More"}],
		"temperature":0.5,"top_p":0.9,"top_k":20,"stop_sequences":["\n\n"],"stream":true,"metadata":{"user_id":"u"},"thinking":{"type":"disabled"}}`))
	if err != nil {
		t.Fatal(err)
	}
	want := anthropic.Request{Model: "m", Messages: []openai.ChatMessage{
		{Role: "system", Content: "Be\nbrief."}, {Role: "user", Content: "Hi"}, {Role: "assistant", Content: "Hello"}, {Role: "user", Content: "More"}},
		Sampling: openai.Sampling{MaxTokens: ptr(64), Temperature: ptr(0.5), TopP: ptr(0.9), TopK: ptr(20), Stop: []string{"\n\n"}, Stream: true}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("request (-want +got):\n%s", diff)
	}
}

// Tools: input_schema as a function's parameters; tool_choice any is
// required, tool a named function, disable_parallel_tool_use no parallel
// calls; an assistant's tool_use blocks its calls, a user's tool_result
// blocks tool messages before the user's text.
func TestDecodeTools(t *testing.T) {
	got, err := anthropic.Decode([]byte(`{"model":"m","max_tokens":9,
		"tools":[{"name":"get_weather","description":"Weather","input_schema":{"type":"object","properties":{"city":{"type":"string"}}}}],
		"tool_choice":{"type":"tool","name":"get_weather","disable_parallel_tool_use":true},
		"messages":[{"role":"user","content":"Oslo?"},
		{"role":"assistant","content":[{"type":"text","text":"Looking."},{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{"city":"Oslo"}}]},
		{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":[{"type":"text","text":"rain"}]},{"type":"text","text":"And now?"}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Tools) != 1 || got.Tools[0].Function.Name != "get_weather" || string(got.Tools[0].Function.Parameters) == "" ||
		got.ToolChoice != (openai.ToolChoice{Mode: openai.ToolChoiceFunction, Function: "get_weather"}) || got.ParallelToolCalls == nil || *got.ParallelToolCalls {
		t.Errorf("tools %+v choice %+v parallel %v", got.Tools, got.ToolChoice, got.ParallelToolCalls)
	}
	want := []openai.ChatMessage{{Role: "user", Content: "Oslo?"},
		{Role: "assistant", Content: "Looking.", ToolCalls: []openai.ToolCall{{ID: "toolu_1", Type: "function", Function: openai.FunctionCall{Name: "get_weather", Arguments: `{"city":"Oslo"}`}}}},
		{Role: "tool", ToolCallID: "toolu_1", Content: "rain"}, {Role: "user", Content: "And now?"}}
	if diff := cmp.Diff(want, got.Messages); diff != "" {
		t.Errorf("messages (-want +got):\n%s", diff)
	}
}

func TestDecodeRefuses(t *testing.T) {
	const msgs = `"messages":[{"role":"user","content":"x"}]`
	for _, tt := range []struct {
		name, body, param string
		unsupported       bool
	}{
		{"not an object", `[]`, "", false},
		{"no max_tokens", `{` + msgs + `}`, "max_tokens", false},
		{"max_tokens 0", `{"max_tokens":0,` + msgs + `}`, "max_tokens", false},
		{"no messages", `{"max_tokens":5}`, "messages", false},
		{"empty messages", `{"max_tokens":5,"messages":[]}`, "messages", false},
		{"system role", `{"max_tokens":5,"messages":[{"role":"system","content":"x"}]}`, "messages.0.role", false},
		{"temperature 2", `{"max_tokens":5,"temperature":2,` + msgs + `}`, "temperature", false},
		{"five stop sequences", `{"max_tokens":5,"stop_sequences":["a","b","c","d","e"],` + msgs + `}`, "stop_sequences", false},
		{"a server tool", `{"max_tokens":5,"tools":[{"type":"web_search_20250305","name":"web_search"}],` + msgs + `}`, "tools.0.type", true},
		{"a tool without input_schema", `{"max_tokens":5,"tools":[{"name":"f"}],` + msgs + `}`, "tools.0.input_schema", false},
		{"tool_choice without tools", `{"max_tokens":5,"tool_choice":{"type":"auto"},` + msgs + `}`, "tool_choice", false},
		{"tool_choice of no tool", `{"max_tokens":5,"tools":[{"name":"f","input_schema":{"type":"object"}}],"tool_choice":{"type":"tool","name":"g"},` + msgs + `}`, "tool_choice.name", false},
		{"tool_result from the assistant", `{"max_tokens":5,"messages":[{"role":"assistant","content":[{"type":"tool_result","tool_use_id":"x"}]}]}`, "messages.0.content.0.type", false},
		{"image block without a source", `{"max_tokens":5,"messages":[{"role":"user","content":[{"type":"image"}]}]}`, "messages.0.content.0.source", false},
		{"image by URL", `{"max_tokens":5,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"url","url":"https://x/y.png"}}]}]}`, "messages.0.content.0.source.type", true},
		{"image of another type", `{"max_tokens":5,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/svg+xml","data":"PHN2Zz4="}}]}]}`, "messages.0.content.0.source", false},
		{"image from the assistant", `{"max_tokens":5,"messages":[{"role":"assistant","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"aGk="}}]}]}`, "messages.0.content.0.type", true},
		{"thinking", `{"max_tokens":5,"thinking":{"type":"enabled","budget_tokens":1024},` + msgs + `}`, "thinking", true},
	} {
		_, err := anthropic.Decode([]byte(tt.body))
		e := openai.AsError(err)
		if err == nil || e.Status != 400 || e.Param != tt.param || errors.Is(err, anthropic.ErrUnsupported) != tt.unsupported {
			t.Errorf("%s: %v (param %q), want a 400 on %q (unsupported %v)", tt.name, err, e.Param, tt.param, tt.unsupported)
		}
	}
}

func TestWriteErrorInAnthropicsShape(t *testing.T) {
	rec := httptest.NewRecorder()
	status := anthropic.WriteError(rec, &openai.Error{Status: 503, Code: "queue_full", Message: "busy", RetryAfter: 1500e6})
	if status != 503 || rec.Header().Get("Retry-After") != "2" ||
		strings.TrimSpace(rec.Body.String()) != `{"type":"error","error":{"type":"overloaded_error","message":"busy"}}` {
		t.Errorf("%d %v %s", status, rec.Header(), rec.Body)
	}
	for status, typ := range map[int]string{400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
		404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error", 502: "api_error", 529: "overloaded_error"} {
		if got := anthropic.TypeFor(status); got != typ {
			t.Errorf("TypeFor(%d) = %q, want %q", status, got, typ)
		}
	}
}

// An image block's base64 picture becomes the message's image, its place
// in the text the image marker (as an OpenAI image_url part's).
func TestDecodeImageBlocks(t *testing.T) {
	got, err := anthropic.Decode([]byte(`{"model":"m","max_tokens":9,"messages":[{"role":"user","content":[
		{"type":"text","text":"What is this?"},{"type":"image","source":{"type":"base64","media_type":"image/png","data":"aGk="}}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	want := []openai.ChatMessage{{Role: "user", Content: "What is this?" + openai.ImageMarker, Images: [][]byte{[]byte("hi")}}}
	if diff := cmp.Diff(want, got.Messages); diff != "" {
		t.Errorf("messages (-want +got):\n%s", diff)
	}
}
