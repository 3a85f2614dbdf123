// Package anthropic is the wire format of Anthropic's Messages API (POST
// /v1/messages) as apiary serves it: request decoding into the chat
// messages and sampling parameters the OpenAI side uses, the answer and
// its stream events, and errors in Anthropic's shape. Tools are not
// supported in this API yet: a request with them is refused with a 400.
package anthropic

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/apiary-llm/apiary/internal/openai"
)

// Stop reasons.
const (
	StopEndTurn      = "end_turn"
	StopMaxTokens    = "max_tokens"
	StopSequenceHit  = "stop_sequence"
	ContentTypeText  = "text"
	ObjectMessage    = "message"
	RoleAssistant    = "assistant"
	eventErrorObject = "error"
)

// Request is a decoded, validated POST /v1/messages body: the system
// prompt (first, as a system message) and the turns as chat messages, and
// the sampling parameters in the OpenAI side's terms.
type Request struct {
	Model    string
	Messages []openai.ChatMessage
	// Tools and ToolChoice are the request's tools as chat completions
	// take them (input_schema as parameters; tool_choice any is required,
	// tool a named function); ParallelToolCalls is false with
	// disable_parallel_tool_use.
	Tools             []openai.Tool
	ToolChoice        openai.ToolChoice
	ParallelToolCalls *bool
	openai.Sampling
}

// StopToolUse is the stop_reason of an answer that is tool calls.
const StopToolUse = "tool_use"

// Usage counts tokens.
type Usage struct {
	InputTokens  int `json:"input_tokens"` // not counting those read from the cache
	OutputTokens int `json:"output_tokens"`
	// CacheReadInputTokens are the input tokens found in the cache.
	CacheReadInputTokens int `json:"cache_read_input_tokens"`
}

// NewUsage is the usage of an answer to prompt tokens, cached of them
// found in the cache, and completion tokens: input_tokens counts the
// others, as Anthropic's does.
func NewUsage(prompt, cached, completion int) Usage {
	return Usage{InputTokens: prompt - cached, OutputTokens: completion, CacheReadInputTokens: cached}
}

// ContentBlock is one block of an answer: text, or a tool_use (a call).
type ContentBlock struct {
	Type  string          `json:"type"` // "text" or "tool_use"
	Text  string          `json:"text"`
	ID    string          `json:"id"`
	Name  string          `json:"name"`
	Input json.RawMessage `json:"input"`
}

// Block types.
const (
	ContentTypeToolUse = "tool_use"
)

// MarshalJSON writes a text block as {type, text} and a tool_use block as
// {type, id, name, input}.
func (b ContentBlock) MarshalJSON() ([]byte, error) {
	if b.Type == ContentTypeToolUse {
		input := b.Input
		if len(input) == 0 {
			input = json.RawMessage("{}")
		}
		return json.Marshal(struct {
			Type  string          `json:"type"`
			ID    string          `json:"id"`
			Name  string          `json:"name"`
			Input json.RawMessage `json:"input"`
		}{b.Type, b.ID, b.Name, input})
	}
	return json.Marshal(struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}{b.Type, b.Text})
}

// NewToolUseID returns a fresh "toolu_…" id.
func NewToolUseID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return "toolu_" + hex.EncodeToString(b[:])
}

// Message is the answer of POST /v1/messages, and the message of a
// stream's message_start event (Content empty, StopReason null).
type Message struct {
	ID           string         `json:"id"`
	Type         string         `json:"type"` // "message"
	Role         string         `json:"role"` // "assistant"
	Model        string         `json:"model"`
	Content      []ContentBlock `json:"content"`
	StopReason   *string        `json:"stop_reason"`
	StopSequence *string        `json:"stop_sequence"`
	Usage        Usage          `json:"usage"`
}

// NewMessageID returns a fresh "msg_…" id.
func NewMessageID() string {
	var b [12]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return "msg_" + hex.EncodeToString(b[:])
}

// StopReason is the stop_reason of an OpenAI-side finish reason; stop is
// the stop sequence that matched, if one did.
func StopReason(finish, stop string) string {
	switch {
	case stop != "":
		return StopSequenceHit
	case finish == openai.FinishLength:
		return StopMaxTokens
	}
	return StopEndTurn
}

// Stream events, in the order a stream sends them: message_start,
// content_block_start, ping, content_block_delta…, content_block_stop,
// message_delta, message_stop.
type (
	MessageStart struct {
		Type    string  `json:"type"` // "message_start"
		Message Message `json:"message"`
	}
	ContentBlockStart struct {
		Type         string       `json:"type"` // "content_block_start"
		Index        int          `json:"index"`
		ContentBlock ContentBlock `json:"content_block"`
	}
	Ping struct {
		Type string `json:"type"` // "ping"
	}
	ContentBlockDelta struct {
		Type  string    `json:"type"` // "content_block_delta"
		Index int       `json:"index"`
		Delta TextDelta `json:"delta"`
	}
	TextDelta struct {
		Type string `json:"type"` // "text_delta"
		Text string `json:"text"`
	}
	ContentBlockStop struct {
		Type  string `json:"type"` // "content_block_stop"
		Index int    `json:"index"`
	}
	MessageDelta struct {
		Type  string          `json:"type"` // "message_delta"
		Delta MessageDeltaEnd `json:"delta"`
		Usage Usage           `json:"usage"`
	}
	MessageDeltaEnd struct {
		StopReason   string  `json:"stop_reason"`
		StopSequence *string `json:"stop_sequence"`
	}
	MessageStop struct {
		Type string `json:"type"` // "message_stop"
	}
)

// ErrorBody is an error answer, and the data of a stream's error event.
type ErrorBody struct {
	Type  string      `json:"type"` // "error"
	Error ErrorDetail `json:"error"`
}

// ErrorDetail is the error inside ErrorBody.
type ErrorDetail struct {
	Type    string `json:"type"`
	Message string `json:"message"`
}

// Error types, as Anthropic names them.
const (
	TypeInvalidRequest = "invalid_request_error"
	TypeAuthentication = "authentication_error"
	TypePermission     = "permission_error"
	TypeNotFound       = "not_found_error"
	TypeRequestTooBig  = "request_too_large"
	TypeRateLimit      = "rate_limit_error"
	TypeAPI            = "api_error"
	TypeOverloaded     = "overloaded_error"
)

// TypeFor is the Anthropic error type of an HTTP status.
func TypeFor(status int) string {
	switch {
	case status == http.StatusUnauthorized:
		return TypeAuthentication
	case status == http.StatusForbidden:
		return TypePermission
	case status == http.StatusNotFound:
		return TypeNotFound
	case status == http.StatusRequestEntityTooLarge:
		return TypeRequestTooBig
	case status == http.StatusTooManyRequests:
		return TypeRateLimit
	case status == http.StatusServiceUnavailable || status == 529:
		return TypeOverloaded
	case status >= 500:
		return TypeAPI
	}
	return TypeInvalidRequest
}

// Body is err as Anthropic's error body: its type from the error's
// status, its message the error's (naming the field at fault).
func Body(err error) ErrorBody {
	e := openai.AsError(err)
	status := e.HTTPStatus()
	msg := e.Message
	if e.Param != "" && msg == "" {
		msg = e.Param + " is invalid"
	}
	return ErrorBody{Type: eventErrorObject, Error: ErrorDetail{Type: TypeFor(status), Message: msg}}
}

// WriteError writes err in Anthropic's shape with its status (and
// Retry-After when it has one); it returns the status.
func WriteError(w http.ResponseWriter, err error) int {
	e := openai.AsError(err)
	if e.RetryAfter > 0 {
		secs := int64((e.RetryAfter + time.Second - 1) / time.Second)
		w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
	}
	status := e.HTTPStatus()
	openai.WriteJSON(w, status, Body(e))
	return status
}

// ParseError reads an error body in Anthropic's shape; ok is false for
// anything else.
func ParseError(data []byte) (ErrorDetail, bool) {
	var b ErrorBody
	if json.Unmarshal(data, &b) != nil || b.Type != eventErrorObject || b.Error.Type == "" || b.Error.Message == "" {
		return ErrorDetail{}, false
	}
	return b.Error, true
}

// ErrUnsupported is wrapped by refusals of features this API does not
// serve (tools, images, …).
var ErrUnsupported = errors.New("unsupported feature")
