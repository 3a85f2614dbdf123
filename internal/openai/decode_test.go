package openai

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func ptr[T any](v T) *T { return &v }

var testLimits = Limits{MaxTokens: 512}

func TestDecodeCompletionRequestAccepts(t *testing.T) {
	tests := []struct {
		name string
		body string
		want CompletionRequest
	}{
		{
			name: "minimal",
			body: `{"prompt":"hi"}`,
			want: CompletionRequest{Prompt: "hi"},
		},
		{
			name: "everything supported",
			body: `{"model":"tiny","prompt":"Once","max_tokens":16,"temperature":0,"top_p":0.5,"top_k":40,
				"min_p":0.05,"seed":42,"stop":["\n","END"],"ignore_eos":true,"stream":true,
				"stream_options":{"include_usage":true},"presence_penalty":0.5,"frequency_penalty":-1,
				"n":1,"best_of":1,"echo":false,"suffix":"","logit_bias":{},"user":"u1"}`,
			want: CompletionRequest{Model: "tiny", Prompt: "Once", Sampling: Sampling{
				MaxTokens: ptr(16), Temperature: ptr(0.0), TopP: ptr(0.5), TopK: ptr(40), MinP: ptr(0.05),
				Seed: ptr(int64(42)), Stop: []string{"\n", "END"}, IgnoreEOS: true, Stream: true,
				StreamOptions: &StreamOptions{IncludeUsage: true}, PresencePenalty: ptr(0.5), FrequencyPenalty: ptr(-1.0), N: 1,
			}},
		},
		{
			name: "choices, logprobs, biases, grammar",
			body: `{"prompt":"a","n":3,"logprobs":5,"logit_bias":{"7":-100,"12":2.5},"repeat_penalty":1.1,"grammar":"root ::= \"x\""}`,
			want: CompletionRequest{Prompt: "a", Sampling: Sampling{N: 3, Logprobs: true, TopLogprobs: 5,
				LogitBias: map[int]float64{7: -100, 12: 2.5}, RepeatPenalty: ptr(1.1), Grammar: `root ::= "x"`}},
		},
		{
			name: "logprobs zero",
			body: `{"prompt":"a","logprobs":0}`,
			want: CompletionRequest{Prompt: "a", Sampling: Sampling{Logprobs: true}},
		},
		{
			name: "json_schema",
			body: `{"prompt":"a","response_format":{"type":"json_schema","json_schema":{"name":"p","strict":true,
				"schema":{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"],"additionalProperties":false}}}}`,
			want: CompletionRequest{Prompt: "a", Sampling: Sampling{ResponseFormat: &ResponseFormat{Type: FormatJSONSchema,
				JSONSchema: &JSONSchema{Name: "p", Strict: true, Schema: json.RawMessage(`{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"],"additionalProperties":false}`)}}}},
		},
		{
			name: "json_object with a schema (llama-server's extension)",
			body: `{"prompt":"a","response_format":{"type":"json_object","schema":{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]}}}`,
			want: CompletionRequest{Prompt: "a", Sampling: Sampling{ResponseFormat: &ResponseFormat{Type: FormatJSONObject,
				JSONSchema: &JSONSchema{Schema: json.RawMessage(`{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]}`)}}}},
		},
		{
			name: "unknown fields are ignored",
			body: `{"prompt":"hi","frobnicate":{"x":[1,2]},"Max_Tokens":"not ours","metadata":{"a":"b"}}`,
			want: CompletionRequest{Prompt: "hi"},
		},
		{
			name: "nulls are absent",
			body: `{"prompt":"hi","max_tokens":null,"stop":null,"temperature":null,"logprobs":null,"stream_options":null,"n":null}`,
			want: CompletionRequest{Prompt: "hi"},
		},
		{
			name: "prompt as array of one string",
			body: `{"prompt":["hello"]}`,
			want: CompletionRequest{Prompt: "hello"},
		},
		{
			name: "empty prompt",
			body: `{"prompt":""}`,
			want: CompletionRequest{Prompt: ""},
		},
		{
			name: "stop as a string",
			body: `{"prompt":"a","stop":"\n\n"}`,
			want: CompletionRequest{Prompt: "a", Sampling: Sampling{Stop: []string{"\n\n"}}},
		},
		{
			name: "empty stop array",
			body: `{"prompt":"a","stop":[]}`,
			want: CompletionRequest{Prompt: "a"},
		},
		{
			name: "integral numbers written as floats",
			body: `{"prompt":"a","max_tokens":16.0,"seed":1e3}`,
			want: CompletionRequest{Prompt: "a", Sampling: Sampling{MaxTokens: ptr(16), Seed: ptr(int64(1000))}},
		},
		{
			name: "max_tokens at the limit",
			body: `{"prompt":"a","max_tokens":512}`,
			want: CompletionRequest{Prompt: "a", Sampling: Sampling{MaxTokens: ptr(512)}},
		},
		{
			name: "top_p of exactly 1 and temperature 2",
			body: `{"prompt":"a","top_p":1,"temperature":2}`,
			want: CompletionRequest{Prompt: "a", Sampling: Sampling{TopP: ptr(1.0), Temperature: ptr(2.0)}},
		},
		{
			name: "negative seed",
			body: `{"prompt":"a","seed":-1}`,
			want: CompletionRequest{Prompt: "a", Sampling: Sampling{Seed: ptr(int64(-1))}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := DecodeCompletionRequest([]byte(tt.body), testLimits)
			if err != nil {
				t.Fatalf("DecodeCompletionRequest: %v", err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("request mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

// wantErr is the part of an *Error a rejection test checks.
type wantErr struct {
	Status int
	Code   string
	Param  string
}

func checkErr(t *testing.T, err error, want wantErr) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want %+v", want)
	}
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v is not an *Error", err)
	}
	got := wantErr{Status: e.Status, Code: e.Code, Param: e.Param}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("error %q mismatch (-want +got):\n%s", e.Message, diff)
	}
	if e.Message == "" {
		t.Error("error has no message")
	}
	if e.Param != "" && !strings.Contains(e.Message, e.Param) {
		t.Errorf("message %q does not name the field %q", e.Message, e.Param)
	}
}

func bad(code, param string) wantErr {
	return wantErr{Status: http.StatusBadRequest, Code: code, Param: param}
}

func TestDecodeCompletionRequestRejects(t *testing.T) {
	tests := []struct {
		name string
		body string
		want wantErr
	}{
		{"empty body", ``, bad(CodeInvalidJSON, "")},
		{"malformed JSON", `{"prompt":`, bad(CodeInvalidJSON, "")},
		{"trailing garbage", `{"prompt":"a"} x`, bad(CodeInvalidJSON, "")},
		{"array body", `["prompt"]`, bad(CodeInvalidJSON, "")},
		{"string body", `"prompt"`, bad(CodeInvalidJSON, "")},
		{"missing prompt", `{"max_tokens":3}`, bad(CodeMissingParameter, "prompt")},
		{"null prompt", `{"prompt":null}`, bad(CodeMissingParameter, "prompt")},
		{"prompt number", `{"prompt":5}`, bad(CodeInvalidType, "prompt")},
		{"prompt object", `{"prompt":{"text":"a"}}`, bad(CodeInvalidType, "prompt")},
		{"prompt token array", `{"prompt":[1,2,3]}`, bad(CodeUnsupported, "prompt")},
		{"prompt token arrays", `{"prompt":[[1,2],[3]]}`, bad(CodeUnsupported, "prompt")},
		{"prompt two strings", `{"prompt":["a","b"]}`, bad(CodeUnsupported, "prompt")},
		{"prompt empty array", `{"prompt":[]}`, bad(CodeInvalidValue, "prompt")},
		{"prompt array of bool", `{"prompt":[true]}`, bad(CodeInvalidType, "prompt[0]")},
		{"model number", `{"prompt":"a","model":7}`, bad(CodeInvalidType, "model")},
		{"max_tokens string", `{"prompt":"a","max_tokens":"16"}`, bad(CodeInvalidType, "max_tokens")},
		{"max_tokens zero", `{"prompt":"a","max_tokens":0}`, bad(CodeInvalidValue, "max_tokens")},
		{"max_tokens negative", `{"prompt":"a","max_tokens":-5}`, bad(CodeInvalidValue, "max_tokens")},
		{"max_tokens over limit", `{"prompt":"a","max_tokens":513}`, bad(CodeInvalidValue, "max_tokens")},
		{"max_tokens huge", `{"prompt":"a","max_tokens":99999999999999999999999}`, bad(CodeInvalidValue, "max_tokens")},
		{"max_tokens fraction", `{"prompt":"a","max_tokens":1.5}`, bad(CodeInvalidType, "max_tokens")},
		{"temperature string", `{"prompt":"a","temperature":"hot"}`, bad(CodeInvalidType, "temperature")},
		{"temperature numeric string", `{"prompt":"a","temperature":"0.5"}`, bad(CodeInvalidType, "temperature")},
		{"temperature too high", `{"prompt":"a","temperature":2.5}`, bad(CodeInvalidValue, "temperature")},
		{"temperature negative", `{"prompt":"a","temperature":-0.1}`, bad(CodeInvalidValue, "temperature")},
		{"top_p zero", `{"prompt":"a","top_p":0}`, bad(CodeInvalidValue, "top_p")},
		{"top_p above one", `{"prompt":"a","top_p":1.01}`, bad(CodeInvalidValue, "top_p")},
		{"top_k negative", `{"prompt":"a","top_k":-1}`, bad(CodeInvalidValue, "top_k")},
		{"top_k float", `{"prompt":"a","top_k":2.5}`, bad(CodeInvalidType, "top_k")},
		{"min_p above one", `{"prompt":"a","min_p":1.5}`, bad(CodeInvalidValue, "min_p")},
		{"presence_penalty out of range", `{"prompt":"a","presence_penalty":3}`, bad(CodeInvalidValue, "presence_penalty")},
		{"frequency_penalty type", `{"prompt":"a","frequency_penalty":true}`, bad(CodeInvalidType, "frequency_penalty")},
		{"seed string", `{"prompt":"a","seed":"42"}`, bad(CodeInvalidType, "seed")},
		{"stop number", `{"prompt":"a","stop":5}`, bad(CodeInvalidType, "stop")},
		{"stop array of numbers", `{"prompt":"a","stop":[1]}`, bad(CodeInvalidType, "stop")},
		{"stop too many", `{"prompt":"a","stop":["a","b","c","d","e"]}`, bad(CodeInvalidValue, "stop")},
		{"stop empty string", `{"prompt":"a","stop":""}`, bad(CodeInvalidValue, "stop[0]")},
		{"stop empty element", `{"prompt":"a","stop":["x",""]}`, bad(CodeInvalidValue, "stop[1]")},
		{"ignore_eos string", `{"prompt":"a","ignore_eos":"yes"}`, bad(CodeInvalidType, "ignore_eos")},
		{"stream string", `{"prompt":"a","stream":"true"}`, bad(CodeInvalidType, "stream")},
		{"stream_options not object", `{"prompt":"a","stream_options":true}`, bad(CodeInvalidType, "stream_options")},
		{"include_usage string", `{"prompt":"a","stream":true,"stream_options":{"include_usage":"yes"}}`, bad(CodeInvalidType, "stream_options.include_usage")},
		{"n too many", `{"prompt":"a","n":17}`, bad(CodeInvalidValue, "n")},
		{"n zero", `{"prompt":"a","n":0}`, bad(CodeInvalidValue, "n")},
		{"best_of two", `{"prompt":"a","best_of":2}`, bad(CodeUnsupported, "best_of")},
		{"logprobs too many", `{"prompt":"a","logprobs":21}`, bad(CodeInvalidValue, "logprobs")},
		{"logprobs wrong type", `{"prompt":"a","logprobs":"x"}`, bad(CodeInvalidType, "logprobs")},
		{"echo", `{"prompt":"a","echo":true}`, bad(CodeUnsupported, "echo")},
		{"suffix", `{"prompt":"a","suffix":"end"}`, bad(CodeUnsupported, "suffix")},
		{"logit_bias out of range", `{"prompt":"a","logit_bias":{"50256":-101}}`, bad(CodeInvalidValue, "logit_bias.50256")},
		{"logit_bias key not a token", `{"prompt":"a","logit_bias":{"x":1}}`, bad(CodeInvalidValue, "logit_bias.x")},
		{"logit_bias value string", `{"prompt":"a","logit_bias":{"5":"1"}}`, bad(CodeInvalidType, "logit_bias.5")},
		{"repeat_penalty zero", `{"prompt":"a","repeat_penalty":0}`, bad(CodeInvalidValue, "repeat_penalty")},
		{"grammar with json", `{"prompt":"a","grammar":"root ::= \"x\"","response_format":{"type":"json_object"}}`, bad(CodeInvalidValue, "grammar")},
		{"grammar number", `{"prompt":"a","grammar":1}`, bad(CodeInvalidType, "grammar")},
		{"logit_bias wrong type", `{"prompt":"a","logit_bias":[1]}`, bad(CodeInvalidType, "logit_bias")},
		{"response_format unknown", `{"prompt":"a","response_format":{"type":"yaml"}}`, bad(CodeInvalidValue, "response_format.type")},
		{"response_format no type", `{"prompt":"a","response_format":{}}`, bad(CodeMissingParameter, "response_format.type")},
		{"json_object bad schema", `{"prompt":"a","response_format":{"type":"json_object","schema":{"type":"frog"}}}`, bad(CodeInvalidValue, "response_format.schema.type")},
		{"json_schema missing", `{"prompt":"a","response_format":{"type":"json_schema"}}`, bad(CodeMissingParameter, "response_format.json_schema")},
		{"json_schema no name", `{"prompt":"a","response_format":{"type":"json_schema","json_schema":{"schema":{}}}}`, bad(CodeMissingParameter, "response_format.json_schema.name")},
		{"json_schema not", `{"prompt":"a","response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"string","not":{"const":"a"}}}}}`,
			bad(CodeUnsupported, "response_format.json_schema.schema.not")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := DecodeCompletionRequest([]byte(tt.body), testLimits)
			checkErr(t, err, tt.want)
		})
	}
}

func TestDecodeChatCompletionRequestAccepts(t *testing.T) {
	tests := []struct {
		name string
		body string
		want ChatCompletionRequest
	}{
		{
			name: "string content",
			body: `{"model":"tiny","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}]}`,
			want: ChatCompletionRequest{Model: "tiny", Messages: []ChatMessage{
				{Role: RoleSystem, Content: "be brief"}, {Role: RoleUser, Content: "hi"}}},
		},
		{
			name: "text parts are joined",
			body: `{"messages":[{"role":"user","content":[{"type":"text","text":"one"},{"type":"text","text":"two"}]}]}`,
			want: ChatCompletionRequest{Messages: []ChatMessage{{Role: RoleUser, Content: "one\ntwo"}}},
		},
		{
			name: "developer role is system, assistant null content, names ignored",
			body: `{"messages":[{"role":"developer","content":"rules"},{"role":"assistant","content":null,"name":"bot"},
				{"role":"assistant","tool_calls":[]},{"role":"user","content":"go","name":"me"}]}`,
			want: ChatCompletionRequest{Messages: []ChatMessage{
				{Role: RoleSystem, Content: "rules"}, {Role: RoleAssistant}, {Role: RoleAssistant}, {Role: RoleUser, Content: "go"}}},
		},
		{
			name: "max_completion_tokens wins over max_tokens",
			body: `{"messages":[{"role":"user","content":"x"}],"max_completion_tokens":7,"max_tokens":9}`,
			want: ChatCompletionRequest{Messages: []ChatMessage{{Role: RoleUser, Content: "x"}},
				Sampling: Sampling{MaxTokens: ptr(7)}},
		},
		{
			name: "max_tokens alone",
			body: `{"messages":[{"role":"user","content":"x"}],"max_tokens":9}`,
			want: ChatCompletionRequest{Messages: []ChatMessage{{Role: RoleUser, Content: "x"}},
				Sampling: Sampling{MaxTokens: ptr(9)}},
		},
		{
			name: "tools, a named tool_choice, a call and its result",
			body: `{"messages":[{"role":"user","content":"weather?"},
				{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"w","arguments":"{\"c\":\"Oslo\"}"}}]},
				{"role":"tool","tool_call_id":"call_1","content":"cold"}],
				"tools":[{"type":"function","function":{"name":"w","parameters":{"type":"object","properties":{"c":{"type":"string"}}}}}],
				"tool_choice":{"type":"function","function":{"name":"w"}},"parallel_tool_calls":false}`,
			want: ChatCompletionRequest{Messages: []ChatMessage{{Role: RoleUser, Content: "weather?"},
				{Role: RoleAssistant, ToolCalls: []ToolCall{{ID: "call_1", Type: "function", Function: FunctionCall{Name: "w", Arguments: `{"c":"Oslo"}`}}}},
				{Role: RoleTool, Content: "cold", ToolCallID: "call_1"}},
				Tools: []Tool{{Type: "function", Function: FunctionDef{Name: "w", Parameters: json.RawMessage(`{"type":"object","properties":{"c":{"type":"string"}}}`)},
					Raw: json.RawMessage(`{"type":"function","function":{"name":"w","parameters":{"type":"object","properties":{"c":{"type":"string"}}}}}`)}},
				ToolChoice: ToolChoice{Mode: ToolChoiceFunction, Function: "w"}, ParallelToolCalls: new(false)},
		},
		{
			name: "harmless chat options",
			body: `{"messages":[{"role":"user","content":"x"}],"tools":[],"tool_choice":"none","logprobs":false,
				"top_logprobs":0,"modalities":["text"],"response_format":{"type":"text"},"parallel_tool_calls":false,
				"stream":true,"stream_options":{"include_usage":false}}`,
			want: ChatCompletionRequest{Messages: []ChatMessage{{Role: RoleUser, Content: "x"}},
				Sampling: Sampling{Stream: true, StreamOptions: &StreamOptions{}}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := DecodeChatCompletionRequest([]byte(tt.body), testLimits)
			if err != nil {
				t.Fatalf("DecodeChatCompletionRequest: %v", err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("request mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDecodeChatCompletionRequestRejects(t *testing.T) {
	const user = `{"role":"user","content":"x"}`
	tests := []struct {
		name string
		body string
		want wantErr
	}{
		{"missing messages", `{"model":"m"}`, bad(CodeMissingParameter, "messages")},
		{"messages not array", `{"messages":"hi"}`, bad(CodeInvalidType, "messages")},
		{"empty messages", `{"messages":[]}`, bad(CodeInvalidValue, "messages")},
		{"message not object", `{"messages":["hi"]}`, bad(CodeInvalidType, "messages[0]")},
		{"missing role", `{"messages":[{"content":"x"}]}`, bad(CodeMissingParameter, "messages[0].role")},
		{"role number", `{"messages":[{"role":1,"content":"x"}]}`, bad(CodeInvalidType, "messages[0].role")},
		{"unknown role", `{"messages":[` + user + `,{"role":"robot","content":"x"}]}`, bad(CodeInvalidValue, "messages[1].role")},
		{"function role", `{"messages":[` + user + `,{"role":"function","content":"x","name":"f"}]}`, bad(CodeUnsupported, "messages[1].role")},
		{"tool message without its call id", `{"messages":[` + user + `,{"role":"tool","content":"x"}]}`, bad(CodeMissingParameter, "messages[1].tool_call_id")},
		{"tool_calls without function", `{"messages":[{"role":"assistant","tool_calls":[{"id":"1"}]}]}`, bad(CodeMissingParameter, "messages[0].tool_calls[0].function")},
		{"tool_calls on a user message", `{"messages":[{"role":"user","content":"x","tool_calls":[{"id":"1"}]}]}`, bad(CodeInvalidValue, "messages[0].tool_calls")},
		{"function_call", `{"messages":[{"role":"assistant","function_call":{"name":"f"}}]}`, bad(CodeUnsupported, "messages[0].function_call")},
		{"missing user content", `{"messages":[{"role":"user"}]}`, bad(CodeMissingParameter, "messages[0].content")},
		{"content number", `{"messages":[{"role":"user","content":3}]}`, bad(CodeInvalidType, "messages[0].content")},
		{"image part not a data URI", `{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}}]}]}`, bad(CodeInvalidValue, "messages[0].content[1].image_url.url")},
		{"image URL to fetch", `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://example.com/a.png"}}]}]}`, bad(CodeUnsupported, "messages[0].content[0].image_url.url")},
		{"image of another type", `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/svg+xml;base64,PHN2Zz4="}}]}]}`, bad(CodeInvalidValue, "messages[0].content[0].image_url.url")},
		{"image not base64", `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png,abc"}}]}]}`, bad(CodeInvalidValue, "messages[0].content[0].image_url.url")},
		{"image bad base64", `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,!!!"}}]}]}`, bad(CodeInvalidValue, "messages[0].content[0].image_url.url")},
		{"image in a system message", `{"messages":[{"role":"system","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw=="}}]}]}`, bad(CodeUnsupported, "messages[0].content[0].type")},
		{"image marker in text beside an image", `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw=="}},{"type":"text","text":"<__media__>"}]}]}`, bad(CodeInvalidValue, "messages[0].content[1].text")},
		{"unknown part", `{"messages":[{"role":"user","content":[{"type":"hologram"}]}]}`, bad(CodeInvalidValue, "messages[0].content[0].type")},
		{"part without type", `{"messages":[{"role":"user","content":[{"text":"a"}]}]}`, bad(CodeMissingParameter, "messages[0].content[0].type")},
		{"part without text", `{"messages":[{"role":"user","content":[{"type":"text"}]}]}`, bad(CodeMissingParameter, "messages[0].content[0].text")},
		{"part text number", `{"messages":[{"role":"user","content":[{"type":"text","text":1}]}]}`, bad(CodeInvalidType, "messages[0].content[0].text")},
		{"part not object", `{"messages":[{"role":"user","content":["a"]}]}`, bad(CodeInvalidType, "messages[0].content[0]")},
		{"tools of another type", `{"messages":[` + user + `],"tools":[{"type":"retrieval"}]}`, bad(CodeUnsupported, "tools[0].type")},
		{"tool without a name", `{"messages":[` + user + `],"tools":[{"type":"function","function":{}}]}`, bad(CodeMissingParameter, "tools[0].function.name")},
		{"tool name with a space", `{"messages":[` + user + `],"tools":[{"type":"function","function":{"name":"a b"}}]}`, bad(CodeInvalidValue, "tools[0].function.name")},
		{"tool named twice", `{"messages":[` + user + `],"tools":[{"type":"function","function":{"name":"f"}},{"type":"function","function":{"name":"f"}}]}`, bad(CodeInvalidValue, "tools[1].function.name")},
		{"tool_choice names no tool", `{"messages":[` + user + `],"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"g"}}}`, bad(CodeInvalidValue, "tool_choice.function.name")},
		{"forced tool with a schema outside the subset", `{"messages":[` + user + `],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"d":{"type":"string","not":{"const":"x"}}}}}}],"tool_choice":"required"}`,
			bad(CodeUnsupported, "tools[0].function.parameters.properties.d.not")},
		{"functions", `{"messages":[` + user + `],"functions":[{"name":"f"}]}`, bad(CodeUnsupported, "functions")},
		{"functions", `{"messages":[` + user + `],"functions":[{"name":"f"}]}`, bad(CodeUnsupported, "functions")},
		{"tools wrong type", `{"messages":[` + user + `],"tools":{}}`, bad(CodeInvalidType, "tools")},
		{"tool_choice required without tools", `{"messages":[` + user + `],"tool_choice":"required"}`, bad(CodeInvalidValue, "tool_choice")},
		{"logprobs string", `{"messages":[` + user + `],"logprobs":"yes"}`, bad(CodeInvalidType, "logprobs")},
		{"top_logprobs without logprobs", `{"messages":[` + user + `],"top_logprobs":3}`, bad(CodeInvalidValue, "top_logprobs")},
		{"top_logprobs too many", `{"messages":[` + user + `],"logprobs":true,"top_logprobs":21}`, bad(CodeInvalidValue, "top_logprobs")},
		{"audio", `{"messages":[` + user + `],"audio":{"voice":"x"}}`, bad(CodeUnsupported, "audio")},
		{"modalities audio", `{"messages":[` + user + `],"modalities":["text","audio"]}`, bad(CodeUnsupported, "modalities[1]")},
		{"max_completion_tokens negative", `{"messages":[` + user + `],"max_completion_tokens":-1}`, bad(CodeInvalidValue, "max_completion_tokens")},
		{"max_tokens huge", `{"messages":[` + user + `],"max_tokens":1000000}`, bad(CodeInvalidValue, "max_tokens")},
		{"n too many", `{"messages":[` + user + `],"n":100}`, bad(CodeInvalidValue, "n")},
		{"temperature type", `{"messages":[` + user + `],"temperature":[]}`, bad(CodeInvalidType, "temperature")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := DecodeChatCompletionRequest([]byte(tt.body), testLimits)
			checkErr(t, err, tt.want)
		})
	}
}

func TestDefaultMaxTokensLimit(t *testing.T) {
	if _, err := DecodeCompletionRequest([]byte(`{"prompt":"a","max_tokens":100000}`), Limits{}); err != nil {
		t.Errorf("max_tokens 100000 with no limit: %v", err)
	}
	_, err := DecodeCompletionRequest([]byte(`{"prompt":"a","max_tokens":1e12}`), Limits{})
	checkErr(t, err, bad(CodeInvalidValue, "max_tokens"))
}

func TestErrorsUnwrapToSentinels(t *testing.T) {
	_, err := DecodeCompletionRequest([]byte(`{"prompt":"a","best_of":3}`), testLimits)
	if !errors.Is(err, ErrUnsupported) {
		t.Errorf("best_of=3: %v is not ErrUnsupported", err)
	}
	_, err = DecodeCompletionRequest([]byte(`{"prompt":"a","temperature":9}`), testLimits)
	if !errors.Is(err, ErrInvalidRequest) {
		t.Errorf("temperature=9: %v is not ErrInvalidRequest", err)
	}
}

// TestRequestsMarshalToValidBodies checks that a decoded request, encoded
// again (as a router forwarding it would), decodes to the same request.
func TestRequestsMarshalToValidBodies(t *testing.T) {
	chat, err := DecodeChatCompletionRequest([]byte(`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"}]}],
		"max_completion_tokens":5,"stop":"x","stream":true,"stream_options":{"include_usage":true},"seed":3}`), testLimits)
	if err != nil {
		t.Fatal(err)
	}
	body, err := json.Marshal(chat)
	if err != nil {
		t.Fatal(err)
	}
	again, err := DecodeChatCompletionRequest(body, testLimits)
	if err != nil {
		t.Fatalf("decode %s: %v", body, err)
	}
	if diff := cmp.Diff(chat, again); diff != "" {
		t.Errorf("round trip mismatch (-first +again):\n%s", diff)
	}

	cmpl, err := DecodeCompletionRequest([]byte(`{"prompt":["a"],"top_k":3,"ignore_eos":true}`), testLimits)
	if err != nil {
		t.Fatal(err)
	}
	body, err = json.Marshal(cmpl)
	if err != nil {
		t.Fatal(err)
	}
	againCmpl, err := DecodeCompletionRequest(body, testLimits)
	if err != nil {
		t.Fatalf("decode %s: %v", body, err)
	}
	if diff := cmp.Diff(cmpl, againCmpl); diff != "" {
		t.Errorf("round trip mismatch (-first +again):\n%s", diff)
	}
}

func TestIncludeUsage(t *testing.T) {
	tests := []struct {
		s    Sampling
		want bool
	}{
		{Sampling{}, false},
		{Sampling{Stream: true}, false},
		{Sampling{Stream: true, StreamOptions: &StreamOptions{IncludeUsage: true}}, true},
		{Sampling{StreamOptions: &StreamOptions{IncludeUsage: true}}, false},
	}
	for _, tt := range tests {
		if got := tt.s.IncludeUsage(); got != tt.want {
			t.Errorf("%+v.IncludeUsage() = %v, want %v", tt.s, got, tt.want)
		}
	}
}
