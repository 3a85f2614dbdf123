package api

import (
	"fmt"
	"net/http"
)

// RequestError is a refused request whose HTTP status and snake_case code
// are known where it is refused; the daemons' error mappers answer it as
// {"error":{"code","message"}}.
type RequestError struct {
	Status int
	Code   string
	Err    error
}

func (e *RequestError) Error() string { return e.Err.Error() }
func (e *RequestError) Unwrap() error { return e.Err }

// BadRequest is a 400 invalid_request with a formatted message.
func BadRequest(format string, a ...any) error {
	return &RequestError{Status: http.StatusBadRequest, Code: "invalid_request", Err: fmt.Errorf(format, a...)}
}
