package worker

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/apiary-llm/apiary/internal/engine"
	"github.com/apiary-llm/apiary/internal/openai"
	"github.com/apiary-llm/apiary/internal/testmodel"
)

const weatherTool = `[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}]`

// The model's own template renders the tools, and a call the model writes
// (here scripted, in pieces that split the markers) comes back as
// tool_calls, whole and streamed.
func TestAutoToolCallsFromTheModelsText(t *testing.T) {
	script := []string{"Sure. <tool_", "call>\n{\"name\": \"get_", "weather\", \"arguments\": {\"city\": ", "\"Oslo\"}}\n</tool_call>"}
	eng := newFakeEngine(script...)
	eng.info.ChatTemplate, eng.info.CtxSize = testmodel.ToolChatTemplate, 4096
	eng.started = make(chan engine.Request, 2)
	r := startWorker(t, testConfig(t), eng)
	body := `{"messages":[{"role":"user","content":"Weather in Oslo?"}],"tools":` + weatherTool

	var got openai.ChatCompletion
	if status, _ := r.postJSON(t, "/v1/chat/completions", body+`}`, &got); status != http.StatusOK {
		t.Fatalf("status %d", status)
	}
	prompt := string(bytesOf((<-eng.started).Prompt[1:]))
	if !strings.HasPrefix(prompt, "<|im_start|>system\n# Tools\n<tools>\n{\"type\": \"function\"") || !strings.HasSuffix(prompt, "<|im_start|>assistant\n") {
		t.Errorf("prompt %q is not the model's template with the tools", prompt)
	}
	m := got.Choices[0].Message
	if got.Choices[0].FinishReason != "tool_calls" || m.Content != "Sure." || len(m.ToolCalls) != 1 ||
		!strings.HasPrefix(m.ToolCalls[0].ID, "call_") || m.ToolCalls[0].Type != "function" ||
		m.ToolCalls[0].Function.Name != "get_weather" || m.ToolCalls[0].Function.Arguments != `{"city":"Oslo"}` {
		t.Errorf("answer %+v", got.Choices[0])
	}

	res := r.post(t, t.Context(), "/v1/chat/completions", body+`,"stream":true}`)
	defer res.Body.Close()
	s := newSSEReader(t, res.Body)
	var content, args strings.Builder
	var names []string
	finish := ""
	for ev := s.next(); ev != "[DONE]"; ev = s.next() {
		var c openai.ChatCompletionChunk
		if err := json.Unmarshal([]byte(ev), &c); err != nil {
			t.Fatal(err)
		}
		d := c.Choices[0].Delta
		if d.Content != nil {
			content.WriteString(*d.Content)
		}
		for _, tc := range d.ToolCalls {
			if tc.Index == nil || *tc.Index != 0 {
				t.Errorf("tool call delta %+v, want index 0", tc)
			}
			if tc.Function.Name != "" {
				names = append(names, tc.Function.Name)
				if args.Len() > 0 || !strings.HasPrefix(tc.ID, "call_") {
					t.Errorf("name delta %+v after arguments or without an id", tc)
				}
			}
			args.WriteString(tc.Function.Arguments)
		}
		if c.Choices[0].FinishReason != nil {
			finish = *c.Choices[0].FinishReason
		}
	}
	if content.String() != "Sure. " || len(names) != 1 || names[0] != "get_weather" || args.String() != `{"city":"Oslo"}` || finish != "tool_calls" {
		t.Errorf("streamed content %q, names %v, arguments %q, finish %q", content.String(), names, args.String(), finish)
	}
}

// A template that fails to render falls back to llama.cpp's template
// matcher (the engine's ChatPrompt), with the tools described in a system
// message; so does a model without a template.
func TestChatTemplateFallbacks(t *testing.T) {
	for _, tmpl := range []string{"", "{{ raise_exception('this template takes no tools') }}", "{% if %}"} {
		eng := newFakeEngine("ok")
		eng.info.ChatTemplate, eng.info.CtxSize = tmpl, 4096
		eng.started = make(chan engine.Request, 1)
		r := startWorker(t, testConfig(t), eng)
		var got openai.ChatCompletion
		if status, _ := r.postJSON(t, "/v1/chat/completions", `{"messages":[{"role":"user","content":"u"}],"tools":`+weatherTool+`}`, &got); status != http.StatusOK {
			t.Fatalf("template %q: status %d", tmpl, status)
		}
		prompt := string(bytesOf((<-eng.started).Prompt[1:]))
		if !strings.HasPrefix(prompt, "system: # Tools\n") || !strings.Contains(prompt, `"name":"get_weather"`) || !strings.HasSuffix(prompt, "user: u\nassistant:") {
			t.Errorf("template %q: prompt %q, want the fallback with the tools in a system message", tmpl, prompt)
		}
		if got.Choices[0].Message.Content != "ok" || got.Choices[0].FinishReason != "stop" {
			t.Errorf("template %q: answer %+v", tmpl, got.Choices[0])
		}
	}
}

// streamedChat reads a streamed chat answer: its content, its calls (name
// and arguments, by index) and its finish reason.
func streamedChat(t *testing.T, r *running, body string) (string, []openai.FunctionCall, string) {
	t.Helper()
	res := r.post(t, t.Context(), "/v1/chat/completions", body)
	defer res.Body.Close()
	s := newSSEReader(t, res.Body)
	var content strings.Builder
	var calls []openai.FunctionCall
	finish := ""
	for ev := s.next(); ev != "[DONE]"; ev = s.next() {
		var c openai.ChatCompletionChunk
		if err := json.Unmarshal([]byte(ev), &c); err != nil {
			t.Fatal(err)
		}
		if len(c.Choices) == 0 {
			continue
		}
		d := c.Choices[0].Delta
		if d.Content != nil {
			content.WriteString(*d.Content)
		}
		for _, tc := range d.ToolCalls {
			if *tc.Index == len(calls) {
				calls = append(calls, openai.FunctionCall{})
			}
			calls[*tc.Index].Name += tc.Function.Name
			calls[*tc.Index].Arguments += tc.Function.Arguments
		}
		if c.Choices[0].FinishReason != nil {
			finish = *c.Choices[0].FinishReason
		}
	}
	return content.String(), calls, finish
}

// A tool call cut off by max_tokens: finish_reason is length (not
// tool_calls), the finished call is there whole, the one being written as
// far as it went (its arguments unfinished JSON, as OpenAI sends such a
// call), and its markup is not content; the whole answer is what the
// stream adds up to. Cut before the second call had a name, it is no call
// at all, and still not content. (Issue #31's item 7: before, the finish
// reason was tool_calls, the unfinished markup was the whole answer's
// content, and the stream had a call the whole answer had not.)
func TestToolCallCutOffIsLength(t *testing.T) {
	script := []string{"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>\n",
		"<tool_call>\n{\"name\": \"get_", "weather\", \"argu", "ments\": {\"city\": \"Ber", "lin\"}}\n</tool_call>"}
	eng := newFakeEngine(script...)
	eng.info.ChatTemplate, eng.info.CtxSize = testmodel.ToolChatTemplate, 4096
	r := startWorker(t, testConfig(t), eng)
	for _, tc := range []struct {
		max   int
		calls []openai.FunctionCall
	}{
		{4, []openai.FunctionCall{{Name: "get_weather", Arguments: `{"city":"Oslo"}`}, {Name: "get_weather", Arguments: `{"city":"Ber`}}},
		{2, []openai.FunctionCall{{Name: "get_weather", Arguments: `{"city":"Oslo"}`}}},
	} {
		body := fmt.Sprintf(`{"messages":[{"role":"user","content":"Weather in Oslo and Berlin?"}],"max_tokens":%d,"tools":%s`, tc.max, weatherTool)
		var got openai.ChatCompletion
		if status, _ := r.postJSON(t, "/v1/chat/completions", body+`}`, &got); status != http.StatusOK {
			t.Fatalf("status %d", status)
		}
		m := got.Choices[0].Message
		var whole []openai.FunctionCall
		for _, c := range m.ToolCalls {
			whole = append(whole, c.Function)
		}
		if got.Choices[0].FinishReason != "length" || m.Content != "" || !slices.Equal(whole, tc.calls) {
			t.Errorf("max_tokens %d: finish %q, content %q, calls %+v; want length, no content, %+v", tc.max, got.Choices[0].FinishReason, m.Content, whole, tc.calls)
		}
		content, streamed, finish := streamedChat(t, r, body+`,"stream":true}`)
		if finish != "length" || strings.TrimSpace(content) != "" || !slices.Equal(streamed, tc.calls) {
			t.Errorf("max_tokens %d, streamed: finish %q, content %q, calls %+v; want length, no content, %+v", tc.max, finish, content, streamed, tc.calls)
		}
	}
}
