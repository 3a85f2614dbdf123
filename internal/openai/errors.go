package openai

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Sentinel errors. An *Error built by this package unwraps to one of them, so
// callers can branch with errors.Is without caring about the message.
var (
	// ErrInvalidRequest means the request body or a field in it is wrong.
	ErrInvalidRequest = errors.New("invalid request")
	// ErrUnsupported means the request asks for a feature this server does
	// not implement (n > 1, tools, logprobs, …).
	ErrUnsupported = errors.New("unsupported feature")
	// ErrBodyTooLarge means the body exceeded the configured limit.
	ErrBodyTooLarge = errors.New("request body too large")
)

// Error types, as OpenAI names them in error.type.
const (
	TypeInvalidRequest = "invalid_request_error"
	TypeServer         = "server_error"
	TypeRateLimit      = "rate_limit_error" // also used for "queue full"
	TypeAuthentication = "authentication_error"
	TypeNotFound       = "not_found_error"
)

// Error codes used by this package. Servers add their own (model_loading,
// draining, queue_full, …); any snake_case string is valid.
const (
	CodeInvalidJSON        = "invalid_json"
	CodeInvalidType        = "invalid_type"
	CodeInvalidValue       = "invalid_value"
	CodeMissingParameter   = "missing_required_parameter"
	CodeUnsupported        = "unsupported_parameter"
	CodeBodyTooLarge       = "body_too_large"
	CodeContextLength      = "context_length_exceeded"
	CodeModelNotFound      = "model_not_found"
	CodeNotFound           = "not_found"
	CodeMethodNotAllowed   = "method_not_allowed"
	CodeUnauthorized       = "unauthorized"
	CodeInternal           = "internal_error"
	CodeServiceUnavailable = "service_unavailable"
)

// Error is an API error: an HTTP status plus the body
// {"error":{"code","message","type","param"}}. Handlers return it (wrapped or
// not); WriteError turns it into a response.
type Error struct {
	Status  int    // HTTP status; 500 when zero
	Code    string // snake_case, machine readable
	Type    string // OpenAI error.type; derived from Status when empty
	Param   string // the request field at fault, e.g. "messages[1].content"
	Message string // one clear sentence for a person
	// RetryAfter, when positive, is sent as the Retry-After header (whole
	// seconds, rounded up).
	RetryAfter time.Duration
	// Err is the cause, for errors.Is/As; it is not shown to clients.
	Err error
}

func (e *Error) Error() string {
	if e.Param != "" {
		return fmt.Sprintf("%s (%s): %s", e.Code, e.Param, e.Message)
	}
	return fmt.Sprintf("%s: %s", e.Code, e.Message)
}

func (e *Error) Unwrap() error { return e.Err }

// status is e.Status, or 500 when unset.
func (e *Error) status() int {
	if e.Status == 0 {
		return http.StatusInternalServerError
	}
	return e.Status
}

// errorType is e.Type, or the type OpenAI uses for e's status.
func (e *Error) errorType() string {
	if e.Type != "" {
		return e.Type
	}
	return TypeFor(e.status())
}

// TypeFor is the error type OpenAI uses for an HTTP status.
func TypeFor(s int) string {
	switch {
	case s == http.StatusUnauthorized || s == http.StatusForbidden:
		return TypeAuthentication
	case s == http.StatusNotFound:
		return TypeNotFound
	case s == http.StatusTooManyRequests:
		return TypeRateLimit
	case s >= 500:
		return TypeServer
	default:
		return TypeInvalidRequest
	}
}

// ErrorObject is the JSON inside "error".
type ErrorObject struct {
	Code    string  `json:"code"`
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"` // null when no single field is at fault
}

// ErrorResponse is the body of every error answer and of the final SSE event
// of a stream that failed after it began.
type ErrorResponse struct {
	Error ErrorObject `json:"error"`
}

// Invalid returns a 400 invalid_value error naming param. The message is
// prefixed with "param: " unless it names param already.
func Invalid(param, format string, a ...any) *Error {
	return &Error{
		Status:  http.StatusBadRequest,
		Code:    CodeInvalidValue,
		Param:   param,
		Message: naming(param, fmt.Sprintf(format, a...)),
		Err:     ErrInvalidRequest,
	}
}

// Unsupported returns a 400 unsupported_parameter error naming param, like
// Invalid.
func Unsupported(param, format string, a ...any) *Error {
	return &Error{
		Status:  http.StatusBadRequest,
		Code:    CodeUnsupported,
		Param:   param,
		Message: naming(param, fmt.Sprintf(format, a...)),
		Err:     ErrUnsupported,
	}
}

// naming makes sure msg names param, so a person reading only the message
// knows which field to fix.
func naming(param, msg string) string {
	if param == "" || strings.Contains(msg, param) {
		return msg
	}
	return param + ": " + msg
}

// Coded is an error that carries its HTTP answer from where it is made:
// its status and snake_case code. Every apiary error writer finds it with
// one errors.As, however deeply it is wrapped, and answers with the
// outermost error's message; there are no tables that map errors to
// statuses. An error may also say its Retry-After (RetryAfter() time.Duration)
// and the request field at fault (ErrorParam() string).
type Coded interface {
	error
	HTTPStatus() int
	ErrorCode() string
}

// CodedError is a Coded error with a fixed message: the sentinels of the
// daemons (var ErrX = openai.Sentinel(http.StatusNotFound, "x_not_found",
// "no such x")), matched with errors.Is.
type CodedError struct {
	Status  int
	Code    string
	Message string
	Retry   time.Duration // Retry-After; 0: none
	Type    string        // OpenAI error.type; "": derived from Status
}

// Sentinel returns a CodedError.
func Sentinel(status int, code, message string) *CodedError {
	return &CodedError{Status: status, Code: code, Message: message}
}

func (e *CodedError) Error() string             { return e.Message }
func (e *CodedError) HTTPStatus() int           { return e.Status }
func (e *CodedError) ErrorCode() string         { return e.Code }
func (e *CodedError) RetryAfter() time.Duration { return e.Retry }
func (e *CodedError) ErrorType() string         { return e.Type }

// PublicError is an error with two texts: Error, for the log and the
// audit (file paths, addresses, lifecycle ids and other processes' words
// as they came), and Message, for an API client (the reason in words).
// It is made where both are known; AsError answers with Message.
type PublicError struct {
	Message string
	Err     error
}

func (e *PublicError) Error() string         { return e.Err.Error() }
func (e *PublicError) Unwrap() error         { return e.Err }
func (e *PublicError) PublicMessage() string { return e.Message }

// Public wraps err with the words an API client reads instead of its text.
func Public(err error, format string, a ...any) error {
	return &PublicError{Message: fmt.Sprintf(format, a...), Err: err}
}

// PublicText is what an API client reads of err: the public message of
// the first error in its chain that has one (PublicMessage() string),
// else err's text.
func PublicText(err error) string {
	var p interface{ PublicMessage() string }
	if errors.As(err, &p) {
		return p.PublicMessage()
	}
	return err.Error()
}

// hasPublic says whether err's chain has a public message.
func hasPublic(err error) bool {
	var p interface{ PublicMessage() string }
	return errors.As(err, &p)
}

// HTTPStatus makes *Error a Coded error.
func (e *Error) HTTPStatus() int { return e.status() }

// ErrorCode makes *Error a Coded error.
func (e *Error) ErrorCode() string { return e.Code }

// AsError converts any error into an *Error: an *Error found with errors.As
// is returned as is; any other Coded error gives its status, code (and
// Retry-After, param and type when it has them) with its public text
// (PublicText: the public message its chain carries, else the outermost
// error's message); a body over the limit becomes 413; a deadline that
// passed becomes 504 timeout (its public message, or only that it timed
// out: the text of a call that timed out names where it went); anything
// else becomes an opaque 500 (the cause is kept in Err for logging, not
// shown).
func AsError(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	var c Coded
	if errors.As(err, &c) {
		out := &Error{Status: c.HTTPStatus(), Code: c.ErrorCode(), Message: PublicText(err), Err: err}
		var r interface{ RetryAfter() time.Duration }
		if errors.As(err, &r) {
			out.RetryAfter = r.RetryAfter()
		}
		var p interface{ ErrorParam() string }
		if errors.As(err, &p) {
			out.Param = p.ErrorParam()
		}
		var t interface{ ErrorType() string }
		if errors.As(err, &t) {
			out.Type = t.ErrorType()
		}
		return out
	}
	if errors.Is(err, context.DeadlineExceeded) {
		msg := "the request timed out"
		if hasPublic(err) {
			msg = PublicText(err)
		}
		return &Error{Status: http.StatusGatewayTimeout, Code: "timeout", Type: TypeServer, Message: msg, Err: err}
	}
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return &Error{
			Status:  http.StatusRequestEntityTooLarge,
			Code:    CodeBodyTooLarge,
			Message: fmt.Sprintf("request body is larger than the limit of %d bytes", mbe.Limit),
			Err:     errors.Join(ErrBodyTooLarge, err),
		}
	}
	return &Error{
		Status:  http.StatusInternalServerError,
		Code:    CodeInternal,
		Message: "internal server error",
		Err:     err,
	}
}

// Response returns the JSON body for err (see AsError).
func Response(err error) ErrorResponse {
	e := AsError(err)
	obj := ErrorObject{Code: e.Code, Message: e.Message, Type: e.errorType()}
	if e.Param != "" {
		obj.Param = &e.Param
	}
	return ErrorResponse{Error: obj}
}

// WriteError is the one mapper from a handler error to an HTTP answer:
// status, Retry-After when set, and {"error":{…}}. It returns the status it
// wrote, for access logs.
func WriteError(w http.ResponseWriter, err error) int {
	return WriteErrorAs(w, err, func(e *Error) any { return Response(e) })
}

// WriteErrorAs is WriteError with the body in another API's shape (body
// builds it from the error).
func WriteErrorAs(w http.ResponseWriter, err error, body func(*Error) any) int {
	e := AsError(err)
	if e.RetryAfter > 0 {
		secs := int64((e.RetryAfter + time.Second - 1) / time.Second)
		w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
	}
	status := e.status()
	if status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="apiary"`)
	}
	WriteJSON(w, status, body(e))
	return status
}

// WriteJSON writes v as a JSON body with status.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		// Only programming errors get here (the types are ours).
		status = http.StatusInternalServerError
		body = []byte(`{"error":{"code":"internal_error","message":"cannot encode response","type":"server_error","param":null}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)+1))
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}
