package anthropic

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strings"

	"github.com/apiary-llm/apiary/internal/openai"
)

// MaxStopSequences bounds stop_sequences.
const MaxStopSequences = openai.MaxStop

// DecodeCountTokens decodes a POST /v1/messages/count_tokens body: a
// messages body without max_tokens (and without streaming).
func DecodeCountTokens(body []byte) (Request, error) {
	var members map[string]json.RawMessage
	if json.Unmarshal(bytes.TrimSpace(body), &members) != nil || members == nil {
		return Request{}, invalid("", "the request body must be a JSON object")
	}
	if _, ok := members["max_tokens"]; !ok {
		members["max_tokens"] = json.RawMessage("1")
	}
	b, err := json.Marshal(members)
	if err != nil {
		return Request{}, err
	}
	return Decode(b)
}

// Decode decodes and validates a POST /v1/messages body. The first field
// that is wrong, or asks for something not served (server tools, images,
// documents, extended thinking), is a 400 naming it. Unknown fields are
// ignored.
func Decode(body []byte) (Request, error) {
	var req Request
	trimmed := bytes.TrimSpace(body)
	var members map[string]json.RawMessage
	if len(trimmed) == 0 || trimmed[0] != '{' || json.Unmarshal(trimmed, &members) != nil {
		return req, invalid("", "the request body must be a JSON object")
	}
	get := func(name string) (json.RawMessage, bool) {
		r, ok := members[name]
		if !ok || string(bytes.TrimSpace(r)) == "null" {
			return nil, false
		}
		return r, true
	}
	if err := decodeTools(get, &req); err != nil {
		return req, err
	}
	if r, ok := get("thinking"); ok {
		var t struct {
			Type string `json:"type"`
		}
		if json.Unmarshal(r, &t) != nil || t.Type != "disabled" {
			return req, unsupported("thinking", "thinking: extended thinking is not supported")
		}
	}
	if r, ok := get("model"); ok {
		if json.Unmarshal(r, &req.Model) != nil {
			return req, invalid("model", "model: must be a string")
		}
	}
	r, ok := get("max_tokens")
	if !ok {
		return req, invalid("max_tokens", "max_tokens: field required")
	}
	var mt float64
	if json.Unmarshal(r, &mt) != nil || mt != math.Trunc(mt) || mt < 1 || mt > openai.DefaultMaxTokensLimit {
		return req, invalid("max_tokens", "max_tokens: must be an integer between 1 and %d", openai.DefaultMaxTokensLimit)
	}
	n := int(mt)
	req.MaxTokens = &n
	if r, ok := get("system"); ok {
		text, err := decodeText("system", r)
		if err != nil {
			return req, err
		}
		req.Messages = append(req.Messages, openai.ChatMessage{Role: openai.RoleSystem, Content: text})
	}
	r, ok = get("messages")
	var items []json.RawMessage
	switch {
	case !ok:
		return req, invalid("messages", "messages: field required")
	case json.Unmarshal(r, &items) != nil:
		return req, invalid("messages", "messages: must be an array")
	case len(items) == 0:
		return req, invalid("messages", "messages: at least one message is required")
	}
	for i, item := range items {
		p := fmt.Sprintf("messages.%d", i)
		var m map[string]json.RawMessage
		if json.Unmarshal(item, &m) != nil {
			return req, invalid(p, "%s: must be an object", p)
		}
		var role string
		if json.Unmarshal(m["role"], &role) != nil || (role != "user" && role != "assistant") {
			return req, invalid(p+".role", `%s.role: must be "user" or "assistant"`, p)
		}
		c, ok := m["content"]
		if !ok {
			return req, invalid(p+".content", "%s.content: field required", p)
		}
		msgs, err := decodeMessage(p+".content", role, c)
		if err != nil {
			return req, err
		}
		req.Messages = append(req.Messages, msgs...)
	}
	if err := decodeSampling(get, &req); err != nil {
		return req, err
	}
	return req, nil
}

// decodeTools reads tools ({name, description, input_schema}; server
// tools are not served) and tool_choice ({type: auto|any|tool|none,
// name, disable_parallel_tool_use}).
func decodeTools(get func(string) (json.RawMessage, bool), req *Request) error {
	if r, ok := get("tools"); ok {
		var tools []map[string]json.RawMessage
		if json.Unmarshal(r, &tools) != nil {
			return invalid("tools", "tools: must be an array of tools")
		}
		for i, t := range tools {
			p := fmt.Sprintf("tools.%d", i)
			var typ, name, desc string
			if raw, ok := t["type"]; ok && string(raw) != "null" {
				if json.Unmarshal(raw, &typ) != nil || (typ != "custom" && typ != "") {
					return unsupported(p+".type", "%s.type: %s tools are not served (server tools); only your own tools (name, input_schema)", p, raw)
				}
			}
			if json.Unmarshal(t["name"], &name) != nil || name == "" {
				return invalid(p+".name", "%s.name: field required", p)
			}
			if raw, ok := t["description"]; ok && json.Unmarshal(raw, &desc) != nil {
				return invalid(p+".description", "%s.description: must be a string", p)
			}
			schema, ok := t["input_schema"]
			if !ok {
				return invalid(p+".input_schema", "%s.input_schema: field required", p)
			}
			var obj map[string]any
			if json.Unmarshal(schema, &obj) != nil {
				return invalid(p+".input_schema", "%s.input_schema: must be a JSON schema object", p)
			}
			fn := map[string]any{"name": name, "parameters": obj}
			if desc != "" {
				fn["description"] = desc
			}
			raw, _ := json.Marshal(map[string]any{"type": "function", "function": fn})
			req.Tools = append(req.Tools, openai.Tool{Type: "function", Raw: raw,
				Function: openai.FunctionDef{Name: name, Description: desc, Parameters: schema}})
		}
		if len(req.Tools) > 0 {
			req.ToolChoice = openai.ToolChoice{Mode: openai.ToolChoiceAuto}
		}
	}
	r, ok := get("tool_choice")
	if !ok {
		return nil
	}
	var tc struct {
		Type                   string `json:"type"`
		Name                   string `json:"name"`
		DisableParallelToolUse *bool  `json:"disable_parallel_tool_use"`
	}
	if json.Unmarshal(r, &tc) != nil {
		return invalid("tool_choice", "tool_choice: must be an object")
	}
	switch tc.Type {
	case "auto":
		req.ToolChoice = openai.ToolChoice{Mode: openai.ToolChoiceAuto}
	case "any":
		req.ToolChoice = openai.ToolChoice{Mode: openai.ToolChoiceRequired}
	case "none":
		req.ToolChoice = openai.ToolChoice{Mode: openai.ToolChoiceNone}
	case "tool":
		if !slices.ContainsFunc(req.Tools, func(t openai.Tool) bool { return t.Function.Name == tc.Name }) {
			return invalid("tool_choice.name", "tool_choice.name: %q is none of the tools", tc.Name)
		}
		req.ToolChoice = openai.ToolChoice{Mode: openai.ToolChoiceFunction, Function: tc.Name}
	default:
		return invalid("tool_choice.type", `tool_choice.type: must be "auto", "any", "tool" or "none"`)
	}
	if tc.Type != "none" && len(req.Tools) == 0 {
		return invalid("tool_choice", "tool_choice: there are no tools to choose from")
	}
	if tc.DisableParallelToolUse != nil && *tc.DisableParallelToolUse {
		no := false
		req.ParallelToolCalls = &no
	}
	return nil
}

// decodeMessage reads one message's content into chat messages: its text
// (text blocks joined with "\n"); an assistant's tool_use blocks as its
// tool calls; a user's tool_result blocks as tool messages, before the
// user's text.
func decodeMessage(param, role string, r json.RawMessage) ([]openai.ChatMessage, error) {
	var s string
	if json.Unmarshal(r, &s) == nil {
		return []openai.ChatMessage{{Role: role, Content: s}}, nil
	}
	var blocks []map[string]json.RawMessage
	if json.Unmarshal(r, &blocks) != nil {
		return nil, invalid(param, "%s: must be a string or an array of content blocks", param)
	}
	var out []openai.ChatMessage
	var texts []string
	var media []bool // texts[i] is an image's marker
	var images [][]byte
	var calls []openai.ToolCall
	for i, b := range blocks {
		p := fmt.Sprintf("%s.%d", param, i)
		var typ string
		if json.Unmarshal(b["type"], &typ) != nil {
			return nil, invalid(p+".type", "%s.type: field required", p)
		}
		switch {
		case typ == "text":
			var text string
			if json.Unmarshal(b["text"], &text) != nil {
				return nil, invalid(p+".text", "%s.text: must be a string", p)
			}
			if strings.Contains(text, openai.ImageMarker) {
				return nil, invalid(p+".text", "%s.text: holds %s, which stands for an image here; leave it out", p, openai.ImageMarker)
			}
			texts, media = append(texts, text), append(media, false)
		case typ == "image" && role == "user":
			img, err := decodeImage(p, b)
			if err != nil {
				return nil, err
			}
			images = append(images, img)
			texts, media = append(texts, openai.ImageMarker), append(media, true)
		case typ == "image":
			return nil, unsupported(p+".type", "%s.type: images are read in user messages only", p)
		case typ == "tool_use" && role == "assistant":
			var id, name string
			if json.Unmarshal(b["id"], &id) != nil || id == "" || json.Unmarshal(b["name"], &name) != nil || name == "" {
				return nil, invalid(p, "%s: a tool_use block needs id and name", p)
			}
			var input map[string]any
			if json.Unmarshal(b["input"], &input) != nil {
				return nil, invalid(p+".input", "%s.input: must be an object", p)
			}
			args, _ := json.Marshal(input)
			calls = append(calls, openai.ToolCall{ID: id, Type: "function", Function: openai.FunctionCall{Name: name, Arguments: string(args)}})
		case typ == "tool_result" && role == "user":
			var id string
			if json.Unmarshal(b["tool_use_id"], &id) != nil || id == "" {
				return nil, invalid(p+".tool_use_id", "%s.tool_use_id: field required", p)
			}
			content := ""
			if c, ok := b["content"]; ok && string(c) != "null" {
				text, err := decodeText(p+".content", c)
				if err != nil {
					return nil, err
				}
				content = text
			}
			var isError bool
			if raw, ok := b["is_error"]; ok && json.Unmarshal(raw, &isError) == nil && isError {
				content = "Error: " + content
			}
			out = append(out, openai.ChatMessage{Role: openai.RoleTool, ToolCallID: id, Content: content})
		case typ == "tool_use" || typ == "tool_result":
			return nil, invalid(p+".type", "%s.type: %q blocks belong in %s messages", p, typ, map[string]string{"tool_use": "assistant", "tool_result": "user"}[typ])
		default:
			return nil, unsupported(p+".type", "%s.type: %q blocks are not supported; only text, image, tool_use and tool_result", p, typ)
		}
	}
	if len(texts) > 0 || len(calls) > 0 || len(out) == 0 {
		out = append(out, openai.ChatMessage{Role: role, Content: openai.JoinParts(texts, media), ToolCalls: calls, Images: images})
	}
	return out, nil
}

// decodeImage reads an image block's picture: a base64 source
// ({"type": "base64", "media_type": "image/png", "data": "…"}) of a PNG,
// JPEG, GIF or BMP, bounded as an OpenAI image part is. URL sources are
// not fetched.
func decodeImage(p string, b map[string]json.RawMessage) ([]byte, error) {
	var src struct {
		Type      string `json:"type"`
		MediaType string `json:"media_type"`
		Data      string `json:"data"`
	}
	if json.Unmarshal(b["source"], &src) != nil {
		return nil, invalid(p+".source", "%s.source: field required: {\"type\": \"base64\", \"media_type\": \"image/png\", \"data\": \"…\"}", p)
	}
	switch src.Type {
	case "base64":
	case "url", "file":
		return nil, unsupported(p+".source.type", "%s.source.type: %q images are not fetched; send the image inline (type base64)", p, src.Type)
	default:
		return nil, invalid(p+".source.type", "%s.source.type: must be base64", p)
	}
	img, err := openai.DecodeDataURI(p+".source", "data:"+src.MediaType+";base64,"+src.Data)
	if err != nil {
		var oe *openai.Error
		if errors.As(err, &oe) {
			return nil, invalid(p+".source", "%s.source: %s", p, oe.Message)
		}
		return nil, err
	}
	return img, nil
}

// decodeText reads a string, or an array of content blocks of which only
// text ones are served, joined with "\n".
func decodeText(param string, r json.RawMessage) (string, error) {
	var s string
	if json.Unmarshal(r, &s) == nil {
		return s, nil
	}
	var blocks []map[string]json.RawMessage
	if json.Unmarshal(r, &blocks) != nil {
		return "", invalid(param, "%s: must be a string or an array of content blocks", param)
	}
	texts := make([]string, 0, len(blocks))
	for i, b := range blocks {
		p := fmt.Sprintf("%s.%d", param, i)
		var typ string
		if json.Unmarshal(b["type"], &typ) != nil {
			return "", invalid(p+".type", "%s.type: field required", p)
		}
		switch typ {
		case "text":
		case "tool_use", "tool_result", "server_tool_use":
			return "", unsupported(p+".type", "%s.type: %q blocks are not supported here", p, typ)
		default:
			return "", unsupported(p+".type", "%s.type: %q blocks are not supported; only text", p, typ)
		}
		var text string
		if json.Unmarshal(b["text"], &text) != nil {
			return "", invalid(p+".text", "%s.text: must be a string", p)
		}
		texts = append(texts, text)
	}
	return strings.Join(texts, "\n"), nil
}

func decodeSampling(get func(string) (json.RawMessage, bool), req *Request) error {
	num := func(name string, lo, hi float64) (*float64, error) {
		r, ok := get(name)
		if !ok {
			return nil, nil
		}
		var v float64
		if json.Unmarshal(r, &v) != nil || math.IsNaN(v) || v < lo || v > hi {
			return nil, invalid(name, "%s: must be a number between %g and %g", name, lo, hi)
		}
		return &v, nil
	}
	var err error
	if req.Temperature, err = num("temperature", 0, 1); err != nil {
		return err
	}
	if req.TopP, err = num("top_p", 0, 1); err != nil {
		return err
	}
	if req.TopP != nil && *req.TopP == 0 {
		return invalid("top_p", "top_p: must be greater than 0")
	}
	k, err := num("top_k", 0, 1<<31-1)
	if err != nil {
		return err
	}
	if k != nil {
		if *k != math.Trunc(*k) {
			return invalid("top_k", "top_k: must be an integer")
		}
		n := int(*k)
		req.TopK = &n
	}
	if r, ok := get("stop_sequences"); ok {
		var stops []string
		if json.Unmarshal(r, &stops) != nil {
			return invalid("stop_sequences", "stop_sequences: must be an array of strings")
		}
		if len(stops) > MaxStopSequences {
			return invalid("stop_sequences", "stop_sequences: at most %d are supported, got %d", MaxStopSequences, len(stops))
		}
		for i, s := range stops {
			if s == "" {
				return invalid(fmt.Sprintf("stop_sequences.%d", i), "stop_sequences.%d: must not be empty", i)
			}
		}
		if len(stops) > 0 {
			req.Stop = stops
		}
	}
	if r, ok := get("stream"); ok {
		if json.Unmarshal(r, &req.Stream) != nil {
			return invalid("stream", "stream: must be a boolean")
		}
	}
	return nil
}

func invalid(param, format string, a ...any) error {
	return &openai.Error{Status: http.StatusBadRequest, Code: openai.CodeInvalidValue, Param: param,
		Message: fmt.Sprintf(format, a...), Err: openai.ErrInvalidRequest}
}

func unsupported(param, format string, a ...any) error {
	return &openai.Error{Status: http.StatusBadRequest, Code: openai.CodeUnsupported, Param: param,
		Message: fmt.Sprintf(format, a...), Err: errors.Join(openai.ErrInvalidRequest, ErrUnsupported)}
}
