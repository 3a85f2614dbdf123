package responses

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/openai"
)

// Input items become chat messages: developer is system, calls in a row
// one assistant message, an output the tool message of its call_id;
// tools, tool_choice and max_output_tokens map to their chat fields
// (text.format too, but not beside a forced call: TestForcedCallWithFormat);
// what is not served is refused naming the field.
func TestChatTranslates(t *testing.T) {
	req, body, err := Chat([]byte(`{"model":"tiny","instructions":"Be brief.","input":[
		{"role":"developer","content":"Answer in French."},
		{"type":"message","role":"user","content":[{"type":"input_text","text":"Weather "},{"type":"input_text","text":"in Oslo?"}]},
		{"type":"function_call","call_id":"c1","name":"get_weather","arguments":"{\"city\":\"Oslo\"}"},
		{"type":"function_call","call_id":"c2","name":"get_time","arguments":"{}"},
		{"type":"function_call_output","call_id":"c1","output":"rain"}],
		"tools":[{"type":"function","name":"get_weather","parameters":{"type":"object"},"strict":true}],
		"tool_choice":{"type":"function","name":"get_weather"},"text":{"format":{"type":"json_schema","name":"x","schema":{"type":"object"}}},
		"max_output_tokens":9,"temperature":0.5,"stream":true,"store":true,"metadata":{"k":"v"}}`))
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		Messages []struct {
			Role       string
			Content    *string
			ToolCalls  []struct{ ID string } `json:"tool_calls"`
			ToolCallID string                `json:"tool_call_id"`
		}
		Tools      []struct{ Function struct{ Name string } }
		ToolChoice struct{ Function struct{ Name string } } `json:"tool_choice"`
		Format     struct{ Type string }                    `json:"response_format"`
		MaxTokens  int                                      `json:"max_tokens"`
		Stream     bool
		Options    *struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
	}
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatal(err)
	}
	roles := []string{}
	for _, msg := range m.Messages {
		roles = append(roles, msg.Role)
	}
	if strings.Join(roles, ",") != "system,system,user,assistant,tool" || *m.Messages[2].Content != "Weather in Oslo?" ||
		len(m.Messages[3].ToolCalls) != 2 || m.Messages[3].Content != nil || m.Messages[4].ToolCallID != "c1" {
		t.Errorf("messages %+v", m.Messages)
	}
	if m.Tools[0].Function.Name != "get_weather" || m.ToolChoice.Function.Name != "get_weather" || m.Format.Type != "" ||
		m.MaxTokens != 9 || !m.Stream || m.Options == nil || !m.Options.IncludeUsage || req.Metadata["k"] != "v" {
		t.Errorf("body %s", body)
	}
	for in, param := range map[string]string{
		`{"model":"m","input":"x","previous_response_id":"resp_1"}`:                                                                      "previous_response_id",
		`{"model":"m","input":"x","tools":[{"type":"web_search"}]}`:                                                                      "tools[0].type",
		`{"model":"m","input":[{"role":"user","content":[{"type":"input_image"}]}]}`:                                                     "input[0].content[0].image_url",
		`{"model":"m","input":[{"role":"assistant","content":[{"type":"input_image","image_url":"data:image/png;base64,aGk="}]}]}`:       "input[0].role",
		`{"model":"m","input":[{"role":"user","content":[{"type":"input_file","file_id":"f"},{"type":"input_image","image_url":"x"}]}]}`: "input[0].content[0].type",
		`{"model":"m","input":[{"role":"robot","content":"x"}]}`:                                                                         "input[0].role",
		`{"model":"m","input":"x","text":{"format":{"type":"yaml"}}}`:                                                                    "text.format.type",
		`{"model":"m","input":"x","tool_choice":{"type":"file_search"}}`:                                                                 "tool_choice",
		`{"model":"m"}`: "input",
		`{"model":"m","input":[{"type":"function_call_output","output":"x"}]}`: "input[0]",
	} {
		if _, _, err := Chat([]byte(in)); !errors.Is(err, ErrBadRequest) || openai.AsError(err).Param != param || openai.AsError(err).Status != 400 {
			t.Errorf("%s: %v, want a refusal of %s", in, err, param)
		}
	}
}

// A chat stream with text then a call in pieces becomes the documented
// event sequence, sequence numbers in order, and the final response
// holds both items; a whole answer the same items.
func TestAnswerEvents(t *testing.T) {
	a := NewAnswer(Request{Model: "tiny"}, "tiny", time.Now())
	var types []string
	var final map[string]any
	seq := 0
	for _, ev := range []string{
		`{"choices":[{"delta":{"role":"assistant","content":"Hi"}}]}`,
		`{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"call_1","function":{"name":"f","arguments":"{\"a\""}}]}}]}`,
		`{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":":1}"}}]}}]}`,
		`{"choices":[{"delta":{},"finish_reason":"tool_calls"}]}`,
		`{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":7}}`,
		`[DONE]`,
	} {
		out, _, err := a.Event([]byte(ev), time.Now())
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range out {
			lines := strings.SplitN(string(f), "\n", 3)
			var d map[string]any
			if err := json.Unmarshal([]byte(strings.TrimPrefix(lines[1], "data: ")), &d); err != nil {
				t.Fatal(err)
			}
			if lines[0] != "event: "+d["type"].(string) || d["sequence_number"] != float64(seq) {
				t.Errorf("event %s", f)
			}
			seq++
			types = append(types, d["type"].(string))
			if d["type"] == "response.completed" {
				final = d["response"].(map[string]any)
			}
		}
	}
	want := "response.created,response.in_progress,response.output_item.added,response.content_part.added,response.output_text.delta," +
		"response.output_text.done,response.content_part.done,response.output_item.done,response.output_item.added," +
		"response.function_call_arguments.delta,response.function_call_arguments.delta,response.function_call_arguments.done," +
		"response.output_item.done,response.completed"
	if strings.Join(types, ",") != want {
		t.Errorf("events\n%s\nwant\n%s", strings.Join(types, ","), want)
	}
	out := final["output"].([]any)
	call := out[1].(map[string]any)
	if len(out) != 2 || call["arguments"] != `{"a":1}` || call["call_id"] != "call_1" || final["usage"].(map[string]any)["total_tokens"] != 12.0 {
		t.Errorf("final %v", final)
	}

	b, err := NewAnswer(Request{}, "tiny", time.Now()).Whole([]byte(`{"choices":[{"message":{"content":null,"tool_calls":[{"id":"call_2","type":"function","function":{"name":"g","arguments":"{}"}}]},"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":1,"completion_tokens":2}}`), time.Now())
	var whole struct {
		Status string
		Output []struct {
			Type   string
			CallID string `json:"call_id"`
		}
	}
	if err != nil || json.Unmarshal(b, &whole) != nil || whole.Status != "completed" || len(whole.Output) != 1 || whole.Output[0].CallID != "call_2" {
		t.Errorf("whole %s %v", b, err)
	}
}

// A user message's input_image parts become OpenAI image_url parts beside
// its text parts (the worker reads the data URI).
func TestInputImageBecomesAnImagePart(t *testing.T) {
	_, body, err := Chat([]byte(`{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"What is it?"},
		{"type":"input_image","image_url":"data:image/png;base64,aGk=","detail":"auto"}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		Messages []struct {
			Content []map[string]any
		}
	}
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatal(err)
	}
	want := []map[string]any{{"type": "text", "text": "What is it?"}, {"type": "image_url", "image_url": map[string]any{"url": "data:image/png;base64,aGk="}}}
	if len(m.Messages) != 1 || !reflect.DeepEqual(m.Messages[0].Content, want) {
		t.Errorf("body %s", body)
	}
}
