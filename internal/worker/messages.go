package worker

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/apiary-llm/apiary/internal/anthropic"
	"github.com/apiary-llm/apiary/internal/chat"
	"github.com/apiary-llm/apiary/internal/engine"
	"github.com/apiary-llm/apiary/internal/openai"
	"github.com/apiary-llm/apiary/internal/responses"
	"github.com/apiary-llm/apiary/internal/translate"
)

// handleMessages serves Anthropic's POST /v1/messages: the same
// generation as a chat completion, in Anthropic's shapes, tools included
// (the chat completion's tools, forced calls and call parsing).
func (w *Worker) handleMessages(rw http.ResponseWriter, r *http.Request) error {
	eng, info, err := w.serving()
	if err != nil {
		return err
	}
	body, err := openai.ReadBody(rw, r, w.chatBodyLimit(info))
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
	creq := openai.ChatCompletionRequest{Messages: req.Messages, Tools: req.Tools, ToolChoice: req.ToolChoice,
		ParallelToolCalls: req.ParallelToolCalls, Sampling: req.Sampling}
	prompt, syn, err := w.chatPrompt(eng, info, creq)
	if err != nil {
		return err
	}
	j, err := newJob(eng, info, prompt, "messages", req.Sampling, openai.Images(req.Messages))
	if err != nil {
		return err
	}
	defer j.release()
	if err := forceToolCall(eng, &j, creq, syn); err != nil {
		return err
	}
	f := messagesFormat{id: anthropic.NewMessageID(), model: w.answerModel(r), promptTokens: len(j.req.Prompt), st: &messagesState{}}
	if req.ToolChoice.Mode != "" && req.ToolChoice.Mode != openai.ToolChoiceNone {
		f.syn = &syn
	}
	return w.serveGeneration(rw, r, eng, j, req.Sampling, f, "messages")
}

// messagesFormat shapes /v1/messages answers: a text block, then a
// tool_use block per call when the request has tools; the stream events
// message_start, ping, then per block content_block_start,
// content_block_delta… (text_delta, or input_json_delta for a call's
// input), content_block_stop, and message_delta, message_stop.
type messagesFormat struct {
	id           string
	model        string
	promptTokens int
	syn          *chat.Syntax // the call syntax when the answer may call tools
	st           *messagesState
}

// messagesState is a stream's progress: its call splitter, and the block
// open now.
type messagesState struct {
	split  *chat.Splitter
	open   bool // a block is open
	index  int  // the open block's index, or the next one's
	called bool
}

func event(name string, data any) openai.NamedEvent { return openai.NamedEvent{Name: name, Data: data} }

func (f messagesFormat) message(content []anthropic.ContentBlock, u anthropic.Usage) anthropic.Message {
	return anthropic.Message{ID: f.id, Type: anthropic.ObjectMessage, Role: anthropic.RoleAssistant, Model: f.model,
		Content: content, Usage: u}
}

func (f messagesFormat) first(int) any {
	start := event("message_start", anthropic.MessageStart{Type: "message_start",
		Message: f.message([]anthropic.ContentBlock{}, anthropic.Usage{InputTokens: f.promptTokens})})
	if f.syn != nil {
		// Blocks open as the answer shows what it is.
		f.st.split = chat.NewSplitter(*f.syn)
		return []any{start, event("ping", anthropic.Ping{Type: "ping"})}
	}
	f.st.open = true
	return []any{start,
		event("content_block_start", anthropic.ContentBlockStart{Type: "content_block_start",
			ContentBlock: anthropic.ContentBlock{Type: anthropic.ContentTypeText}}),
		event("ping", anthropic.Ping{Type: "ping"}),
	}
}

// closeBlock ends the open block, if one is.
func (f messagesFormat) closeBlock() []any {
	if !f.st.open {
		return nil
	}
	f.st.open = false
	f.st.index++
	return []any{event("content_block_stop", anthropic.ContentBlockStop{Type: "content_block_stop", Index: f.st.index - 1})}
}

// pieces turns what the splitter let through into events.
func (f messagesFormat) pieces(ps []chat.Piece) []any {
	var events []any
	for _, p := range ps {
		switch {
		case !p.Call:
			if p.Content == "" {
				continue
			}
			if !f.st.open {
				f.st.open = true
				events = append(events, event("content_block_start", anthropic.ContentBlockStart{Type: "content_block_start",
					Index: f.st.index, ContentBlock: anthropic.ContentBlock{Type: anthropic.ContentTypeText}}))
			}
			events = append(events, event("content_block_delta", anthropic.ContentBlockDelta{Type: "content_block_delta",
				Index: f.st.index, Delta: anthropic.TextDelta{Type: "text_delta", Text: p.Content}}))
		case p.Name != "":
			events = append(events, f.closeBlock()...)
			f.st.open, f.st.called = true, true
			events = append(events, event("content_block_start", anthropic.ContentBlockStart{Type: "content_block_start",
				Index: f.st.index, ContentBlock: anthropic.ContentBlock{Type: anthropic.ContentTypeToolUse, ID: anthropic.NewToolUseID(), Name: p.Name}}))
		default:
			events = append(events, event("content_block_delta", map[string]any{"type": "content_block_delta", "index": f.st.index,
				"delta": map[string]any{"type": "input_json_delta", "partial_json": p.Args}}))
		}
	}
	return events
}

func (f messagesFormat) delta(_ int, text string, _ []engine.Token, _ int) any {
	if text == "" {
		return nil
	}
	if f.syn != nil {
		return f.pieces(f.st.split.Feed(text))
	}
	return event("content_block_delta", anthropic.ContentBlockDelta{Type: "content_block_delta",
		Delta: anthropic.TextDelta{Type: "text_delta", Text: text}})
}

func (f messagesFormat) last(_ int, o outcome) any {
	var events []any
	if f.syn != nil {
		events = f.pieces(closeSplitter(f.st.split, o.FinishReason))
	}
	events = append(events, f.closeBlock()...)
	reason := anthropic.StopReason(o.FinishReason, o.stop)
	if f.st.called && o.FinishReason != openai.FinishLength {
		reason = anthropic.StopToolUse
	}
	return append(events,
		event("message_delta", anthropic.MessageDelta{Type: "message_delta",
			Delta: anthropic.MessageDeltaEnd{StopReason: reason, StopSequence: stopSequence(o.stop)},
			Usage: anthropic.NewUsage(o.PromptTokens, o.CachedTokens, o.CompletionTokens)}),
		event("message_stop", anthropic.MessageStop{Type: "message_stop"}),
	)
}

func (f messagesFormat) usage(*openai.Usage) any { return nil }

func (f messagesFormat) whole(choices []choice, u *openai.Usage) any {
	c := choices[0]
	reason := anthropic.StopReason(c.finish, c.stop)
	content := []anthropic.ContentBlock{{Type: anthropic.ContentTypeText, Text: c.text}}
	if f.syn != nil {
		// The whole answer is what its stream would add up to.
		sp := chat.NewSplitter(*f.syn)
		ps := append(sp.Feed(c.text), closeSplitter(sp, c.finish)...)
		if sp.Called() {
			var text strings.Builder
			var calls []anthropic.ContentBlock
			for _, p := range ps {
				switch {
				case !p.Call:
					text.WriteString(p.Content)
				case p.Name != "":
					calls = append(calls, anthropic.ContentBlock{Type: anthropic.ContentTypeToolUse, ID: anthropic.NewToolUseID(), Name: p.Name})
				default:
					calls[len(calls)-1].Input = append(calls[len(calls)-1].Input, p.Args...)
				}
			}
			content = content[:0]
			if t := strings.TrimSpace(text.String()); t != "" {
				content = append(content, anthropic.ContentBlock{Type: anthropic.ContentTypeText, Text: t})
			}
			for _, call := range calls {
				// A call cut off by max_tokens has no whole input: it is
				// left out (stop_reason max_tokens says why).
				if len(call.Input) == 0 || json.Valid(call.Input) {
					content = append(content, call)
				}
			}
			if c.finish != openai.FinishLength {
				reason = anthropic.StopToolUse
			}
		}
	}
	cached := 0
	if u.PromptTokensDetails != nil {
		cached = u.PromptTokensDetails.CachedTokens
	}
	m := f.message(content, anthropic.NewUsage(u.PromptTokens, cached, u.CompletionTokens))
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
		return fmt.Errorf("tokenize messages: %w", err)
	}
	openai.WriteJSON(rw, http.StatusOK, map[string]int{"input_tokens": len(ids)})
	return nil
}

// handleResponses serves OpenAI's POST /v1/responses as a chat completion
// (internal/responses translates both ways), as the queen does; a worker
// keeps no responses, so previous_response_id is refused.
func (w *Worker) handleResponses(rw http.ResponseWriter, r *http.Request) error {
	w.mu.Lock()
	info := w.info
	w.mu.Unlock()
	body, err := openai.ReadBody(rw, r, w.chatBodyLimit(info))
	if err != nil {
		return err
	}
	req, chatBody, err := responses.Chat(body)
	if err != nil {
		return err
	}
	cr := r.Clone(r.Context())
	cr.Body, cr.ContentLength = io.NopCloser(bytes.NewReader(chatBody)), int64(len(chatBody))
	tw := translate.New(rw, responses.NewAnswer(req, w.answerModel(r), time.Now()), responses.Dialect)
	if err := w.handleChatCompletions(tw, cr); err != nil {
		return err
	}
	return tw.Finish()
}
