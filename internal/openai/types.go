package openai

import (
	"crypto/rand"
	"encoding/hex"
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
	FinishStop   = "stop"
	FinishLength = "length"
)

// Chat roles accepted in requests. "developer" is OpenAI's newer name for
// "system"; decoding maps it to RoleSystem.
const (
	RoleSystem    = "system"
	RoleUser      = "user"
	RoleAssistant = "assistant"
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
	PresencePenalty  *float64       `json:"presence_penalty,omitempty"`
	FrequencyPenalty *float64       `json:"frequency_penalty,omitempty"`
	Stream           bool           `json:"stream,omitempty"`
	StreamOptions    *StreamOptions `json:"stream_options,omitempty"`
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
	Sampling
}

// ChatMessage is one message. Array content is flattened: its text parts are
// joined with "\n".
type ChatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// Usage counts tokens.
type Usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
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
}

// CompletionChoice is one choice of a Completion. FinishReason is null in
// stream chunks until the last one.
type CompletionChoice struct {
	Index        int       `json:"index"`
	Text         string    `json:"text"`
	Logprobs     *struct{} `json:"logprobs"` // always null
	FinishReason *string   `json:"finish_reason"`
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
}

// ChatChoice is one choice of a ChatCompletion.
type ChatChoice struct {
	Index        int         `json:"index"`
	Message      ChatMessage `json:"message"`
	Logprobs     *struct{}   `json:"logprobs"` // always null
	FinishReason string      `json:"finish_reason"`
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
	Index        int       `json:"index"`
	Delta        ChatDelta `json:"delta"`
	Logprobs     *struct{} `json:"logprobs"` // always null
	FinishReason *string   `json:"finish_reason"`
}

// ChatDelta is the change a chunk brings: the role in the first chunk, then
// content; empty in the last one.
type ChatDelta struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
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
