package worker

import (
	"fmt"
	"net/http"

	"github.com/apiary-llm/apiary/internal/anthropic"
	"github.com/apiary-llm/apiary/internal/engine"
	"github.com/apiary-llm/apiary/internal/openai"
)

// handleMessages serves Anthropic's POST /v1/messages: the same
// generation as a chat completion, in Anthropic's shapes.
func (w *Worker) handleMessages(rw http.ResponseWriter, r *http.Request) error {
	eng, info, err := w.serving()
	if err != nil {
		return err
	}
	body, err := openai.ReadBody(rw, r, w.cfg.MaxBodyBytes)
	if err != nil {
		return err
	}
	req, err := anthropic.Decode(body)
	if err != nil {
		return err
	}
	if err := w.checkModel(req.Model); err != nil {
		return err
	}
	prompt, _, err := w.chatPrompt(eng, info, openai.ChatCompletionRequest{Messages: req.Messages})
	if err != nil {
		return err
	}
	j, err := newJob(eng, info, prompt, "messages", req.Sampling)
	if err != nil {
		return err
	}
	f := messagesFormat{id: anthropic.NewMessageID(), model: w.answerModel(r), promptTokens: len(j.req.Prompt)}
	return w.serveGeneration(rw, r, eng, j, req.Sampling, f, "messages")
}

// messagesFormat shapes /v1/messages answers: one text block, and the
// stream events message_start, content_block_start, ping,
// content_block_delta…, content_block_stop, message_delta, message_stop.
type messagesFormat struct {
	id           string
	model        string
	promptTokens int
}

func event(name string, data any) openai.NamedEvent { return openai.NamedEvent{Name: name, Data: data} }

func (f messagesFormat) message(content []anthropic.ContentBlock, u anthropic.Usage) anthropic.Message {
	return anthropic.Message{ID: f.id, Type: anthropic.ObjectMessage, Role: anthropic.RoleAssistant, Model: f.model,
		Content: content, Usage: u}
}

func (f messagesFormat) first(int) any {
	return []any{
		event("message_start", anthropic.MessageStart{Type: "message_start",
			Message: f.message([]anthropic.ContentBlock{}, anthropic.Usage{InputTokens: f.promptTokens})}),
		event("content_block_start", anthropic.ContentBlockStart{Type: "content_block_start",
			ContentBlock: anthropic.ContentBlock{Type: anthropic.ContentTypeText}}),
		event("ping", anthropic.Ping{Type: "ping"}),
	}
}

func (f messagesFormat) delta(_ int, text string, _ []engine.Token, _ int) any {
	if text == "" {
		return nil
	}
	return event("content_block_delta", anthropic.ContentBlockDelta{Type: "content_block_delta",
		Delta: anthropic.TextDelta{Type: "text_delta", Text: text}})
}

func (f messagesFormat) last(_ int, o outcome) any {
	return []any{
		event("content_block_stop", anthropic.ContentBlockStop{Type: "content_block_stop"}),
		event("message_delta", anthropic.MessageDelta{Type: "message_delta",
			Delta: anthropic.MessageDeltaEnd{StopReason: anthropic.StopReason(o.FinishReason, o.stop), StopSequence: stopSequence(o.stop)},
			Usage: anthropic.Usage{InputTokens: o.PromptTokens, OutputTokens: o.CompletionTokens}}),
		event("message_stop", anthropic.MessageStop{Type: "message_stop"}),
	}
}

func (f messagesFormat) usage(*openai.Usage) any { return nil }

func (f messagesFormat) whole(choices []choice, u *openai.Usage) any {
	c := choices[0]
	m := f.message([]anthropic.ContentBlock{{Type: anthropic.ContentTypeText, Text: c.text}},
		anthropic.Usage{InputTokens: u.PromptTokens, OutputTokens: u.CompletionTokens})
	reason := anthropic.StopReason(c.finish, c.stop)
	m.StopReason, m.StopSequence = &reason, stopSequence(c.stop)
	return m
}

func (f messagesFormat) end(*openai.SSEWriter) error { return nil } // message_stop was the end

func (f messagesFormat) fail(sse *openai.SSEWriter, err error) error {
	return sse.Event(event("error", anthropic.Body(err)))
}

func stopSequence(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// handleCountTokens serves Anthropic's POST /v1/messages/count_tokens:
// the tokens the messages' prompt is, as /v1/messages would render and
// count it.
func (w *Worker) handleCountTokens(rw http.ResponseWriter, r *http.Request) error {
	eng, info, err := w.serving()
	if err != nil {
		return err
	}
	body, err := openai.ReadBody(rw, r, w.cfg.MaxBodyBytes)
	if err != nil {
		return err
	}
	req, err := anthropic.DecodeCountTokens(body)
	if err != nil {
		return err
	}
	if err := w.checkModel(req.Model); err != nil {
		return err
	}
	prompt, _, err := w.chatPrompt(eng, info, openai.ChatCompletionRequest{Messages: req.Messages})
	if err != nil {
		return err
	}
	ids, err := eng.Tokenize(prompt, true)
	if err != nil {
		return fmt.Errorf("worker: tokenize messages: %w", err)
	}
	openai.WriteJSON(rw, http.StatusOK, map[string]int{"input_tokens": len(ids)})
	return nil
}
