// Package ollama speaks Ollama's API (/api/chat, /api/generate,
// /api/embed, /api/embeddings; https://github.com/ollama/ollama/blob/main/docs/api.md)
// in terms of the OpenAI API the workers serve: a request becomes an
// OpenAI request, and the worker's OpenAI answer (a whole body, or a
// stream of SSE events) becomes Ollama's answer (a whole object, or NDJSON
// lines). The queen does the translating, so every worker — the built-in
// one and external engines alike — serves Ollama's clients.
package ollama

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/apiary-llm/apiary/internal/imagefetch"
)

// ErrBadRequest marks a request this package refuses; the message says why.
var ErrBadRequest = errors.New("invalid request")

func badf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrBadRequest, fmt.Sprintf(format, args...))
}

// Message is one message of /api/chat.
type Message struct {
	Role      string     `json:"role"`
	Content   string     `json:"content"`
	Thinking  string     `json:"thinking,omitempty"`
	Images    []string   `json:"images,omitempty"`
	ToolCalls []ToolCall `json:"tool_calls,omitempty"`
	ToolName  string     `json:"tool_name,omitempty"`
}

// ToolCall is a call the model made; Arguments is a JSON object.
type ToolCall struct {
	Function struct {
		Index     *int            `json:"index,omitempty"`
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	} `json:"function"`
}

// ChatRequest is the body of POST /api/chat.
type ChatRequest struct {
	Model     string            `json:"model"`
	Messages  []Message         `json:"messages"`
	Tools     []json.RawMessage `json:"tools,omitempty"`
	Format    json.RawMessage   `json:"format,omitempty"`
	Options   map[string]any    `json:"options,omitempty"`
	Stream    *bool             `json:"stream,omitempty"`
	KeepAlive json.RawMessage   `json:"keep_alive,omitempty"`
	Think     json.RawMessage   `json:"think,omitempty"`
}

// GenerateRequest is the body of POST /api/generate.
type GenerateRequest struct {
	Model     string          `json:"model"`
	Prompt    string          `json:"prompt"`
	Suffix    string          `json:"suffix,omitempty"`
	System    string          `json:"system,omitempty"`
	Template  string          `json:"template,omitempty"`
	Context   []int           `json:"context,omitempty"`
	Raw       bool            `json:"raw,omitempty"`
	Images    []string        `json:"images,omitempty"`
	Format    json.RawMessage `json:"format,omitempty"`
	Options   map[string]any  `json:"options,omitempty"`
	Stream    *bool           `json:"stream,omitempty"`
	KeepAlive json.RawMessage `json:"keep_alive,omitempty"`
	Think     json.RawMessage `json:"think,omitempty"`
}

// EmbedRequest is the body of POST /api/embed; Input is a string or a
// list of strings.
type EmbedRequest struct {
	Model      string          `json:"model"`
	Input      json.RawMessage `json:"input"`
	Truncate   *bool           `json:"truncate,omitempty"`
	Dimensions int             `json:"dimensions,omitempty"`
	Options    map[string]any  `json:"options,omitempty"`
	KeepAlive  json.RawMessage `json:"keep_alive,omitempty"`
}

// EmbeddingsRequest is the body of the older POST /api/embeddings.
type EmbeddingsRequest struct {
	Model     string          `json:"model"`
	Prompt    string          `json:"prompt"`
	Options   map[string]any  `json:"options,omitempty"`
	KeepAlive json.RawMessage `json:"keep_alive,omitempty"`
}

// optionFields maps Ollama's options to the OpenAI request's fields the
// workers implement.
var optionFields = map[string]string{
	"num_predict":       "max_tokens",
	"temperature":       "temperature",
	"top_p":             "top_p",
	"top_k":             "top_k",
	"min_p":             "min_p",
	"seed":              "seed",
	"stop":              "stop",
	"repeat_penalty":    "repeat_penalty",
	"presence_penalty":  "presence_penalty",
	"frequency_penalty": "frequency_penalty",
}

// ignoredOptions are Ollama's other options: they set how Ollama loads a
// model (a worker's context and threads are set when it starts) or
// samplers the workers do not have. Accepted and left out, as Ollama
// itself leaves out what a model does not take; a name in neither list
// is refused.
var ignoredOptions = []string{"numa", "num_ctx", "num_batch", "num_gpu", "main_gpu", "low_vram", "f16_kv", "logits_all",
	"vocab_only", "use_mmap", "use_mlock", "num_thread", "num_keep", "typical_p", "repeat_last_n", "mirostat",
	"mirostat_tau", "mirostat_eta", "penalize_newline", "tfs_z"}

// sampling adds options to an OpenAI request body.
func sampling(body map[string]any, options map[string]any) error {
	for name, v := range options {
		field, ok := optionFields[name]
		switch {
		case ok:
			if name == "num_predict" {
				n, isNum := v.(float64)
				if !isNum || n != float64(int(n)) {
					return badf("options.num_predict must be an integer")
				}
				if n < 0 {
					continue // -1 (and -2): until the model stops, the worker's bound
				}
			}
			if name == "stop" {
				if s, isStr := v.(string); isStr {
					v = []string{s}
				}
			}
			body[field] = v
		case slices.Contains(ignoredOptions, name):
		default:
			return badf("options.%s is not an Ollama option", name)
		}
	}
	return nil
}

// format adds Ollama's format ("json", or a JSON schema) as a
// response_format. A schema is enforced as given, as Ollama does: not in
// OpenAI's strict mode, which would refuse a plain schema (an object
// without "additionalProperties": false, a property left out of
// required); the worker's grammar enforces every keyword it takes.
func format(body map[string]any, f json.RawMessage) error {
	f = bytes.TrimSpace(f)
	if len(f) == 0 || string(f) == "null" || string(f) == `""` {
		return nil
	}
	if string(f) == `"json"` {
		body["response_format"] = map[string]any{"type": "json_object"}
		return nil
	}
	var schema map[string]any
	if json.Unmarshal(f, &schema) != nil {
		return badf(`format must be "json" or a JSON schema object`)
	}
	body["response_format"] = map[string]any{"type": "json_schema",
		"json_schema": map[string]any{"name": "format", "schema": schema}}
	return nil
}

// streamOf is Ollama's stream flag: true when absent.
func streamOf(s *bool) bool { return s == nil || *s }

func streamFields(body map[string]any, stream bool) {
	body["stream"] = stream
	if stream {
		body["stream_options"] = map[string]any{"include_usage": true}
	}
}

// Action is what a request with nothing to answer asks for: Ollama's
// clients load a model with a chat of no messages or a generate of no
// prompt, and unload it with the same and keep_alive 0.
type Action int

const (
	ActionNone   Action = iota // a request to answer
	ActionLoad                 // load the model; done_reason "load"
	ActionUnload               // unload it; done_reason "unload"
)

// action is the Action of a request with no input (empty) and keep_alive.
func action(empty bool, keepAlive json.RawMessage) (Action, error) {
	if !empty {
		return ActionNone, nil
	}
	zero, err := keepAliveZero(keepAlive)
	if err != nil {
		return ActionNone, err
	}
	if zero {
		return ActionUnload, nil
	}
	return ActionLoad, nil
}

// keepAliveZero says whether keep_alive is 0 (a number of seconds, or a
// duration string such as "0", "0s" or "0m"): unload now. Absent, null
// or any other value keeps the model.
func keepAliveZero(raw json.RawMessage) (bool, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return false, nil
	}
	var n float64
	if json.Unmarshal(raw, &n) == nil {
		return n == 0, nil
	}
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return false, badf("keep_alive must be a number of seconds or a duration such as \"5m\"")
	}
	if f, err := strconv.ParseFloat(s, 64); err == nil {
		return f == 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return false, badf("keep_alive %q is not a duration such as \"5m\" or a number of seconds", s)
	}
	return d == 0, nil
}

// Chat turns an /api/chat body into a /v1/chat/completions body. A chat
// of no messages is a load or an unload (act): no body.
func Chat(data []byte) (req ChatRequest, act Action, openaiBody []byte, err error) {
	if err := strict(data, &req); err != nil {
		return req, ActionNone, nil, err
	}
	if act, err = action(len(req.Messages) == 0, req.KeepAlive); err != nil || act != ActionNone {
		return req, act, nil, err
	}
	openaiBody, err = chatBody(req)
	return req, ActionNone, openaiBody, err
}

// chatBody is Chat's OpenAI body for a chat with messages.
func chatBody(req ChatRequest) ([]byte, error) {
	msgs := make([]map[string]any, 0, len(req.Messages))
	for i, m := range req.Messages {
		om := map[string]any{"role": m.Role, "content": m.Content}
		if len(m.Images) > 0 {
			if m.Role != "user" {
				return nil, badf("messages[%d].images: only a user message carries images", i)
			}
			parts, err := imageParts(m.Content, m.Images, fmt.Sprintf("messages[%d].images", i))
			if err != nil {
				return nil, err
			}
			om["content"] = parts
		}
		switch m.Role {
		case "system", "user":
		case "assistant":
			if len(m.ToolCalls) > 0 {
				calls := make([]map[string]any, len(m.ToolCalls))
				for k, c := range m.ToolCalls {
					args := bytes.TrimSpace(c.Function.Arguments)
					if len(args) == 0 {
						args = []byte("{}")
					}
					calls[k] = map[string]any{"id": fmt.Sprintf("call_%d_%d", i, k), "type": "function",
						"function": map[string]any{"name": c.Function.Name, "arguments": string(args)}}
				}
				om["tool_calls"] = calls
			}
		case "tool":
			// Ollama names the tool; OpenAI answers a call by its id, the
			// one the assistant message before gave it.
			om["tool_call_id"] = toolCallID(req.Messages[:i], m.ToolName)
		default:
			return nil, badf("messages[%d].role %q: want system, user, assistant or tool", i, m.Role)
		}
		msgs = append(msgs, om)
	}
	body := map[string]any{"model": req.Model, "messages": msgs}
	if len(req.Tools) > 0 {
		body["tools"] = req.Tools
	}
	if err := format(body, req.Format); err != nil {
		return nil, err
	}
	if err := sampling(body, req.Options); err != nil {
		return nil, err
	}
	streamFields(body, streamOf(req.Stream))
	return json.Marshal(body)
}

// toolCallID is the id Chat gave the last call of name among msgs (the
// last call of any name when name is empty).
func toolCallID(msgs []Message, name string) string {
	for i := len(msgs) - 1; i >= 0; i-- {
		for k := len(msgs[i].ToolCalls) - 1; k >= 0; k-- {
			if name == "" || msgs[i].ToolCalls[k].Function.Name == name {
				return fmt.Sprintf("call_%d_%d", i, k)
			}
		}
	}
	return "call_none"
}

// Generate turns an /api/generate body into a /v1/chat/completions body
// (the model's chat template applies, as in Ollama), or with raw into a
// /v1/completions one; path says which. A generate of no prompt (and no
// system prompt or images) is a load or an unload (act): no body.
func Generate(data []byte) (req GenerateRequest, act Action, path string, openaiBody []byte, err error) {
	if err := strict(data, &req); err != nil {
		return req, ActionNone, "", nil, err
	}
	if act, err = action(req.Prompt == "" && req.System == "" && len(req.Images) == 0, req.KeepAlive); err != nil || act != ActionNone {
		return req, act, "", nil, err
	}
	path, openaiBody, err = generateBody(req)
	return req, ActionNone, path, openaiBody, err
}

// generateBody is Generate's path and OpenAI body for a prompt.
func generateBody(req GenerateRequest) (path string, openaiBody []byte, err error) {
	switch {
	case len(req.Images) > 0 && req.Raw:
		return "", nil, badf("images: a raw prompt carries none (the model's chat template places them); send it without raw")
	case req.Template != "":
		return "", nil, badf("template: the worker applies the model's own chat template; send raw with the prompt as it should be")
	case len(req.Context) > 0:
		return "", nil, badf("context: this server keeps no token context between requests; send the conversation to /api/chat")
	case req.Suffix != "":
		return "", nil, badf("suffix (fill-in-the-middle) is not served")
	}
	body := map[string]any{"model": req.Model}
	path = "/v1/chat/completions"
	if req.Raw {
		path = "/v1/completions"
		body["prompt"] = req.Prompt
	} else {
		var msgs []map[string]any
		if req.System != "" {
			msgs = append(msgs, map[string]any{"role": "system", "content": req.System})
		}
		var content any = req.Prompt
		if len(req.Images) > 0 {
			parts, err := imageParts(req.Prompt, req.Images, "images")
			if err != nil {
				return "", nil, err
			}
			content = parts
		}
		body["messages"] = append(msgs, map[string]any{"role": "user", "content": content})
	}
	if err := format(body, req.Format); err != nil {
		return "", nil, err
	}
	if err := sampling(body, req.Options); err != nil {
		return "", nil, err
	}
	streamFields(body, streamOf(req.Stream))
	b, err := json.Marshal(body)
	return path, b, err
}

// Embed turns an /api/embed body into a /v1/embeddings body.
func Embed(data []byte) (req EmbedRequest, openaiBody []byte, err error) {
	if err := strict(data, &req); err != nil {
		return req, nil, err
	}
	var input any
	var one string
	var many []string
	switch {
	case json.Unmarshal(req.Input, &one) == nil:
		input = one
	case json.Unmarshal(req.Input, &many) == nil:
		input = many
	default:
		return req, nil, badf("input must be a string or a list of strings")
	}
	// truncate: the worker refuses an input longer than its context
	// either way (Ollama's truncate:false); true is not honoured.
	body := map[string]any{"model": req.Model, "input": input, "encoding_format": "float"}
	if req.Dimensions > 0 {
		body["dimensions"] = req.Dimensions
	}
	if err := sampling(map[string]any{}, req.Options); err != nil {
		return req, nil, err
	}
	b, err := json.Marshal(body)
	return req, b, err
}

// Embeddings turns an /api/embeddings body into a /v1/embeddings body.
func Embeddings(data []byte) (req EmbeddingsRequest, openaiBody []byte, err error) {
	if err := strict(data, &req); err != nil {
		return req, nil, err
	}
	if err := sampling(map[string]any{}, req.Options); err != nil {
		return req, nil, err
	}
	b, err := json.Marshal(map[string]any{"model": req.Model, "input": req.Prompt, "encoding_format": "float"})
	return req, b, err
}

// strict decodes one JSON object into v, refusing unknown fields.
func strict(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return badf("the body is not a valid request: %s", strings.TrimPrefix(err.Error(), "json: "))
	}
	if dec.More() {
		return badf("the body holds more than one JSON value")
	}
	return nil
}

// Timestamp is Ollama's created_at.
func Timestamp(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// Error is Ollama's error body.
type Error struct {
	Error string `json:"error"`
}

// imageParts is an OpenAI message content of text and Ollama's images
// (base64 pictures, no data URI around them), each an image_url part with
// the data URI of its type, told from its first bytes. param names the
// images for errors.
func imageParts(text string, images []string, param string) ([]map[string]any, error) {
	parts := []map[string]any{{"type": "text", "text": text}}
	for k, img := range images {
		head, err := base64.StdEncoding.DecodeString(img[:min(len(img), 16)&^3])
		if err != nil {
			return nil, badf("%s[%d]: not base64: %v", param, k, err)
		}
		mt := imagefetch.PictureType(head)
		if mt == "" {
			return nil, badf("%s[%d]: not a PNG, JPEG, GIF or BMP picture", param, k)
		}
		parts = append(parts, map[string]any{"type": "image_url", "image_url": map[string]any{"url": "data:" + mt + ";base64," + img}})
	}
	return parts, nil
}
