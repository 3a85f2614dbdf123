package openai

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"time"
)

// Object names, as OpenAI puts them in "object".
const (
	ObjectTextCompletion      = "text_completion"
	ObjectChatCompletion      = "chat.completion"
	ObjectChatCompletionChunk = "chat.completion.chunk"
	ObjectList                = "list"
	ObjectModel               = "model"
)

// Finish reasons.
const (
	FinishStop      = "stop"
	FinishLength    = "length"
	FinishToolCalls = "tool_calls"
)

// Chat roles accepted in requests. "developer" is OpenAI's newer name for
// "system"; decoding maps it to RoleSystem.
const (
	RoleSystem    = "system"
	RoleUser      = "user"
	RoleAssistant = "assistant"
	RoleTool      = "tool"
)

// Sampling holds the generation parameters both endpoints share. A nil
// pointer means "not given": the server applies its default. The struct
// marshals back to a valid request body (a router can forward it).
type Sampling struct {
	// MaxTokens bounds the completion length. On chat it is taken from
	// max_completion_tokens, or max_tokens when that is absent.
	MaxTokens   *int     `json:"max_tokens,omitempty"`
	Temperature *float64 `json:"temperature,omitempty"` // 0..2
	TopP        *float64 `json:"top_p,omitempty"`       // (0,1]
	TopK        *int     `json:"top_k,omitempty"`       // ≥ 0, llama.cpp extension
	MinP        *float64 `json:"min_p,omitempty"`       // 0..1, llama.cpp extension
	Seed        *int64   `json:"seed,omitempty"`
	// Stop holds up to MaxStop non-empty stop sequences.
	Stop []string `json:"stop,omitempty"`
	// IgnoreEOS keeps generating past the end-of-generation token
	// (llama.cpp extension).
	IgnoreEOS bool `json:"ignore_eos,omitempty"`
	// PresencePenalty and FrequencyPenalty are range-checked (-2..2) and
	// applied by llama.cpp's penalties sampler over the last 64 tokens.
	PresencePenalty  *float64 `json:"presence_penalty,omitempty"`
	FrequencyPenalty *float64 `json:"frequency_penalty,omitempty"`
	// RepeatPenalty (llama.cpp extension, (0, 10]; 1 is off) divides the
	// positive logits of tokens among the last 64 (multiplies the
	// negative ones).
	RepeatPenalty *float64 `json:"repeat_penalty,omitempty"`
	// LogitBias is added to the logits of the token ids it names, each
	// -100..100.
	LogitBias map[int]float64 `json:"logit_bias,omitempty"`
	// ResponseFormat constrains the output to JSON; nil or "text" is free text.
	ResponseFormat *ResponseFormat `json:"response_format,omitempty"`
	// Grammar is a GBNF grammar (llama.cpp extension, root rule "root")
	// the output must follow; not with a JSON response_format.
	Grammar string `json:"grammar,omitempty"`
	// N is the number of choices, 1..MaxChoices (0: 1).
	N int `json:"n,omitempty"`
	// Logprobs asks for each sampled token's log probability: chat's
	// logprobs:true, or a non-null logprobs on completions.
	Logprobs bool `json:"-"`
	// TopLogprobs is how many most likely tokens are reported with each
	// sampled one, 0..MaxTopLogprobs: chat's top_logprobs, completions'
	// logprobs.
	TopLogprobs   int            `json:"-"`
	Stream        bool           `json:"stream,omitempty"`
	StreamOptions *StreamOptions `json:"stream_options,omitempty"`
}

// Choices returns how many choices the request asks for (at least 1).
func (s Sampling) Choices() int { return max(s.N, 1) }

// MaxChoices bounds n.
const MaxChoices = 16

// MaxTopLogprobs bounds top_logprobs (chat) and logprobs (completions).
const MaxTopLogprobs = 20

// Response format types.
const (
	FormatText       = "text"
	FormatJSONObject = "json_object"
	FormatJSONSchema = "json_schema"
)

// ResponseFormat is "response_format".
type ResponseFormat struct {
	Type       string      `json:"type"`
	JSONSchema *JSONSchema `json:"json_schema,omitempty"`
}

// JSONSchema is response_format.json_schema. Schema holds the schema as
// sent, already checked against the supported subset (see CheckSchema).
type JSONSchema struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Schema      json.RawMessage `json:"schema,omitempty"`
	Strict      bool            `json:"strict,omitempty"`
}

// Schema returns the JSON schema the output must follow, or nil when the
// format leaves the output free. json_object is {"type":"object"}, or
// the schema that came with it.
func (f *ResponseFormat) Schema() json.RawMessage {
	switch {
	case f == nil:
		return nil
	case f.Type == FormatJSONObject && f.JSONSchema != nil && len(f.JSONSchema.Schema) > 0:
		return f.JSONSchema.Schema
	case f.Type == FormatJSONObject:
		return json.RawMessage(`{"type":"object"}`)
	case f.Type == FormatJSONSchema && f.JSONSchema != nil:
		if len(f.JSONSchema.Schema) == 0 {
			return json.RawMessage(`{}`)
		}
		return f.JSONSchema.Schema
	}
	return nil
}

// IncludeUsage reports whether a stream should end with a usage chunk.
func (s Sampling) IncludeUsage() bool {
	return s.Stream && s.StreamOptions != nil && s.StreamOptions.IncludeUsage
}

// StreamOptions is "stream_options".
type StreamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// CompletionRequest is a decoded, validated POST /v1/completions body.
type CompletionRequest struct {
	Model  string `json:"model"`
	Prompt string `json:"prompt"` // from a string or an array of one string
	Sampling
}

// ChatCompletionRequest is a decoded, validated POST /v1/chat/completions body.
type ChatCompletionRequest struct {
	Model    string        `json:"model"`
	Messages []ChatMessage `json:"messages"`
	// Tools are the functions the model may call (type "function" only).
	Tools []Tool `json:"tools,omitempty"`
	// ToolChoice is tool_choice: "auto" by default with tools, the zero
	// value without.
	ToolChoice ToolChoice `json:"-"`
	// ParallelToolCalls is parallel_tool_calls, when sent with tools
	// (see Parallel).
	ParallelToolCalls *bool `json:"-"`
	Sampling
}

// Parallel reports whether the model may make several calls in one
// answer (parallel_tool_calls, default true). A named tool_choice is one
// call of that function, as OpenAI documents, whatever
// parallel_tool_calls says (the AI SDK ran the tool three times).
func (r ChatCompletionRequest) Parallel() bool {
	if r.ToolChoice.Mode == ToolChoiceFunction {
		return false
	}
	return r.ParallelToolCalls == nil || *r.ParallelToolCalls
}

// Tool choice modes.
const (
	ToolChoiceNone     = "none"
	ToolChoiceAuto     = "auto"
	ToolChoiceRequired = "required"
	// ToolChoiceFunction forces the function ToolChoice.Function names.
	ToolChoiceFunction = "function"
)

// ToolChoice is tool_choice: a mode, and the function of a named choice.
// The zero value (no tools) calls nothing.
type ToolChoice struct {
	Mode     string
	Function string
}

// Forced reports whether the answer must be a call.
func (c ToolChoice) Forced() bool {
	return c.Mode == ToolChoiceRequired || c.Mode == ToolChoiceFunction
}

// Tool is one entry of tools. Raw is the entry as sent.
type Tool struct {
	Type     string          `json:"type"`
	Function FunctionDef     `json:"function"`
	Raw      json.RawMessage `json:"-"`
}

// FunctionDef describes a function the model may call.
type FunctionDef struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters,omitempty"`
	Strict      bool            `json:"strict,omitempty"`
}

// ChatMessage is one message. Array content is flattened: its text parts are
// joined with "\n".
type ChatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
	// ToolCalls are an assistant message's function calls.
	ToolCalls []ToolCall `json:"tool_calls,omitempty"`
	// ToolCallID is the call a tool message answers.
	ToolCallID string `json:"tool_call_id,omitempty"`
	// Name is a tool message's function name, when sent.
	Name string `json:"name,omitempty"`
	// Images are a user message's pictures (image_url content parts), in
	// order; Content holds ImageMarker in the place of each.
	Images [][]byte `json:"-"`
}

// MarshalJSON writes an assistant's message of calls alone with content
// null, as OpenAI does (clients test for null, not "").
func (m ChatMessage) MarshalJSON() ([]byte, error) {
	type plain ChatMessage
	if m.Content == "" && len(m.ToolCalls) > 0 {
		return json.Marshal(struct {
			plain
			Content *string `json:"content"`
		}{plain: plain(m)})
	}
	return json.Marshal(plain(m))
}

// ToolCall is one function call, in a message or (with Index, and parts
// left out) in a stream chunk.
type ToolCall struct {
	Index    *int         `json:"index,omitempty"`
	ID       string       `json:"id,omitempty"`
	Type     string       `json:"type,omitempty"`
	Function FunctionCall `json:"function"`
}

// FunctionCall is a call's function: its name and its arguments, JSON text.
type FunctionCall struct {
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments"`
}

// NewToolCallID returns a fresh "call_…" id.
func NewToolCallID() string { return "call_" + randomHex() }

// Usage counts tokens.
type Usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
	// PromptTokensDetails, in generations' usage, says how many of the
	// prompt tokens a worker found in its cache.
	PromptTokensDetails *PromptTokensDetails `json:"prompt_tokens_details,omitempty"`
}

// PromptTokensDetails is OpenAI's breakdown of the prompt tokens.
type PromptTokensDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

// NewCachedUsage is NewUsage with cached of the prompt tokens taken from
// the worker's cache.
func NewCachedUsage(prompt, cached, completion int) *Usage {
	u := NewUsage(prompt, completion)
	u.PromptTokensDetails = &PromptTokensDetails{CachedTokens: cached}
	return u
}

// NewUsage fills TotalTokens.
func NewUsage(prompt, completion int) *Usage {
	return &Usage{PromptTokens: prompt, CompletionTokens: completion, TotalTokens: prompt + completion}
}

// Completion is a /v1/completions response, and (with Object
// "text_completion" as well, as OpenAI does) one chunk of its stream.
type Completion struct {
	ID                string             `json:"id"`
	Object            string             `json:"object"`
	Created           int64              `json:"created"`
	Model             string             `json:"model"`
	SystemFingerprint string             `json:"system_fingerprint,omitempty"`
	Choices           []CompletionChoice `json:"choices"`
	Usage             *Usage             `json:"usage,omitempty"`
	Timings           *Timings           `json:"timings,omitempty"` // a worker's whole answer: llama-server's timings
}

// CompletionChoice is one choice of a Completion. FinishReason is null in
// stream chunks until the last one.
type CompletionChoice struct {
	Index        int                 `json:"index"`
	Text         string              `json:"text"`
	Logprobs     *CompletionLogprobs `json:"logprobs"` // null unless asked for
	FinishReason *string             `json:"finish_reason"`
}

// CompletionLogprobs is the legacy logprobs shape of /v1/completions: one
// entry a token in each list. TopLogprobs maps a token's text to its
// log probability (tokens with the same text keep the likelier).
type CompletionLogprobs struct {
	Tokens        []string             `json:"tokens"`
	TokenLogprobs []float64            `json:"token_logprobs"`
	TopLogprobs   []map[string]float64 `json:"top_logprobs"`
	TextOffset    []int                `json:"text_offset"`
}

// ChatLogprobs is a chat choice's logprobs.
type ChatLogprobs struct {
	Content []TokenLogprob `json:"content"`
	Refusal []TokenLogprob `json:"refusal"`
}

// TokenLogprob is one sampled token with its log probability and the most
// likely tokens at its place.
type TokenLogprob struct {
	Token       string       `json:"token"`
	Logprob     float64      `json:"logprob"`
	Bytes       []int        `json:"bytes"`
	TopLogprobs []TopLogprob `json:"top_logprobs"`
}

// TopLogprob is one of the most likely tokens at a place.
type TopLogprob struct {
	Token   string  `json:"token"`
	Logprob float64 `json:"logprob"`
	Bytes   []int   `json:"bytes"`
}

// ChatCompletion is a /v1/chat/completions response.
type ChatCompletion struct {
	ID                string       `json:"id"`
	Object            string       `json:"object"`
	Created           int64        `json:"created"`
	Model             string       `json:"model"`
	SystemFingerprint string       `json:"system_fingerprint,omitempty"`
	Choices           []ChatChoice `json:"choices"`
	Usage             *Usage       `json:"usage,omitempty"`
	Timings           *Timings     `json:"timings,omitempty"` // a worker's whole answer: llama-server's timings
}

// ChatChoice is one choice of a ChatCompletion.
type ChatChoice struct {
	Index        int           `json:"index"`
	Message      ChatMessage   `json:"message"`
	Logprobs     *ChatLogprobs `json:"logprobs"` // null unless asked for
	FinishReason string        `json:"finish_reason"`
}

// ChatCompletionChunk is one event of a chat stream. The usage chunk has no
// choices.
type ChatCompletionChunk struct {
	ID                string            `json:"id"`
	Object            string            `json:"object"`
	Created           int64             `json:"created"`
	Model             string            `json:"model"`
	SystemFingerprint string            `json:"system_fingerprint,omitempty"`
	Choices           []ChatChunkChoice `json:"choices"`
	Usage             *Usage            `json:"usage,omitempty"`
}

// ChatChunkChoice is one choice of a chunk.
type ChatChunkChoice struct {
	Index        int           `json:"index"`
	Delta        ChatDelta     `json:"delta"`
	Logprobs     *ChatLogprobs `json:"logprobs"` // null unless asked for
	FinishReason *string       `json:"finish_reason"`
}

// ChatDelta is the change a chunk brings: the role in the first chunk, then
// content; empty in the last one.
type ChatDelta struct {
	Role      string     `json:"role,omitempty"`
	Content   *string    `json:"content,omitempty"`
	ToolCalls []ToolCall `json:"tool_calls,omitempty"`
}

// Model is one entry of GET /v1/models.
type Model struct {
	ID      string `json:"id"`
	Object  string `json:"object"` // "model"
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
	// AliasOf, on the queen's list, is the configured model this id is an
	// alias of (apiary's own field).
	AliasOf string `json:"alias_of,omitempty"`
	// Capabilities, on the queen's list, say what the model does beyond
	// text, as its hives list its file: "vision" (it has a projector:
	// images in chat messages), "rerank" (a reranker). Apiary's own
	// field; absent when none.
	Capabilities []string `json:"capabilities,omitempty"`
}

// ModelList is the GET /v1/models body.
type ModelList struct {
	Object string  `json:"object"` // "list"
	Data   []Model `json:"data"`
}

// NewCompletionID returns a fresh "cmpl-…" id.
func NewCompletionID() string { return "cmpl-" + randomHex() }

// NewChatCompletionID returns a fresh "chatcmpl-…" id.
func NewChatCompletionID() string { return "chatcmpl-" + randomHex() }

func randomHex() string {
	var b [12]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b[:])
}

// Timings is how long a worker spent on a request, in llama-server's
// shape (the "timings" object beside its answer's fields): the prompt
// until the first token, and the tokens after it. Clients that show
// speeds read it (Ollama's eval_duration is made from it).
type Timings struct {
	CacheN             int     `json:"cache_n"`  // prompt tokens found in the cache, not decoded
	PromptN            int     `json:"prompt_n"` // prompt tokens decoded
	PromptMS           float64 `json:"prompt_ms"`
	PredictedN         int     `json:"predicted_n"`
	PredictedMS        float64 `json:"predicted_ms"`
	PredictedPerSecond float64 `json:"predicted_per_second"`
}

// NewTimings is the Timings of a generation that began at start, gave
// its first token at first (zero: none) and ended at end.
func NewTimings(prompt, cached, predicted int, start, first, end time.Time) Timings {
	if first.IsZero() {
		first = end
	}
	t := Timings{CacheN: cached, PromptN: prompt - cached, PromptMS: ms(first.Sub(start)), PredictedN: predicted, PredictedMS: ms(end.Sub(first))}
	if t.PredictedMS > 0 {
		t.PredictedPerSecond = float64(predicted) / t.PredictedMS * 1000
	}
	return t
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
