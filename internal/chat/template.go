// Package chat turns chat messages into a model's prompt and the model's
// answer back into messages: it renders the model's own Jinja chat template
// (tokenizer.chat_template) with messages, tools, tool calls and tool
// results, knows the tool-call syntaxes of the common model families
// (Hermes/Qwen, Llama 3.x, Mistral), builds the grammar that forces a call
// in a family's syntax, and finds the calls in generated text, whole or as
// it streams.
package chat

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ardanlabs/jinja"
)

// ErrTemplate means a chat template could not be compiled or rendered.
var ErrTemplate = errors.New("template failed")

// Message is one chat message.
type Message struct {
	Role    string // system, user, assistant or tool
	Content string
	// ToolCalls are an assistant message's calls.
	ToolCalls []ToolCall
	// ToolCallID is the call a tool message answers; Name its function,
	// when known.
	ToolCallID string
	Name       string
}

// ToolCall is one function call.
type ToolCall struct {
	ID        string
	Name      string
	Arguments string // JSON text, normally an object
}

// Tool is one function the model may call.
type Tool struct {
	Name        string
	Description string
	// Parameters is the JSON schema of the arguments; nil for none.
	Parameters json.RawMessage
	// Raw is the tool as the client sent it ({"type":"function",
	// "function":{…}}), what templates are given.
	Raw json.RawMessage
}

// Template is a compiled chat template. It is safe for concurrent use.
type Template struct {
	tmpl     *jinja.Template
	src      string
	bos, eos string
}

// Compile compiles a chat template; bos and eos are the model's
// bos_token and eos_token texts, which templates write.
func Compile(src, bos, eos string) (*Template, error) {
	t, err := jinja.Compile(withOwnFilters(src))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrTemplate, err)
	}
	return &Template{tmpl: t, src: src, bos: bos, eos: eos}, nil
}

// Source is the template's text.
func (t *Template) Source() string { return t.src }

// HandlesTools reports whether the template renders tools, tool calls and
// tool results itself. Otherwise Render describes the tools in the system
// message and writes calls and results as text (see Polyfill).
func (t *Template) HandlesTools() bool {
	return strings.Contains(t.src, "tools") && strings.Contains(t.src, "tool_calls")
}

// Input is what a template renders.
type Input struct {
	Messages []Message
	// Tools the model may call; none when nil.
	Tools []Tool
	// AddGenerationPrompt ends the prompt where the assistant's answer
	// begins.
	AddGenerationPrompt bool
	// Now is the time strftime_now tells templates (Llama 3.x writes the
	// date); the zero time means time.Now().
	Now time.Time
	// Vars are more variables for the template, such as Llama 3.x's
	// tools_in_user_message (llama.cpp's server sets it false).
	Vars map[string]bool
}

// Render renders in with the template, the way Hugging Face's
// apply_chat_template does: messages as {role, content, tool_calls:
// [{id, type, function: {name, arguments}}], tool_call_id, name}, the
// arguments an object when they are JSON; tools as sent; bos_token,
// eos_token, add_generation_prompt, raise_exception, strftime_now.
// Syntax rewrites tool-call ids for families that need their own shape.
func (t *Template) Render(in Input) (string, error) {
	syn := SyntaxOf(t.src)
	msgs := in.Messages
	if !t.HandlesTools() && (len(in.Tools) > 0 || hasToolMessages(msgs)) {
		msgs = Polyfill(msgs, in.Tools)
	}
	data := map[string]jinja.Value{
		"bos_token":             jinja.NewString(t.bos),
		"eos_token":             jinja.NewString(t.eos),
		"add_generation_prompt": jinja.NewBool(in.AddGenerationPrompt),
		"strftime_now":          jinja.NewCallable("strftime_now", strftimeNow(in.Now)),
		tojsonFilter:            jinja.NewCallable(tojsonFilter, pyJSON),
	}
	for k, v := range in.Vars {
		data[k] = jinja.NewBool(v)
	}
	list := make([]jinja.Value, len(msgs))
	for i, m := range msgs {
		v, err := messageValue(m, syn)
		if err != nil {
			return "", fmt.Errorf("%w: messages[%d]: %w", ErrTemplate, i, err)
		}
		list[i] = v
	}
	data["messages"] = jinja.NewList(list)
	if len(in.Tools) > 0 && t.HandlesTools() {
		tools := make([]jinja.Value, len(in.Tools))
		for i, tl := range in.Tools {
			v, err := jsonValue(tl.Raw)
			if err != nil {
				return "", fmt.Errorf("%w: tools[%d]: %w", ErrTemplate, i, err)
			}
			tools[i] = v
		}
		data["tools"] = jinja.NewList(tools)
	}
	out, err := t.tmpl.RenderValues(data)
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrTemplate, err)
	}
	return out, nil
}

// messageValue is m as templates see it.
func messageValue(m Message, syn Syntax) (jinja.Value, error) {
	v := dict("role", m.Role, "content", m.Content)
	d := v.AsDict()
	if len(m.ToolCalls) > 0 {
		calls := make([]jinja.Value, len(m.ToolCalls))
		for i, c := range m.ToolCalls {
			args, err := jsonValue([]byte(c.Arguments))
			if err != nil {
				args = jinja.NewString(c.Arguments) // not JSON: the text as it is
			}
			calls[i] = dict("id", syn.callID(c.ID), "type", "function",
				"function", dict("name", c.Name, "arguments", args))
		}
		d.Set("tool_calls", jinja.NewList(calls))
	}
	if m.Role == "tool" {
		d.Set("tool_call_id", jinja.NewString(syn.callID(m.ToolCallID)))
		if m.Name != "" {
			d.Set("name", jinja.NewString(m.Name))
		}
	}
	return v, nil
}

func hasToolMessages(msgs []Message) bool {
	for _, m := range msgs {
		if m.Role == "tool" || len(m.ToolCalls) > 0 {
			return true
		}
	}
	return false
}

// Polyfill rewrites msgs for a template that knows nothing of tools, as
// llama.cpp does for such templates: the tools and the Hermes call syntax
// are described in the system message (one is added when there is none),
// an assistant's calls become <tool_call> text in its content, and a tool
// result becomes a user message in <tool_response> tags.
func Polyfill(msgs []Message, tools []Tool) []Message {
	out := make([]Message, 0, len(msgs)+1)
	if len(tools) > 0 {
		text := toolsText(tools)
		if len(msgs) > 0 && msgs[0].Role == "system" {
			out = append(out, Message{Role: "system", Content: msgs[0].Content + "\n\n" + text})
			msgs = msgs[1:]
		} else {
			out = append(out, Message{Role: "system", Content: text})
		}
	}
	for _, m := range msgs {
		switch {
		case m.Role == "assistant" && len(m.ToolCalls) > 0:
			text := m.Content
			for _, c := range m.ToolCalls {
				if text != "" {
					text += "\n"
				}
				text += Hermes.Format(c)
			}
			out = append(out, Message{Role: "assistant", Content: text})
		case m.Role == "tool":
			out = append(out, Message{Role: "user", Content: "<tool_response>\n" + m.Content + "\n</tool_response>"})
		default:
			out = append(out, m)
		}
	}
	return out
}

// toolsText describes tools and the Hermes call syntax, as Qwen 2.5's
// template does.
func toolsText(tools []Tool) string {
	var b strings.Builder
	b.WriteString("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n")
	b.WriteString("You are provided with function signatures within <tools></tools> XML tags:\n<tools>")
	for _, t := range tools {
		b.WriteString("\n")
		b.Write(compactJSON(t.Raw))
	}
	b.WriteString("\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n")
	b.WriteString("<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>")
	return b.String()
}

func compactJSON(raw []byte) []byte {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	var v json.RawMessage = raw
	if err := enc.Encode(v); err != nil {
		return raw
	}
	return []byte(strings.TrimSuffix(b.String(), "\n"))
}

// strftimeNow is Python's datetime.now().strftime for the directives
// chat templates use; others are written as they are.
func strftimeNow(now time.Time) func([]jinja.Value, map[string]jinja.Value) (jinja.Value, error) {
	return func(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
		if len(args) != 1 || !args[0].IsString() {
			return jinja.Undefined(), errors.New("strftime_now takes one format string")
		}
		t := now
		if t.IsZero() {
			t = time.Now()
		}
		layout := map[byte]string{'d': "02", 'b': "Jan", 'B': "January", 'm': "01", 'Y': "2006", 'y': "06",
			'H': "15", 'M': "04", 'S': "05", 'a': "Mon", 'A': "Monday", 'p': "PM", 'I': "03"}
		f := args[0].AsString()
		var b strings.Builder
		for i := 0; i < len(f); i++ {
			if f[i] == '%' && i+1 < len(f) {
				i++
				switch {
				case f[i] == '%':
					b.WriteByte('%')
				case f[i] == 'e':
					fmt.Fprintf(&b, "%2d", t.Day())
				case f[i] == 'j':
					fmt.Fprintf(&b, "%03d", t.YearDay())
				case layout[f[i]] != "":
					b.WriteString(t.Format(layout[f[i]]))
				default:
					b.WriteByte('%')
					b.WriteByte(f[i])
				}
				continue
			}
			b.WriteByte(f[i])
		}
		return jinja.NewString(b.String()), nil
	}
}
