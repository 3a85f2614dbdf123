package worker

import (
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/apiary-llm/apiary/internal/chat"
	"github.com/apiary-llm/apiary/internal/engine"
	"github.com/apiary-llm/apiary/internal/openai"
)

// templates holds the model's compiled chat template.
type templates struct {
	once   sync.Once
	tmpl   *chat.Template // nil: no template, or it did not compile
	warned atomic.Bool    // a render failure was logged
}

// template returns the model's chat template, compiled once; nil when the
// model has none or it does not compile (logged once).
func (t *templates) template(info engine.ModelInfo, log *slog.Logger) *chat.Template {
	t.once.Do(func() {
		if info.ChatTemplate == "" {
			return
		}
		tmpl, err := chat.Compile(info.ChatTemplate, info.BOSText, info.EOSText)
		if err != nil {
			log.Warn("the model's chat template does not compile; chats use llama.cpp's template matcher", "err", err)
			return
		}
		t.tmpl = tmpl
	})
	return t.tmpl
}

// chatPrompt renders req's messages (and tools, unless tool_choice is
// none) with the model's own chat template, and says which tool-call
// syntax the answer is read with. When the model has no template, or it
// fails to render this conversation (logged once), the prompt comes from
// llama.cpp's template matcher (or the plain fallback) through the engine,
// with tools, calls and results written as Hermes-style text.
func (w *Worker) chatPrompt(eng engine.Engine, info engine.ModelInfo, req openai.ChatCompletionRequest) (string, chat.Syntax, error) {
	msgs := chatMessages(req.Messages)
	var tools []chat.Tool
	if req.ToolChoice.Mode != "" && req.ToolChoice.Mode != openai.ToolChoiceNone {
		tools = chatTools(req.Tools)
	}
	if tmpl := w.templates.template(info, w.log); tmpl != nil {
		prompt, err := tmpl.Render(chat.Input{Messages: msgs, Tools: tools, AddGenerationPrompt: true})
		if err == nil {
			syn := chat.Hermes
			if tmpl.HandlesTools() {
				syn = chat.SyntaxOf(tmpl.Source())
			}
			return prompt, syn, nil
		}
		if w.templates.warned.CompareAndSwap(false, true) {
			w.log.Warn("the model's chat template failed to render a conversation; such chats use llama.cpp's template matcher (logged once)", "err", err)
		}
	}
	if len(tools) > 0 || hasToolMessages(msgs) {
		msgs = chat.Polyfill(msgs, tools)
	}
	em := make([]engine.Message, len(msgs))
	for i, m := range msgs {
		em[i] = engine.Message{Role: m.Role, Content: m.Content}
	}
	prompt, err := eng.ChatPrompt(em)
	return prompt, chat.Hermes, err
}

func hasToolMessages(msgs []chat.Message) bool {
	for _, m := range msgs {
		if m.Role == openai.RoleTool || len(m.ToolCalls) > 0 {
			return true
		}
	}
	return false
}

func chatMessages(in []openai.ChatMessage) []chat.Message {
	out := make([]chat.Message, len(in))
	for i, m := range in {
		out[i] = chat.Message{Role: m.Role, Content: m.Content, ToolCallID: m.ToolCallID, Name: m.Name}
		for _, c := range m.ToolCalls {
			out[i].ToolCalls = append(out[i].ToolCalls, chat.ToolCall{ID: c.ID, Name: c.Function.Name, Arguments: c.Function.Arguments})
		}
		if m.Role == openai.RoleTool && m.Name == "" {
			out[i].Name = callName(in[:i], m.ToolCallID)
		}
	}
	return out
}

// callName is the function of the call id among msgs, or "".
func callName(msgs []openai.ChatMessage, id string) string {
	for _, m := range msgs {
		for _, c := range m.ToolCalls {
			if c.ID == id {
				return c.Function.Name
			}
		}
	}
	return ""
}

func chatTools(in []openai.Tool) []chat.Tool {
	out := make([]chat.Tool, len(in))
	for i, t := range in {
		out[i] = chat.Tool{Name: t.Function.Name, Description: t.Function.Description, Parameters: t.Function.Parameters, Raw: t.Raw}
	}
	return out
}
