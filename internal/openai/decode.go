package openai

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// MaxStop is the largest number of stop sequences a request may carry.
const MaxStop = 4

// DefaultMaxTokensLimit bounds max_tokens when Limits.MaxTokens is zero (a
// router that does not know the model's context yet).
const DefaultMaxTokensLimit = 1 << 20

// Limits are the server-side bounds decoding checks against.
type Limits struct {
	// MaxTokens is the largest max_tokens accepted, typically the context
	// length of one slot; 0 means DefaultMaxTokensLimit.
	MaxTokens int
}

func (l Limits) maxTokens() int {
	if l.MaxTokens <= 0 {
		return DefaultMaxTokensLimit
	}
	return l.MaxTokens
}

// ReadBody reads r's body up to limit bytes. A larger body yields a 413
// *Error. It is meant to be called by a handler before a Decode function.
func ReadBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, AsError(err)
		}
		return nil, &Error{Status: http.StatusBadRequest, Code: CodeInvalidJSON,
			Message: "cannot read request body: " + err.Error(), Err: errors.Join(ErrInvalidRequest, err)}
	}
	return body, nil
}

// DecodeCompletionRequest decodes and validates a POST /v1/completions body.
// Unknown fields are ignored; the first field that is wrong or asks for an
// unsupported feature yields a 400 *Error naming it.
func DecodeCompletionRequest(body []byte, lim Limits) (CompletionRequest, error) {
	var req CompletionRequest
	o, err := parseBody(body)
	if err != nil {
		return req, err
	}
	if req.Model, _, err = o.text("model"); err != nil {
		return req, err
	}
	if req.Prompt, err = decodePrompt(o); err != nil {
		return req, err
	}
	if err := checkCompletionOnly(o); err != nil {
		return req, err
	}
	if req.Sampling, err = decodeSampling(o, lim, false); err != nil {
		return req, err
	}
	// Legacy logprobs: an integer, how many most likely tokens to list.
	lp, err := o.integer("logprobs")
	if err != nil {
		return req, err
	}
	if lp != nil {
		if *lp < 0 || *lp > MaxTopLogprobs {
			return req, Invalid("logprobs", "logprobs must be between 0 and %d, got %d", MaxTopLogprobs, *lp)
		}
		req.Logprobs, req.TopLogprobs = true, int(*lp)
	}
	return req, nil
}

// DecodeChatCompletionRequest decodes and validates a POST
// /v1/chat/completions body, with the same rules as DecodeCompletionRequest.
func DecodeChatCompletionRequest(body []byte, lim Limits) (ChatCompletionRequest, error) {
	var req ChatCompletionRequest
	o, err := parseBody(body)
	if err != nil {
		return req, err
	}
	if req.Model, _, err = o.text("model"); err != nil {
		return req, err
	}
	if req.Messages, err = decodeMessages(o); err != nil {
		return req, err
	}
	if err := checkChatOnly(o); err != nil {
		return req, err
	}
	if err := decodeTools(o, &req); err != nil {
		return req, err
	}
	if req.Sampling, err = decodeSampling(o, lim, true); err != nil {
		return req, err
	}
	if req.ToolChoice.Forced() && (req.Grammar != "" || req.ResponseFormat.Schema() != nil) {
		return req, Invalid("tool_choice", "a tool_choice that forces a call and a grammar or JSON response_format both constrain the output; send one")
	}
	if req.Logprobs, err = o.boolean("logprobs"); err != nil {
		return req, err
	}
	tl, err := o.integer("top_logprobs")
	switch {
	case err != nil:
		return req, err
	case tl != nil && (*tl < 0 || *tl > MaxTopLogprobs):
		return req, Invalid("top_logprobs", "top_logprobs must be between 0 and %d, got %d", MaxTopLogprobs, *tl)
	case tl != nil && *tl > 0 && !req.Logprobs:
		return req, Invalid("top_logprobs", "top_logprobs needs logprobs: true")
	case tl != nil:
		req.TopLogprobs = int(*tl)
	}
	return req, nil
}

// decodePrompt accepts a string or an array holding one string.
func decodePrompt(o object) (string, error) {
	r, ok := o.raw("prompt")
	if !ok {
		return "", missing("prompt", "send the text to complete as a string")
	}
	if jsonKind(r) == "a string" {
		s, _, err := o.text("prompt")
		return s, err
	}
	items, _, err := o.list("prompt")
	if err != nil {
		return "", typeError("prompt", "a string or an array of one string", r)
	}
	switch {
	case len(items) == 0:
		return "", Invalid("prompt", "prompt must not be an empty array")
	case jsonKind(items[0]) == "a number" || jsonKind(items[0]) == "an array":
		return "", Unsupported("prompt", "token arrays as prompt are not supported; send the prompt as a string")
	case len(items) > 1:
		return "", Unsupported("prompt", "several prompts in one request are not supported; send one string")
	}
	var s string
	if err := json.Unmarshal(items[0], &s); err != nil {
		return "", typeError("prompt[0]", "a string", items[0])
	}
	return s, nil
}

// decodeMessages reads the chat messages.
func decodeMessages(o object) ([]ChatMessage, error) {
	items, ok, err := o.list("messages")
	switch {
	case err != nil:
		return nil, err
	case !ok:
		return nil, missing("messages", "send an array of {role, content} messages")
	case len(items) == 0:
		return nil, Invalid("messages", "messages must not be empty")
	}
	msgs := make([]ChatMessage, 0, len(items))
	for i, item := range items {
		m, err := decodeMessage(i, item)
		if err != nil {
			return nil, err
		}
		msgs = append(msgs, m)
	}
	return msgs, nil
}

func decodeMessage(i int, item json.RawMessage) (ChatMessage, error) {
	prefix := fmt.Sprintf("messages[%d]", i)
	var members map[string]json.RawMessage
	if err := json.Unmarshal(item, &members); err != nil || jsonKind(item) != "an object" {
		return ChatMessage{}, typeError(prefix, "an object", item)
	}
	o := object{members: members, prefix: prefix + "."}
	role, ok, err := o.text("role")
	switch {
	case err != nil:
		return ChatMessage{}, err
	case !ok:
		return ChatMessage{}, missing(o.param("role"), "one of system, user, assistant")
	}
	switch role {
	case RoleSystem, RoleUser, RoleAssistant, RoleTool:
	case "developer":
		role = RoleSystem
	case "function":
		return ChatMessage{}, Unsupported(o.param("role"), `role "function" (the deprecated function calling) is not supported; use tools and role "tool"`)
	default:
		return ChatMessage{}, Invalid(o.param("role"), "role %q is not one of system, user, assistant, tool", role)
	}
	if r, ok := o.raw("function_call"); ok && !isEmptyArray(r) {
		return ChatMessage{}, Unsupported(o.param("function_call"), "%s (the deprecated function calling) is not supported; use tool_calls", o.param("function_call"))
	}
	msg := ChatMessage{Role: role}
	if role == RoleAssistant {
		if msg.ToolCalls, err = decodeToolCalls(o); err != nil {
			return ChatMessage{}, err
		}
	} else if r, ok := o.raw("tool_calls"); ok && !isEmptyArray(r) {
		return ChatMessage{}, Invalid(o.param("tool_calls"), "only assistant messages carry tool_calls")
	}
	if role == RoleTool {
		id, ok, err := o.text("tool_call_id")
		switch {
		case err != nil:
			return ChatMessage{}, err
		case !ok || id == "":
			return ChatMessage{}, missing(o.param("tool_call_id"), "the id of the call this tool message answers")
		}
		msg.ToolCallID = id
		if msg.Name, _, err = o.text("name"); err != nil {
			return ChatMessage{}, err
		}
	}
	if msg.Content, msg.Images, err = decodeContent(o, role); err != nil {
		return ChatMessage{}, err
	}
	return msg, nil
}

// decodeToolCalls reads an assistant message's tool_calls.
func decodeToolCalls(o object) ([]ToolCall, error) {
	items, _, err := o.list("tool_calls")
	if err != nil || len(items) == 0 {
		return nil, err
	}
	calls := make([]ToolCall, len(items))
	for i, item := range items {
		p := fmt.Sprintf("%s[%d]", o.param("tool_calls"), i)
		var members map[string]json.RawMessage
		if err := json.Unmarshal(item, &members); err != nil || jsonKind(item) != "an object" {
			return nil, typeError(p, "an object", item)
		}
		co := object{members: members, prefix: p + "."}
		if typ, ok, err := co.text("type"); err != nil {
			return nil, err
		} else if ok && typ != "function" {
			return nil, Unsupported(co.param("type"), "tool calls of type %q are not supported; only \"function\"", typ)
		}
		id, ok, err := co.text("id")
		switch {
		case err != nil:
			return nil, err
		case !ok || id == "":
			return nil, missing(co.param("id"), "the call's id, which its tool message names in tool_call_id")
		}
		fo, ok, err := co.member("function")
		switch {
		case err != nil:
			return nil, err
		case !ok:
			return nil, missing(co.param("function"), "the {name, arguments} of the call")
		}
		name, ok, err := fo.text("name")
		switch {
		case err != nil:
			return nil, err
		case !ok || name == "":
			return nil, missing(fo.param("name"), "the called function's name")
		}
		args := "{}"
		if r, ok := fo.raw("arguments"); ok {
			if jsonKind(r) == "a string" {
				args, _, _ = fo.text("arguments")
			} else if jsonKind(r) == "an object" {
				args = string(r) // lenient: arguments as an object rather than its JSON text
			} else {
				return nil, typeError(fo.param("arguments"), "a string of JSON", r)
			}
		}
		calls[i] = ToolCall{ID: id, Type: "function", Function: FunctionCall{Name: name, Arguments: args}}
	}
	return calls, nil
}

func isEmptyArray(r json.RawMessage) bool {
	var items []json.RawMessage
	return json.Unmarshal(r, &items) == nil && len(items) == 0
}

// decodeContent accepts a string or an array of content parts: text,
// and in a user message image_url parts with an inline image (a data
// URI), which the content holds as ImageMarker and images hold in order;
// an assistant message may have null content.
func decodeContent(o object, role string) (string, [][]byte, error) {
	param := o.param("content")
	r, ok := o.raw("content")
	if !ok {
		if role == RoleAssistant {
			return "", nil, nil
		}
		return "", nil, missing(param, "a string or an array of text parts")
	}
	if jsonKind(r) == "a string" {
		s, _, err := o.text("content")
		return s, nil, err
	}
	parts, _, err := o.list("content")
	if err != nil {
		return "", nil, typeError(param, "a string or an array of text parts", r)
	}
	texts := make([]string, 0, len(parts))
	media := make([]bool, 0, len(parts)) // texts[i] is an image's marker
	var images [][]byte
	for j, part := range parts {
		pp := fmt.Sprintf("%s[%d]", param, j)
		var members map[string]json.RawMessage
		if err := json.Unmarshal(part, &members); err != nil || jsonKind(part) != "an object" {
			return "", nil, typeError(pp, "an object", part)
		}
		po := object{members: members, prefix: pp + "."}
		typ, ok, err := po.text("type")
		switch {
		case err != nil:
			return "", nil, err
		case !ok:
			return "", nil, missing(po.param("type"), `"text"`)
		}
		switch typ {
		case "text":
		case "image_url":
			if role != RoleUser {
				return "", nil, Unsupported(po.param("type"), "images are read in user messages only, not in %s messages", role)
			}
			img, err := decodeImagePart(po)
			if err != nil {
				return "", nil, err
			}
			images = append(images, img)
			texts = append(texts, ImageMarker)
			media = append(media, true)
			continue
		case "input_audio", "file", "image", "audio", "refusal":
			return "", nil, Unsupported(po.param("type"), "content parts of type %q are not supported; only text and image_url", typ)
		default:
			return "", nil, Invalid(po.param("type"), "unknown content part type %q", typ)
		}
		text, ok, err := po.text("text")
		switch {
		case err != nil:
			return "", nil, err
		case !ok:
			return "", nil, missing(po.param("text"), "the text of the part")
		}
		if len(images) > 0 && strings.Contains(text, ImageMarker) {
			return "", nil, imageMarkerError(po.param("text"))
		}
		texts = append(texts, text)
		media = append(media, false)
	}
	return JoinParts(texts, media), images, nil
}

// JoinParts joins a message's content parts as llama.cpp's server does
// (common/chat.cpp): with "\n" between texts, none before or after an
// image's marker (media[i]: texts[i] is one), so that a model sees the
// prompt llama-server gives it.
func JoinParts(texts []string, media []bool) string {
	var b strings.Builder
	for i, t := range texts {
		if i > 0 && !media[i] && !media[i-1] && b.Len() > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(t)
	}
	return b.String()
}

// decodeSampling reads the generation parameters both endpoints share, and
// rejects the shared features that are not supported.
func decodeSampling(o object, lim Limits, chat bool) (Sampling, error) {
	var s Sampling
	var err error
	if s.MaxTokens, err = decodeMaxTokens(o, lim, chat); err != nil {
		return s, err
	}
	if s.Temperature, err = o.number("temperature"); err != nil {
		return s, err
	}
	if err := inRange("temperature", s.Temperature, 0, 2, false); err != nil {
		return s, err
	}
	if s.TopP, err = o.number("top_p"); err != nil {
		return s, err
	}
	if err := inRange("top_p", s.TopP, 0, 1, true); err != nil {
		return s, err
	}
	if s.MinP, err = o.number("min_p"); err != nil {
		return s, err
	}
	if err := inRange("min_p", s.MinP, 0, 1, false); err != nil {
		return s, err
	}
	if s.RepeatPenalty, err = o.number("repeat_penalty"); err != nil {
		return s, err
	}
	if err := inRange("repeat_penalty", s.RepeatPenalty, 0, 10, true); err != nil {
		return s, err
	}
	for _, name := range []string{"presence_penalty", "frequency_penalty"} {
		v, err := o.number(name)
		if err != nil {
			return s, err
		}
		if err := inRange(name, v, -2, 2, false); err != nil {
			return s, err
		}
		if name == "presence_penalty" {
			s.PresencePenalty = v
		} else {
			s.FrequencyPenalty = v
		}
	}
	topK, err := o.integer("top_k")
	if err != nil {
		return s, err
	}
	if topK != nil {
		if *topK < 0 || *topK > 1<<31-1 {
			return s, Invalid("top_k", "top_k must be 0 (disabled) or more, got %d", *topK)
		}
		k := int(*topK)
		s.TopK = &k
	}
	if s.Seed, err = o.integer("seed"); err != nil {
		return s, err
	}
	if s.Stop, err = decodeStop(o); err != nil {
		return s, err
	}
	if s.IgnoreEOS, err = o.boolean("ignore_eos"); err != nil {
		return s, err
	}
	if s.Stream, err = o.boolean("stream"); err != nil {
		return s, err
	}
	so, ok, err := o.member("stream_options")
	if err != nil {
		return s, err
	}
	if ok {
		inc, err := so.boolean("include_usage")
		if err != nil {
			return s, err
		}
		s.StreamOptions = &StreamOptions{IncludeUsage: inc}
	}
	n, err := o.integer("n")
	switch {
	case err != nil:
		return s, err
	case n != nil && (*n < 1 || *n > MaxChoices):
		return s, Invalid("n", "n must be between 1 and %d, got %d", MaxChoices, *n)
	case n != nil:
		s.N = int(*n)
	}
	if s.LogitBias, err = decodeLogitBias(o); err != nil {
		return s, err
	}
	if s.ResponseFormat, err = decodeResponseFormat(o); err != nil {
		return s, err
	}
	if s.Grammar, _, err = o.text("grammar"); err != nil {
		return s, err
	}
	if s.Grammar != "" && s.ResponseFormat.Schema() != nil {
		return s, Invalid("grammar", "grammar and a JSON response_format both constrain the output; send one")
	}
	return s, nil
}

// MaxLogitBias bounds the entries of logit_bias.
const MaxLogitBias = 1024

// decodeLogitBias reads {"token id": bias}, each bias -100..100.
func decodeLogitBias(o object) (map[int]float64, error) {
	r, ok := o.raw("logit_bias")
	if !ok {
		return nil, nil
	}
	lb, _, err := o.member("logit_bias")
	if err != nil {
		return nil, typeError("logit_bias", "an object mapping token ids to biases", r)
	}
	if len(lb.members) == 0 {
		return nil, nil
	}
	if len(lb.members) > MaxLogitBias {
		return nil, Invalid("logit_bias", "logit_bias may name at most %d tokens, got %d", MaxLogitBias, len(lb.members))
	}
	out := make(map[int]float64, len(lb.members))
	for key := range lb.members {
		id, err := strconv.ParseInt(key, 10, 32)
		if err != nil || id < 0 {
			return nil, Invalid(lb.param(key), "logit_bias keys must be token ids (non-negative integers), got %q", key)
		}
		v, err := lb.number(key)
		if err != nil {
			return nil, err
		}
		if err := inRange(lb.param(key), v, -100, 100, false); err != nil {
			return nil, err
		}
		out[int(id)] = *v
	}
	return out, nil
}

// decodeMaxTokens reads max_completion_tokens (chat only) or max_tokens.
func decodeMaxTokens(o object, lim Limits, chat bool) (*int, error) {
	names := []string{"max_tokens"}
	if chat {
		names = []string{"max_completion_tokens", "max_tokens"}
	}
	for _, name := range names {
		v, err := o.integer(name)
		if err != nil {
			return nil, err
		}
		if v == nil {
			continue
		}
		if *v < 1 || *v > int64(lim.maxTokens()) {
			return nil, Invalid(name, "%s must be between 1 and %d, got %d", name, lim.maxTokens(), *v)
		}
		n := int(*v)
		return &n, nil
	}
	return nil, nil
}

// decodeStop accepts a string or an array of up to MaxStop non-empty strings.
func decodeStop(o object) ([]string, error) {
	r, ok := o.raw("stop")
	if !ok {
		return nil, nil
	}
	var stops []string
	if jsonKind(r) == "a string" {
		s, _, err := o.text("stop")
		if err != nil {
			return nil, err
		}
		stops = []string{s}
	} else if err := json.Unmarshal(r, &stops); err != nil {
		return nil, typeError("stop", "a string or an array of strings", r)
	}
	if len(stops) > MaxStop {
		return nil, Invalid("stop", "stop may hold at most %d sequences, got %d", MaxStop, len(stops))
	}
	for i, s := range stops {
		if s == "" {
			return nil, Invalid(fmt.Sprintf("stop[%d]", i), "stop sequences must not be empty")
		}
	}
	if len(stops) == 0 {
		return nil, nil
	}
	return stops, nil
}

// decodeResponseFormat reads response_format: text, json_object (with a
// schema, as llama-server takes it, or none), or json_schema with a schema
// in the supported subset (see CheckSchema).
func decodeResponseFormat(o object) (*ResponseFormat, error) {
	rf, ok, err := o.member("response_format")
	if err != nil || !ok {
		return nil, err
	}
	typ, ok, err := rf.text("type")
	switch {
	case err != nil:
		return nil, err
	case !ok:
		return nil, missing("response_format.type", `one of "text", "json_object", "json_schema"`)
	}
	switch typ {
	case FormatText:
		return nil, nil
	case FormatJSONObject:
		// llama-server's and vLLM's extension (instructor's JSON_SCHEMA
		// mode sends it): a schema beside json_object is enforced.
		raw, ok := rf.raw("schema")
		if !ok {
			return &ResponseFormat{Type: typ}, nil
		}
		if err := CheckSchema(rf.param("schema"), raw, false); err != nil {
			return nil, err
		}
		return &ResponseFormat{Type: typ, JSONSchema: &JSONSchema{Schema: raw}}, nil
	case FormatJSONSchema:
	default:
		return nil, Invalid("response_format.type", `response_format.type must be "text", "json_object" or "json_schema", got %q`, typ)
	}
	js, ok, err := rf.member("json_schema")
	switch {
	case err != nil:
		return nil, err
	case !ok:
		return nil, missing("response_format.json_schema", "the {name, schema, strict} of the JSON the output must be")
	}
	f := &ResponseFormat{Type: typ, JSONSchema: &JSONSchema{}}
	if f.JSONSchema.Name, ok, err = js.text("name"); err != nil {
		return nil, err
	} else if !ok || f.JSONSchema.Name == "" {
		return nil, missing(js.param("name"), "a name for the schema")
	}
	if f.JSONSchema.Description, _, err = js.text("description"); err != nil {
		return nil, err
	}
	if f.JSONSchema.Strict, err = js.boolean("strict"); err != nil {
		return nil, err
	}
	if raw, ok := js.raw("schema"); ok {
		if err := CheckSchema(js.param("schema"), raw, f.JSONSchema.Strict); err != nil {
			return nil, err
		}
		f.JSONSchema.Schema = raw
	}
	return f, nil
}

// checkCompletionOnly rejects the unsupported features of /v1/completions.
func checkCompletionOnly(o object) error {
	if v, err := o.integer("best_of"); err != nil {
		return err
	} else if v != nil && *v > 1 {
		return Unsupported("best_of", "best_of > 1 is not supported")
	} else if v != nil && *v < 1 {
		return Invalid("best_of", "best_of must be 1, got %d", *v)
	}
	if echo, err := o.boolean("echo"); err != nil {
		return err
	} else if echo {
		return Unsupported("echo", "echo is not supported")
	}
	if suffix, _, err := o.text("suffix"); err != nil {
		return err
	} else if suffix != "" {
		return Unsupported("suffix", "suffix (insertion) is not supported")
	}
	return nil
}

// checkChatOnly rejects the unsupported features of /v1/chat/completions.
func checkChatOnly(o object) error {
	if items, _, err := o.list("functions"); err != nil {
		return err
	} else if len(items) > 0 {
		return Unsupported("functions", "functions (the deprecated function calling) is not supported; use tools")
	}
	if r, ok := o.raw("function_call"); ok {
		var s string
		if json.Unmarshal(r, &s) != nil || (s != "none" && s != "auto") {
			return Unsupported("function_call", "function_call (the deprecated function calling) is not supported; use tool_choice")
		}
	}
	if _, ok := o.raw("audio"); ok {
		return Unsupported("audio", "audio output is not supported")
	}
	mods, _, err := o.list("modalities")
	if err != nil {
		return err
	}
	for i, m := range mods {
		var s string
		if json.Unmarshal(m, &s) != nil || s != "text" {
			return Unsupported(fmt.Sprintf("modalities[%d]", i), "only the \"text\" modality is supported")
		}
	}
	return nil
}

// MaxTools bounds the tools of one request.
const MaxTools = 128

// decodeTools reads tools, tool_choice and parallel_tool_calls. The
// parameters of a function the answer is forced to call must be in the
// supported schema subset (CheckSchema): the call is made with a grammar
// built from them.
func decodeTools(o object, req *ChatCompletionRequest) error {
	items, _, err := o.list("tools")
	if err != nil {
		return err
	}
	if len(items) > MaxTools {
		return Invalid("tools", "tools may hold at most %d functions, got %d", MaxTools, len(items))
	}
	names := map[string]int{}
	for i, item := range items {
		p := fmt.Sprintf("tools[%d]", i)
		var members map[string]json.RawMessage
		if err := json.Unmarshal(item, &members); err != nil || jsonKind(item) != "an object" {
			return typeError(p, "an object", item)
		}
		to := object{members: members, prefix: p + "."}
		typ, ok, err := to.text("type")
		switch {
		case err != nil:
			return err
		case !ok:
			return missing(to.param("type"), `"function"`)
		case typ != "function":
			return Unsupported(to.param("type"), "tools of type %q are not supported; only \"function\"", typ)
		}
		fo, ok, err := to.member("function")
		switch {
		case err != nil:
			return err
		case !ok:
			return missing(to.param("function"), "the {name, description, parameters} of the function")
		}
		t := Tool{Type: typ, Raw: item}
		name, ok, err := fo.text("name")
		switch {
		case err != nil:
			return err
		case !ok || name == "":
			return missing(fo.param("name"), "the function's name")
		case !validFunctionName(name):
			return Invalid(fo.param("name"), "function names are 1 to 64 letters, digits, _ and -; got %q", name)
		}
		if j, dup := names[name]; dup {
			return Invalid(fo.param("name"), "function %q is also tools[%d]", name, j)
		}
		names[name] = i
		t.Function.Name = name
		if t.Function.Description, _, err = fo.text("description"); err != nil {
			return err
		}
		if t.Function.Strict, err = fo.boolean("strict"); err != nil {
			return err
		}
		if r, ok := fo.raw("parameters"); ok {
			if jsonKind(r) != "an object" {
				return typeError(fo.param("parameters"), "a JSON schema object", r)
			}
			t.Function.Parameters = r
		}
		req.Tools = append(req.Tools, t)
	}
	if len(req.Tools) > 0 {
		req.ToolChoice.Mode = ToolChoiceAuto
	}
	if r, ok := o.raw("tool_choice"); ok {
		switch jsonKind(r) {
		case "a string":
			s, _, _ := o.text("tool_choice")
			switch s {
			case ToolChoiceNone, ToolChoiceAuto, ToolChoiceRequired:
				if len(req.Tools) > 0 || s == ToolChoiceRequired {
					req.ToolChoice.Mode = s
				}
			default:
				return Invalid("tool_choice", `tool_choice must be "none", "auto", "required" or {"type":"function","function":{"name":…}}, got %q`, s)
			}
		case "an object":
			co, _, _ := o.member("tool_choice")
			if typ, _, err := co.text("type"); err != nil {
				return err
			} else if typ != "function" {
				return Invalid(co.param("type"), `tool_choice.type must be "function", got %q`, typ)
			}
			fo, ok, err := co.member("function")
			if err != nil {
				return err
			}
			name := ""
			if ok {
				if name, _, err = fo.text("name"); err != nil {
					return err
				}
			}
			if name == "" {
				return missing("tool_choice.function.name", "the name of the function to call")
			}
			if _, ok := names[name]; !ok {
				return Invalid("tool_choice.function.name", "tool_choice names function %q, which is not in tools", name)
			}
			req.ToolChoice = ToolChoice{Mode: ToolChoiceFunction, Function: name}
		default:
			return typeError("tool_choice", `"none", "auto", "required" or an object`, r)
		}
	}
	if req.ToolChoice.Mode == ToolChoiceRequired && len(req.Tools) == 0 {
		return Invalid("tool_choice", `tool_choice "required" needs tools`)
	}
	if _, ok := o.raw("parallel_tool_calls"); ok {
		p, err := o.boolean("parallel_tool_calls")
		if err != nil {
			return err
		}
		if len(req.Tools) > 0 {
			req.ParallelToolCalls = &p
		}
	}
	if req.ToolChoice.Forced() {
		for i, t := range req.Tools {
			if len(t.Function.Parameters) == 0 || (req.ToolChoice.Mode == ToolChoiceFunction && t.Function.Name != req.ToolChoice.Function) {
				continue
			}
			if err := CheckSchema(fmt.Sprintf("tools[%d].function.parameters", i), t.Function.Parameters, t.Function.Strict); err != nil {
				return err
			}
		}
	}
	return nil
}

// ForcedTools are the tools a forced tool_choice picks from: the named
// one, or all of them for "required"; nil when the choice is not forced.
func (r ChatCompletionRequest) ForcedTools() []Tool {
	switch r.ToolChoice.Mode {
	case ToolChoiceRequired:
		return r.Tools
	case ToolChoiceFunction:
		for _, t := range r.Tools {
			if t.Function.Name == r.ToolChoice.Function {
				return []Tool{t}
			}
		}
	}
	return nil
}

func validFunctionName(s string) bool {
	if len(s) > 64 {
		return false
	}
	for _, c := range s {
		if !(c == '_' || c == '-' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}
