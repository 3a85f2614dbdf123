package responses

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/apiary-llm/apiary/internal/translate"
)

// chunk is what the translation reads of a chat completion or a chunk of
// its stream.
type chunk struct {
	Choices []struct {
		Message *struct {
			Content   *string    `json:"content"`
			ToolCalls []callPart `json:"tool_calls"`
		} `json:"message"`
		Delta struct {
			Content   string     `json:"content"`
			ToolCalls []callPart `json:"tool_calls"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokensDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
	Error *struct {
		Message string  `json:"message"`
		Code    string  `json:"code"`
		Param   *string `json:"param"`
	} `json:"error"`
}

type callPart struct {
	Index    int    `json:"index"`
	ID       string `json:"id"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

// Answer builds the response to one request from the worker's chat
// completion: Whole for a whole body, Event for each event of a stream.
type Answer struct {
	req     Request
	model   string
	id      string
	created int64
	seq     int
	started bool

	output  []map[string]any // the items, in order; the open one last
	text    *strings.Builder // the open message's text, nil when none is open
	calls   map[int]int      // a chat call's index → its output index
	args    map[int]*strings.Builder
	finish  string
	failure map[string]any // the error of a response that failed
	in, out int
	cached  int // of in, found in the worker's cache
	// Stored says the response is kept (store, and a store to keep it in).
	Stored bool
	final  []byte // the response object once it ended
}

// NewAnswer starts the response for model (the name the client sent) to
// req, arriving at now.
func NewAnswer(req Request, model string, now time.Time) *Answer {
	return &Answer{req: req, model: model, id: NewID("resp"), created: now.Unix(), calls: map[int]int{}, args: map[int]*strings.Builder{}}
}

// object is the response as it stands, with status.
func (a *Answer) object(status string) map[string]any {
	var incomplete any
	if status == "incomplete" {
		incomplete = map[string]any{"reason": "max_output_tokens"}
	}
	tools := make([]any, 0, len(a.req.Tools))
	for _, t := range a.req.Tools {
		tools = append(tools, t)
	}
	var toolChoice any = "auto"
	if len(a.req.ToolChoice) > 0 && string(a.req.ToolChoice) != "null" {
		toolChoice = json.RawMessage(a.req.ToolChoice)
	}
	text := any(map[string]any{"format": map[string]any{"type": "text"}})
	if a.req.Text != nil && a.req.Text.Format != nil {
		text = a.req.Text
	}
	metadata := a.req.Metadata
	if metadata == nil {
		metadata = map[string]any{}
	}
	var usage any
	if status == "completed" || status == "incomplete" {
		usage = map[string]any{"input_tokens": a.in, "input_tokens_details": map[string]any{"cached_tokens": a.cached},
			"output_tokens": a.out, "output_tokens_details": map[string]any{"reasoning_tokens": 0}, "total_tokens": a.in + a.out}
	}
	output := a.output
	if output == nil {
		output = []map[string]any{}
	}
	var failure any
	if status == "failed" {
		failure = a.failure
	}
	return map[string]any{"id": a.id, "object": "response", "created_at": a.created, "status": status, "error": failure,
		"incomplete_details": incomplete, "instructions": a.req.Instructions, "max_output_tokens": a.req.MaxOutputTokens,
		"model": a.model, "output": output, "parallel_tool_calls": a.req.ParallelToolCalls == nil || *a.req.ParallelToolCalls,
		"previous_response_id": a.req.PreviousResponseID, "reasoning": map[string]any{"effort": nil, "summary": nil}, "store": a.Stored,
		"temperature": a.req.Temperature, "text": text, "tool_choice": toolChoice, "tools": tools, "top_p": a.req.TopP,
		"truncation": "disabled", "usage": usage, "user": nilIfEmpty(a.req.User), "metadata": metadata}
}

func nilIfEmpty(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// event frames one stream event.
func (a *Answer) event(typ string, fields map[string]any) []byte {
	fields["type"] = typ
	fields["sequence_number"] = a.seq
	a.seq++
	b, _ := json.Marshal(fields)
	return []byte("event: " + typ + "\ndata: " + string(b) + "\n\n")
}

func messageItem(id, status, text string, done bool) map[string]any {
	content := []map[string]any{}
	if done {
		content = append(content, map[string]any{"type": "output_text", "text": text, "annotations": []any{}, "logprobs": []any{}})
	}
	return map[string]any{"type": "message", "id": id, "status": status, "role": "assistant", "content": content}
}

// closeText ends the open message, if any, with status (completed, or
// incomplete when the length bound cut it).
func (a *Answer) closeText(status string) [][]byte {
	if a.text == nil {
		return nil
	}
	i := len(a.output) - 1
	id := a.output[i]["id"].(string)
	text := a.text.String()
	a.text = nil
	a.output[i] = messageItem(id, status, text, true)
	part := map[string]any{"type": "output_text", "text": text, "annotations": []any{}, "logprobs": []any{}}
	return [][]byte{
		a.event("response.output_text.done", map[string]any{"item_id": id, "output_index": i, "content_index": 0, "text": text, "logprobs": []any{}}),
		a.event("response.content_part.done", map[string]any{"item_id": id, "output_index": i, "content_index": 0, "part": part}),
		a.event("response.output_item.done", map[string]any{"output_index": i, "item": a.output[i]}),
	}
}

// status is how the response ended: incomplete when the worker stopped
// at the length bound.
func (a *Answer) status() string {
	if a.finish == "length" {
		return "incomplete"
	}
	return "completed"
}

// itemStatus is the status of output item k once the response ended:
// the last item is the one the length bound cut, and is incomplete with
// the response; the items before it ended well.
func (a *Answer) itemStatus(k int) string {
	if k == len(a.output)-1 {
		return a.status()
	}
	return "completed"
}

// fail ends the stream with response.failed: the response as it stood,
// status failed, its error code and message; items still open are
// incomplete (a message with the text it had).
func (a *Answer) fail(code, message string) []byte {
	if code == "" {
		code = "server_error"
	}
	a.failure = map[string]any{"code": code, "message": message}
	if a.text != nil {
		i := len(a.output) - 1
		a.output[i] = messageItem(a.output[i]["id"].(string), "incomplete", a.text.String(), true)
		a.text = nil
	}
	for ci, k := range a.calls {
		if it := a.output[k]; it["status"] == "in_progress" {
			a.output[k] = callItem(it["id"].(string), it["call_id"].(string), it["name"].(string), a.args[ci].String(), "incomplete")
		}
	}
	return a.event("response.failed", map[string]any{"response": a.object("failed")})
}

func callItem(id, callID, name, args, status string) map[string]any {
	return map[string]any{"type": "function_call", "id": id, "call_id": callID, "name": name, "arguments": args, "status": status}
}

// Event turns one SSE event of the worker's chat stream into the
// response's events (each framed); last is true for the one that ends
// the stream.
func (a *Answer) Event(data []byte, now time.Time) (out [][]byte, last bool, err error) {
	if len(data) == 0 {
		return nil, false, nil
	}
	if !a.started {
		a.started = true
		out = append(out, a.event("response.created", map[string]any{"response": a.object("in_progress")}),
			a.event("response.in_progress", map[string]any{"response": a.object("in_progress")}))
	}
	if string(data) == "[DONE]" {
		if a.text != nil {
			out = append(out, a.closeText(a.itemStatus(len(a.output)-1))...)
		}
		for k := range len(a.output) {
			it := a.output[k]
			if it["type"] != "function_call" || it["status"] == "completed" {
				continue
			}
			var idx int
			for ci, oi := range a.calls {
				if oi == k {
					idx = ci
				}
			}
			args := a.args[idx].String()
			a.output[k] = callItem(it["id"].(string), it["call_id"].(string), it["name"].(string), args, a.itemStatus(k))
			out = append(out, a.event("response.function_call_arguments.done", map[string]any{"item_id": it["id"], "output_index": k, "arguments": args}),
				a.event("response.output_item.done", map[string]any{"output_index": k, "item": a.output[k]}))
		}
		st := a.status()
		obj := a.object(st)
		a.final, _ = json.Marshal(obj)
		out = append(out, a.event("response."+st, map[string]any{"response": obj}))
		return out, true, nil
	}
	var c chunk
	if err := json.Unmarshal(data, &c); err != nil {
		return append(out, a.fail("", "the worker's stream sent an event that is no JSON")), true, nil
	}
	if c.Error != nil {
		return append(out, a.fail(c.Error.Code, c.Error.Message)), true, nil
	}
	if c.Usage != nil {
		a.in, a.out = c.Usage.PromptTokens, c.Usage.CompletionTokens
		if d := c.Usage.PromptTokensDetails; d != nil {
			a.cached = d.CachedTokens
		}
	}
	if len(c.Choices) == 0 {
		return out, false, nil
	}
	ch := c.Choices[0]
	if ch.FinishReason != nil {
		a.finish = *ch.FinishReason
	}
	if t := ch.Delta.Content; t != "" {
		if a.text == nil {
			a.text = &strings.Builder{}
			id := NewID("msg")
			a.output = append(a.output, messageItem(id, "in_progress", "", false))
			i := len(a.output) - 1
			out = append(out, a.event("response.output_item.added", map[string]any{"output_index": i, "item": a.output[i]}),
				a.event("response.content_part.added", map[string]any{"item_id": id, "output_index": i, "content_index": 0,
					"part": map[string]any{"type": "output_text", "text": "", "annotations": []any{}, "logprobs": []any{}}}))
		}
		a.text.WriteString(t)
		i := len(a.output) - 1
		out = append(out, a.event("response.output_text.delta", map[string]any{"item_id": a.output[i]["id"], "output_index": i,
			"content_index": 0, "delta": t, "logprobs": []any{}}))
	}
	for _, p := range ch.Delta.ToolCalls {
		k, ok := a.calls[p.Index]
		if !ok {
			out = append(out, a.closeText("completed")...)
			callID := p.ID
			if callID == "" {
				callID = NewID("call")
			}
			a.output = append(a.output, callItem(NewID("fc"), callID, p.Function.Name, "", "in_progress"))
			k = len(a.output) - 1
			a.calls[p.Index] = k
			a.args[p.Index] = &strings.Builder{}
			out = append(out, a.event("response.output_item.added", map[string]any{"output_index": k, "item": a.output[k]}))
		}
		if p.Function.Arguments != "" {
			a.args[p.Index].WriteString(p.Function.Arguments)
			out = append(out, a.event("response.function_call_arguments.delta", map[string]any{"item_id": a.output[k]["id"],
				"output_index": k, "delta": p.Function.Arguments}))
		}
	}
	return out, false, nil
}

// Whole is the response to a request that was not streamed, from the
// worker's whole chat completion.
func (a *Answer) Whole(data []byte, _ time.Time) ([]byte, error) {
	var c chunk
	if err := json.Unmarshal(data, &c); err != nil || len(c.Choices) == 0 || c.Choices[0].Message == nil {
		return nil, fmt.Errorf("the worker's answer is no chat completion")
	}
	ch := c.Choices[0]
	if ch.FinishReason != nil {
		a.finish = *ch.FinishReason
	}
	if c.Usage != nil {
		a.in, a.out = c.Usage.PromptTokens, c.Usage.CompletionTokens
		if d := c.Usage.PromptTokensDetails; d != nil {
			a.cached = d.CachedTokens
		}
	}
	text := ""
	if ch.Message.Content != nil {
		text = *ch.Message.Content
	}
	if text != "" || len(ch.Message.ToolCalls) == 0 {
		a.output = append(a.output, messageItem(NewID("msg"), "completed", text, true))
	}
	for _, p := range ch.Message.ToolCalls {
		callID := p.ID
		if callID == "" {
			callID = NewID("call")
		}
		a.output = append(a.output, callItem(NewID("fc"), callID, p.Function.Name, p.Function.Arguments, "completed"))
	}
	if k := len(a.output) - 1; a.status() == "incomplete" {
		a.output[k]["status"] = "incomplete"
	}
	b, err := json.Marshal(a.object(a.status()))
	if err == nil {
		a.final = b
	}
	return b, err
}

// Final is the response object once the answer ended well (nil before,
// or after a failure).
func (a *Answer) Final() []byte { return a.final }

// ID is the response's id.
func (a *Answer) ID() string { return a.id }

// Created is when the response was created.
func (a *Answer) Created() int64 { return a.created }

// Messages is the response's output as chat messages: one assistant
// message with its text and its calls.
func (a *Answer) Messages() []map[string]any {
	var text strings.Builder
	var calls []map[string]any
	for _, it := range a.output {
		switch it["type"] {
		case "message":
			for _, c := range it["content"].([]map[string]any) {
				text.WriteString(c["text"].(string))
			}
		case "function_call":
			calls = append(calls, map[string]any{"id": it["call_id"], "type": "function",
				"function": map[string]any{"name": it["name"], "arguments": it["arguments"]}})
		}
	}
	m := map[string]any{"role": "assistant", "content": text.String()}
	if len(calls) > 0 {
		m["tool_calls"] = calls
		if text.Len() == 0 {
			m["content"] = nil
		}
	}
	return []map[string]any{m}
}

// Dialect frames the translation for the client: the Responses API's
// typed SSE events (framed by Answer); a worker's error answer passes as
// it came (OpenAI's shape).
var Dialect = translate.Dialect{
	ContentType: "text/event-stream",
	Frame:       func(ev []byte) []byte { return ev },
	ErrorEvent: func(msg string) []byte {
		b, _ := json.Marshal(map[string]any{"type": "error", "code": "worker_failed", "message": msg, "param": nil})
		return []byte("event: error\ndata: " + string(b) + "\n\n")
	},
	HeldError: func(w http.ResponseWriter, status int, held []byte) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = w.Write(held)
	},
}
