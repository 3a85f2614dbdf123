package chat_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/apiary-llm/apiary/internal/chat"
	"github.com/apiary-llm/apiary/internal/testmodel"
)

// cases mirrors testdata/cases.json; testdata/render.py rendered the
// expected outputs with Python's Jinja2 set up as Hugging Face's
// apply_chat_template sets it up.
type cases struct {
	Tools []json.RawMessage `json:"tools"`
	Cases map[string]struct {
		Tools    bool `json:"tools"`
		Messages []struct {
			Role       string `json:"role"`
			Content    string `json:"content"`
			ToolCallID string `json:"tool_call_id"`
			ToolCalls  []struct {
				ID       string `json:"id"`
				Function struct {
					Name      string `json:"name"`
					Arguments string `json:"arguments"`
				} `json:"function"`
			} `json:"tool_calls"`
		} `json:"messages"`
	} `json:"cases"`
}

func loadCases(t *testing.T) cases {
	t.Helper()
	data, err := os.ReadFile("testdata/cases.json")
	if err != nil {
		t.Fatal(err)
	}
	var c cases
	if err := json.Unmarshal(data, &c); err != nil {
		t.Fatal(err)
	}
	return c
}

func toolsOf(t *testing.T, raws []json.RawMessage) []chat.Tool {
	t.Helper()
	var out []chat.Tool
	for _, raw := range raws {
		var f struct {
			Function struct {
				Name        string          `json:"name"`
				Description string          `json:"description"`
				Parameters  json.RawMessage `json:"parameters"`
			} `json:"function"`
		}
		if err := json.Unmarshal(raw, &f); err != nil {
			t.Fatal(err)
		}
		out = append(out, chat.Tool{Name: f.Function.Name, Description: f.Function.Description, Parameters: f.Function.Parameters, Raw: raw})
	}
	return out
}

// TestTemplatesRenderAsTransformersDoes renders the chat templates of
// Qwen 2.5 (Hermes tool calls), Llama 3.2 and Mistral Nemo with plain,
// multi-turn, tool and tool round-trip conversations and compares each
// byte with the rendering of the reference Jinja2.
func TestTemplatesRenderAsTransformersDoes(t *testing.T) {
	c := loadCases(t)
	tools := toolsOf(t, c.Tools)
	templates, _ := filepath.Glob("testdata/*.jinja")
	if len(templates) < 3 {
		t.Fatalf("want the templates in testdata, found %v", templates)
	}
	for _, path := range templates {
		src, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		tmpl, err := chat.Compile(string(src), "<s>", "</s>")
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		name := strings.TrimSuffix(filepath.Base(path), ".jinja")
		for cname, cs := range c.Cases {
			t.Run(name+"/"+cname, func(t *testing.T) {
				want, err := os.ReadFile(filepath.Join("testdata", name+"."+cname+".txt"))
				if err != nil {
					t.Fatal(err)
				}
				in := chat.Input{AddGenerationPrompt: true, Now: time.Date(2026, 1, 2, 15, 4, 5, 0, time.UTC)}
				if cs.Tools {
					in.Tools = tools
				}
				for _, m := range cs.Messages {
					msg := chat.Message{Role: m.Role, Content: m.Content, ToolCallID: m.ToolCallID}
					for _, tc := range m.ToolCalls {
						msg.ToolCalls = append(msg.ToolCalls, chat.ToolCall{ID: tc.ID, Name: tc.Function.Name, Arguments: tc.Function.Arguments})
					}
					in.Messages = append(in.Messages, msg)
				}
				got, err := tmpl.Render(in)
				if w, ok := strings.CutPrefix(string(want), "ERROR: "); ok {
					if err == nil || !strings.Contains(err.Error(), w) {
						t.Fatalf("want the template's error %q, got %v (rendered %q)", w, err, got)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				if diff := cmp.Diff(string(want), got); diff != "" {
					t.Errorf("rendering (-want +got):\n%s", diff)
				}
			})
		}
	}
}

// TestMistralToolCallIDsAreMappedToNineCharacters: Mistral's templates
// refuse ids that are not nine letters and digits; OpenAI-style ids are
// mapped to such ones, the call and its result to the same one.
func TestMistralToolCallIDsAreMappedToNineCharacters(t *testing.T) {
	src, err := os.ReadFile("testdata/mistral-nemo.jinja")
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err := chat.Compile(string(src), "<s>", "</s>")
	if err != nil {
		t.Fatal(err)
	}
	c := loadCases(t)
	got, err := tmpl.Render(chat.Input{Tools: toolsOf(t, c.Tools), Messages: []chat.Message{
		{Role: "user", Content: "Weather?"},
		{Role: "assistant", ToolCalls: []chat.ToolCall{{ID: "call_0123456789abcdef", Name: "get_weather", Arguments: `{"city":"Oslo"}`}}},
		{Role: "tool", ToolCallID: "call_0123456789abcdef", Content: "cold"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	i := strings.Index(got, `"id": "`)
	j := strings.Index(got, `"call_id": "`)
	if i < 0 || j < 0 {
		t.Fatalf("no ids in %q", got)
	}
	id, callID := got[i+7:i+16], got[j+12:j+21]
	if id != callID || strings.Contains(id, `"`) {
		t.Errorf("call id %q and result id %q, want the same nine characters", id, callID)
	}
}

// TestTemplateWithoutToolsGetsThemInTheSystemMessage: a template that
// knows no tools is given them (and calls and results) as text, as
// llama.cpp does.
func TestTemplateWithoutToolsGetsThemInTheSystemMessage(t *testing.T) {
	tmpl, err := chat.Compile("{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}", "", "")
	if err != nil {
		t.Fatal(err)
	}
	c := loadCases(t)
	got, err := tmpl.Render(chat.Input{Tools: toolsOf(t, c.Tools), Messages: []chat.Message{
		{Role: "user", Content: "Weather?"},
		{Role: "assistant", ToolCalls: []chat.ToolCall{{ID: "call_1", Name: "get_weather", Arguments: `{"city":"Oslo"}`}}},
		{Role: "tool", ToolCallID: "call_1", Content: "cold"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"<system># Tools", `"name":"get_weather"`, "</tools>",
		"<assistant><tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Oslo\"}}\n</tool_call></assistant>",
		"<user><tool_response>\ncold\n</tool_response></user>",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("rendering lacks %q:\n%s", want, got)
		}
	}
}

func TestSyntaxOfTemplates(t *testing.T) {
	for file, want := range map[string]chat.Syntax{"qwen2.5.jinja": chat.Hermes, "llama3.2.jinja": chat.Llama3, "mistral-nemo.jinja": chat.Mistral} {
		src, err := os.ReadFile(filepath.Join("testdata", file))
		if err != nil {
			t.Fatal(err)
		}
		if got := chat.SyntaxOf(string(src)); got != want {
			t.Errorf("%s: syntax %v, want %v", file, got, want)
		}
	}
}

// TestTestModelToolTemplateRendersTools: the generated test model's
// template lists the tools and writes calls and results in Hermes' tags.
func TestTestModelToolTemplateRendersTools(t *testing.T) {
	tmpl, err := chat.Compile(testmodel.ToolChatTemplate, "<s>", "</s>")
	if err != nil {
		t.Fatal(err)
	}
	if !tmpl.HandlesTools() || chat.SyntaxOf(tmpl.Source()) != chat.Hermes {
		t.Fatal("the test model's template should handle tools in Hermes' syntax")
	}
	c := loadCases(t)
	got, err := tmpl.Render(chat.Input{AddGenerationPrompt: true, Tools: toolsOf(t, c.Tools), Messages: []chat.Message{
		{Role: "system", Content: "Be brief."},
		{Role: "user", Content: "Weather?"},
		{Role: "assistant", ToolCalls: []chat.ToolCall{{ID: "call_1", Name: "get_weather", Arguments: `{"city":"Oslo"}`}}},
		{Role: "tool", ToolCallID: "call_1", Content: "cold"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	want := "<|im_start|>system\nBe brief.\n\n# Tools\n<tools>\n" +
		`{"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city", "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}` +
		"\n</tools>\n" +
		"Call a function as <tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" +
		"<|im_start|>user\nWeather?<|im_end|>\n" +
		"<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call><|im_end|>\n" +
		"<|im_start|>user\n<tool_response>\ncold\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("rendering (-want +got):\n%s", diff)
	}
}
