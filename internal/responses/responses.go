// Package responses speaks OpenAI's Responses API (POST /v1/responses) in
// terms of the chat completions the workers serve, as internal/ollama does
// for Ollama's API: a request becomes a chat completion request, and the
// worker's answer — a whole body, or a stream of chunks — becomes a
// response object, or the Responses API's stream of typed events.
//
// The queen keeps answers (store) and continues a conversation from one
// (previous_response_id) with Build's prior messages and Answer.Messages.
// Not served: built-in tools (web search, file search, …), images and
// files in input, reasoning items, background responses.
package responses

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/apiary-llm/apiary/internal/openai"
)

// ErrBadRequest marks a request this package refuses; the error is an
// *openai.Error, a 400 whose message says why and whose Param names the
// field.
var ErrBadRequest = errors.New("invalid request")

// Refuse is the 400 refusing field param, with why.
func Refuse(param, format string, args ...any) error {
	return &openai.Error{Status: http.StatusBadRequest, Code: openai.CodeInvalidValue, Param: param,
		Message: fmt.Sprintf(format, args...), Err: errors.Join(openai.ErrInvalidRequest, ErrBadRequest)}
}

func bad(param, format string, args ...any) error { return Refuse(param, format, args...) }

// Request is what the translation reads of a POST /v1/responses body.
type Request struct {
	Model              string          `json:"model"`
	Input              json.RawMessage `json:"input"`
	Instructions       *string         `json:"instructions"`
	Tools              []Tool          `json:"tools"`
	ToolChoice         json.RawMessage `json:"tool_choice"`
	ParallelToolCalls  *bool           `json:"parallel_tool_calls"`
	Text               *TextConfig     `json:"text"`
	MaxOutputTokens    *int            `json:"max_output_tokens"`
	Temperature        *float64        `json:"temperature"`
	TopP               *float64        `json:"top_p"`
	Stream             bool            `json:"stream"`
	Store              *bool           `json:"store"`
	PreviousResponseID *string         `json:"previous_response_id"`
	Metadata           map[string]any  `json:"metadata"`
	User               string          `json:"user"`
	Truncation         string          `json:"truncation"`
	Reasoning          json.RawMessage `json:"reasoning"`
	Include            []string        `json:"include"`
	Background         bool            `json:"background"`
	ServiceTier        string          `json:"service_tier"`
	StreamOptions      json.RawMessage `json:"stream_options"`
	PromptCacheKey     string          `json:"prompt_cache_key"`
	SafetyIdentifier   string          `json:"safety_identifier"`
	TopLogprobs        *int            `json:"top_logprobs"`
	MaxToolCalls       *int            `json:"max_tool_calls"`
	// Conversation and Prompt name things kept at OpenAI (a conversation,
	// a prompt template); refused unless null.
	Conversation json.RawMessage `json:"conversation"`
	Prompt       json.RawMessage `json:"prompt"`
}

// Tool is a tools entry; only functions are served.
type Tool struct {
	Type        string          `json:"type"`
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters,omitempty"`
	Strict      *bool           `json:"strict,omitempty"`
}

// TextConfig is the request's text: its format.
type TextConfig struct {
	Format    *Format `json:"format,omitempty"`
	Verbosity string  `json:"verbosity,omitempty"`
}

// Format is text.format: text, json_object, or json_schema with its schema.
type Format struct {
	Type        string          `json:"type"`
	Name        string          `json:"name,omitempty"`
	Description string          `json:"description,omitempty"`
	Schema      json.RawMessage `json:"schema,omitempty"`
	Strict      *bool           `json:"strict,omitempty"`
}

// item is an input item: a message (with or without "type": "message"),
// a function call, or a call's output.
type item struct {
	Type      string          `json:"type"`
	Role      string          `json:"role"`
	Content   json.RawMessage `json:"content"`
	CallID    string          `json:"call_id"`
	Name      string          `json:"name"`
	Arguments string          `json:"arguments"`
	Output    json.RawMessage `json:"output"`
	ID        string          `json:"id"`
	Status    string          `json:"status"`
}

// Parse reads a POST /v1/responses body. Fields it does not know are
// ignored, at every level; a known field of the wrong type is refused.
func Parse(data []byte) (Request, error) {
	var req Request
	if err := json.Unmarshal(data, &req); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return req, bad(te.Field, "%s must be %s, not a JSON %s", te.Field, jsonKind(te.Type.Kind().String()), te.Value)
		}
		return req, bad("", "the body is not a valid request: %s", strings.TrimPrefix(err.Error(), "json: "))
	}
	return req, nil
}

// jsonKind names a Go kind as the JSON a client sends.
func jsonKind(kind string) string {
	switch kind {
	case "string":
		return "a string"
	case "bool":
		return "true or false"
	case "int", "int64", "float64":
		return "a number"
	case "slice":
		return "a list"
	case "map", "struct":
		return "an object"
	}
	return "another type"
}

// isNull says raw is absent or JSON null.
func isNull(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || string(raw) == "null"
}

// reasoningAsked says reasoning asks for an effort or a summary (an
// effort of "none" asks for nothing).
func reasoningAsked(raw json.RawMessage) bool {
	if isNull(raw) {
		return false
	}
	var r struct {
		Effort  *string         `json:"effort"`
		Summary json.RawMessage `json:"summary"`
	}
	if json.Unmarshal(raw, &r) != nil {
		return true
	}
	return (r.Effort != nil && *r.Effort != "none") || !isNull(r.Summary)
}

// Chat turns a POST /v1/responses body into a /v1/chat/completions body;
// previous_response_id is refused (nothing is stored).
func Chat(data []byte) (Request, []byte, error) {
	req, err := Parse(data)
	if err != nil {
		return req, nil, err
	}
	if req.PreviousResponseID != nil {
		return req, nil, bad("previous_response_id", "stored responses are not served: send the conversation in input")
	}
	body, _, err := Build(req, nil)
	return req, body, err
}

// Build turns req into a /v1/chat/completions body, the conversation of
// the response it answers (prior, the messages of the previous
// response's conversation, then req's input) coming first; conversation
// is those messages without the instructions (which a later response
// does not inherit), for keeping.
func Build(req Request, prior []map[string]any) (body []byte, conversation []map[string]any, err error) {
	switch {
	case req.Background:
		return nil, nil, bad("background", "background responses are not served")
	case reasoningAsked(req.Reasoning):
		return nil, nil, bad("reasoning", "reasoning effort and summaries are not served: the workers' models answer without them")
	case !isNull(req.Conversation):
		return nil, nil, bad("conversation", "conversations are not kept here: send the conversation in input, or continue from previous_response_id")
	case !isNull(req.Prompt):
		return nil, nil, bad("prompt", "prompt templates are not served: send instructions and input")
	case req.TopLogprobs != nil && *req.TopLogprobs > 0:
		return nil, nil, bad("top_logprobs", "top_logprobs is not served on /v1/responses; use /v1/chat/completions")
	}
	var msgs []map[string]any
	if req.Instructions != nil && *req.Instructions != "" {
		msgs = append(msgs, map[string]any{"role": "system", "content": *req.Instructions})
	}
	in, err := input(req.Input)
	if err != nil {
		return nil, nil, err
	}
	if len(in) == 0 && len(prior) == 0 {
		return nil, nil, bad("input", "input is required")
	}
	conversation = append(append([]map[string]any{}, prior...), in...)
	msgs = append(msgs, conversation...)
	fields := map[string]any{"model": req.Model, "messages": msgs, "stream": req.Stream}
	if req.Stream {
		fields["stream_options"] = map[string]any{"include_usage": true}
	}
	if len(req.Tools) > 0 {
		tools := make([]map[string]any, len(req.Tools))
		for i, t := range req.Tools {
			if t.Type != "function" {
				return nil, nil, bad(fmt.Sprintf("tools[%d].type", i), "tool type %q is not served; only function tools are", t.Type)
			}
			fn := map[string]any{"name": t.Name}
			if t.Description != "" {
				fn["description"] = t.Description
			}
			if len(t.Parameters) > 0 {
				fn["parameters"] = t.Parameters
			}
			if t.Strict != nil {
				fn["strict"] = *t.Strict
			}
			tools[i] = map[string]any{"type": "function", "function": fn}
		}
		fields["tools"] = tools
	}
	forced := false // the answer is a call: tool_choice forces one
	if tc := bytes.TrimSpace(req.ToolChoice); len(tc) > 0 && string(tc) != "null" {
		var mode string
		var named struct{ Type, Name string }
		switch {
		case json.Unmarshal(tc, &mode) == nil:
			fields["tool_choice"] = mode
			forced = mode == "required" && len(req.Tools) > 0
		case json.Unmarshal(tc, &named) == nil && named.Type == "function" && named.Name != "":
			fields["tool_choice"] = map[string]any{"type": "function", "function": map[string]any{"name": named.Name}}
			forced = true
		default:
			return nil, nil, bad("tool_choice", `tool_choice must be "none", "auto", "required" or {"type": "function", "name": …}`)
		}
	}
	if req.ParallelToolCalls != nil {
		fields["parallel_tool_calls"] = *req.ParallelToolCalls
	}
	if req.Text != nil && req.Text.Format != nil {
		// A forced call is constrained by its tool's parameters; the format
		// constrains text, which such an answer has none of, so it is not
		// sent (a later request, once the call's output is back and no
		// call is forced, answers in the format). OpenAI takes both.
		f := req.Text.Format
		structured := f.Type == "json_object" || f.Type == "json_schema"
		if f.Type != "text" && !(structured && forced) {
			if err := addFormat(fields, f); err != nil {
				return nil, nil, err
			}
		}
	}
	if req.MaxOutputTokens != nil {
		fields["max_tokens"] = *req.MaxOutputTokens
	}
	if req.Temperature != nil {
		fields["temperature"] = *req.Temperature
	}
	if req.TopP != nil {
		fields["top_p"] = *req.TopP
	}
	body, err = json.Marshal(fields)
	return body, conversation, err
}

// addFormat sets the chat body's response_format to text.format f.
func addFormat(fields map[string]any, f *Format) error {
	switch f.Type {
	case "json_object":
		fields["response_format"] = map[string]any{"type": "json_object"}
	case "json_schema":
		js := map[string]any{"name": f.Name, "schema": f.Schema}
		if f.Strict != nil {
			js["strict"] = *f.Strict
		}
		if f.Description != "" {
			js["description"] = f.Description
		}
		fields["response_format"] = map[string]any{"type": "json_schema", "json_schema": js}
	default:
		return bad("text.format.type", "text.format.type %q: want text, json_object or json_schema", f.Type)
	}
	return nil
}

// input turns input (a string, or a list of items) into chat messages.
func input(raw json.RawMessage) ([]map[string]any, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return []map[string]any{{"role": "user", "content": s}}, nil
	}
	var items []item
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, bad("input", "input must be a string or a list of items")
	}
	var msgs []map[string]any
	for i, it := range items {
		p := fmt.Sprintf("input[%d]", i)
		switch it.Type {
		case "", "message":
			role := it.Role
			switch role {
			case "developer":
				role = "system"
			case "system", "user", "assistant":
			default:
				return nil, bad(p+".role", "role %q: want user, assistant, system or developer", it.Role)
			}
			content, err := messageContent(it.Content, p, role)
			if err != nil {
				return nil, err
			}
			msgs = append(msgs, map[string]any{"role": role, "content": content})
		case "function_call":
			if it.CallID == "" || it.Name == "" {
				return nil, bad(p, "a function_call item needs call_id and name")
			}
			call := map[string]any{"id": it.CallID, "type": "function", "function": map[string]any{"name": it.Name, "arguments": it.Arguments}}
			// Calls in a row are one assistant message, as the model made them.
			if n := len(msgs); n > 0 && msgs[n-1]["role"] == "assistant" && msgs[n-1]["tool_calls"] != nil {
				msgs[n-1]["tool_calls"] = append(msgs[n-1]["tool_calls"].([]map[string]any), call)
			} else {
				msgs = append(msgs, map[string]any{"role": "assistant", "content": nil, "tool_calls": []map[string]any{call}})
			}
		case "function_call_output":
			if it.CallID == "" {
				return nil, bad(p, "a function_call_output item needs call_id")
			}
			out, err := contentText(it.Output, p+".output")
			if err != nil {
				return nil, err
			}
			msgs = append(msgs, map[string]any{"role": "tool", "tool_call_id": it.CallID, "content": out})
		case "reasoning":
			// Reasoning another model made is not the workers' to read.
		default:
			return nil, bad(p+".type", "item type %q is not served (message, function_call and function_call_output are)", it.Type)
		}
	}
	return msgs, nil
}

// messageContent is a message's content for the chat body: its text, or
// for a user message with input_image parts, OpenAI content parts (text,
// and image_url with the image's URL: the workers read data URIs).
func messageContent(raw json.RawMessage, param, role string) (any, error) {
	var parts []contentPart
	if json.Unmarshal(raw, &parts) != nil || !slices.ContainsFunc(parts, func(p contentPart) bool { return p.Type == "input_image" }) {
		return contentText(raw, param)
	}
	if role != "user" {
		return nil, bad(param+".role", "images are read in user messages only")
	}
	out := make([]map[string]any, 0, len(parts))
	for k, part := range parts {
		pp := fmt.Sprintf("%s.content[%d]", param, k)
		switch part.Type {
		case "input_text", "text":
			out = append(out, map[string]any{"type": "text", "text": part.Text})
		case "input_image":
			if part.ImageURL == "" {
				return nil, bad(pp+".image_url", "an input_image needs image_url, a data URI (data:image/png;base64,…); file_id is not served")
			}
			out = append(out, map[string]any{"type": "image_url", "image_url": map[string]any{"url": part.ImageURL}})
		default:
			return nil, bad(pp+".type", "content part %q is not served: the workers take text and images", part.Type)
		}
	}
	return out, nil
}

// contentPart is one part of an input message's content.
type contentPart struct {
	Type     string `json:"type"`
	Text     string `json:"text"`
	ImageURL string `json:"image_url"`
}

// contentText is a message's content: a string, or parts of text.
func contentText(raw json.RawMessage, param string) (string, error) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", bad(param, "content must be a string or a list of parts")
	}
	var b strings.Builder
	for k, part := range parts {
		switch part.Type {
		case "input_text", "output_text", "text":
			b.WriteString(part.Text)
		default:
			return "", bad(fmt.Sprintf("%s.content[%d].type", param, k), "content part %q is not served: the workers take text", part.Type)
		}
	}
	return b.String(), nil
}

// NewID is an id with prefix (resp, msg, fc).
func NewID(prefix string) string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return prefix + "_" + hex.EncodeToString(b)
}
