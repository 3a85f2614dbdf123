package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/apiary-llm/apiary/internal/openai"
)

// RequestError is a refused request whose HTTP status and snake_case code
// are known where it is refused; the daemons' error mappers answer it as
// {"error":{"code","message"}}.
type RequestError struct {
	Status int
	Code   string
	Err    error
}

func (e *RequestError) Error() string     { return e.Err.Error() }
func (e *RequestError) Unwrap() error     { return e.Err }
func (e *RequestError) HTTPStatus() int   { return e.Status }
func (e *RequestError) ErrorCode() string { return e.Code }

// StatusOf is the HTTP status and code err carries (openai.Coded, found
// with errors.As however deeply it is wrapped); a body over the limit is
// 413 body_too_large; anything else is 500 internal_error.
func StatusOf(err error) (int, string) {
	var c openai.Coded
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &c):
		return c.HTTPStatus(), c.ErrorCode()
	case errors.As(err, &mbe):
		return http.StatusRequestEntityTooLarge, "body_too_large"
	}
	return http.StatusInternalServerError, "internal_error"
}

// Fail answers err as {"error":{…}} with the status and code it carries.
// An internal error (500) says only that something failed and that the
// log of who has the details.
func Fail(w http.ResponseWriter, err error, who string) {
	e := FailLine(err, who)
	var r interface{ RetryAfter() time.Duration }
	if errors.As(err, &r) && r.RetryAfter() > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(r.RetryAfter().Seconds()))))
	}
	WriteError(w, e.Status, e.Error.Code, e.Error.Message)
}

// LineError is an error answered as one line of a stream of JSON answers
// (a hive's heartbeat stream): the error shape, and the status the same
// request would have been answered with alone.
type LineError struct {
	Error  ErrorDetail `json:"error"`
	Status int         `json:"status"`
}

// FailLine is what Fail answers, as one line of a stream.
func FailLine(err error, who string) LineError {
	status, code := StatusOf(err)
	msg := err.Error()
	if status == http.StatusInternalServerError {
		msg = "internal error; see the " + who + "'s log"
	}
	return LineError{Status: status, Error: ErrorDetail{Code: code, Message: msg, Type: openai.TypeFor(status)}}
}

// BadRequest is a 400 invalid_request with a formatted message.
func BadRequest(format string, a ...any) error {
	return &RequestError{Status: http.StatusBadRequest, Code: "invalid_request", Err: fmt.Errorf(format, a...)}
}

// MaxRemoteMessage bounds an error message taken from another process's
// answer before it reaches a log, the audit log or a client.
const MaxRemoteMessage = 512

// RemoteError reads another apiary process's error answer: the code and
// message of an {"error":{…}} body, the message cut to MaxRemoteMessage
// bytes of printable text. A body of any other shape is not passed on:
// the detail then names only the status.
func RemoteError(status int, body []byte) ErrorDetail {
	var e Error
	if json.Unmarshal(body, &e) != nil || e.Error.Code == "" || e.Error.Message == "" {
		return ErrorDetail{Code: "unexpected_answer", Message: fmt.Sprintf("answered %d %s with a body that is not an error object", status, http.StatusText(status))}
	}
	return ErrorDetail{Code: Printable(e.Error.Code, 64), Message: Printable(e.Error.Message, MaxRemoteMessage)}
}

// Printable is s cut to at most max bytes (on a rune boundary, with "…"
// when cut) with every control character, C1 code, bidirectional override
// and invalid byte replaced by U+FFFD: text from another process that
// reaches a terminal, a log or the audit log can then neither rewrite the
// screen nor hide what it says.
func Printable(s string, max int) string {
	if len(s) <= max && clean(s) {
		return s // most text is: no copy
	}
	var b strings.Builder
	for i, r := range s {
		if b.Len()+utf8.RuneLen(r) > max {
			b.WriteString("…")
			break
		}
		if !unicode.IsPrint(r) && r != ' ' || r == utf8.RuneError && isInvalidAt(s, i) || isBidi(r) {
			r = utf8.RuneError
		}
		b.WriteRune(r)
	}
	return b.String()
}

// clean reports whether Printable keeps every rune of s as it is.
func clean(s string) bool {
	for i, r := range s {
		if !unicode.IsPrint(r) && r != ' ' || r == utf8.RuneError && isInvalidAt(s, i) || isBidi(r) {
			return false
		}
	}
	return true
}

func isInvalidAt(s string, i int) bool {
	r, n := utf8.DecodeRuneInString(s[i:])
	return r == utf8.RuneError && n <= 1
}

func isBidi(r rune) bool {
	return r >= 0x202A && r <= 0x202E || r >= 0x2066 && r <= 0x2069 || r == 0x200E || r == 0x200F
}
