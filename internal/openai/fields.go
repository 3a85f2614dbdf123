package openai

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strconv"
)

// object is one decoded JSON object whose members are read by exact name
// (encoding/json's struct decoding would match names case-insensitively).
// prefix is prepended to member names in error params, e.g. "messages[2].".
type object struct {
	members map[string]json.RawMessage
	prefix  string
}

// parseBody parses a request body, which must be one JSON object.
func parseBody(body []byte) (object, error) {
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) == 0 {
		return object{}, &Error{Status: http.StatusBadRequest, Code: CodeInvalidJSON,
			Message: "request body is empty; send a JSON object", Err: ErrInvalidRequest}
	}
	if trimmed[0] != '{' {
		return object{}, &Error{Status: http.StatusBadRequest, Code: CodeInvalidJSON,
			Message: "request body must be a JSON object", Err: ErrInvalidRequest}
	}
	var members map[string]json.RawMessage
	if err := json.Unmarshal(trimmed, &members); err != nil {
		return object{}, &Error{Status: http.StatusBadRequest, Code: CodeInvalidJSON,
			Message: "request body is not valid JSON: " + err.Error(), Err: ErrInvalidRequest}
	}
	return object{members: members}, nil
}

func (o object) param(name string) string { return o.prefix + name }

// raw returns the member's JSON and whether it is present and not null.
func (o object) raw(name string) (json.RawMessage, bool) {
	r, ok := o.members[name]
	if !ok || isNull(r) {
		return nil, false
	}
	return r, true
}

func isNull(r json.RawMessage) bool { return string(bytes.TrimSpace(r)) == "null" }

// jsonKind names the JSON type of r for error messages.
func jsonKind(r json.RawMessage) string {
	r = bytes.TrimSpace(r)
	if len(r) == 0 {
		return "nothing"
	}
	switch r[0] {
	case '"':
		return "a string"
	case '{':
		return "an object"
	case '[':
		return "an array"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	default:
		return "a number"
	}
}

func typeError(param, want string, r json.RawMessage) *Error {
	return &Error{
		Status:  http.StatusBadRequest,
		Code:    CodeInvalidType,
		Param:   param,
		Message: fmt.Sprintf("%s must be %s, got %s", param, want, jsonKind(r)),
		Err:     ErrInvalidRequest,
	}
}

func missing(param, what string) *Error {
	return &Error{
		Status:  http.StatusBadRequest,
		Code:    CodeMissingParameter,
		Param:   param,
		Message: fmt.Sprintf("%s is required: %s", param, what),
		Err:     ErrInvalidRequest,
	}
}

// text reads a string member.
func (o object) text(name string) (string, bool, error) {
	r, ok := o.raw(name)
	if !ok {
		return "", false, nil
	}
	var s string
	if err := json.Unmarshal(r, &s); err != nil {
		return "", false, typeError(o.param(name), "a string", r)
	}
	return s, true, nil
}

// boolean reads a boolean member; absent or null is false.
func (o object) boolean(name string) (bool, error) {
	r, ok := o.raw(name)
	if !ok {
		return false, nil
	}
	var b bool
	if err := json.Unmarshal(r, &b); err != nil {
		return false, typeError(o.param(name), "a boolean", r)
	}
	return b, nil
}

// number reads a number member.
func (o object) number(name string) (*float64, error) {
	r, ok := o.raw(name)
	if !ok {
		return nil, nil
	}
	var n json.Number
	if err := json.Unmarshal(r, &n); err != nil || jsonKind(r) != "a number" {
		return nil, typeError(o.param(name), "a number", r)
	}
	f, err := strconv.ParseFloat(string(n), 64)
	if err != nil {
		return nil, Invalid(o.param(name), "%s is out of range", o.param(name))
	}
	return &f, nil
}

// maxExactInt is the largest integer a float64 holds exactly (2^53).
const maxExactInt = 1 << 53

// integer reads an integer member. Integral numbers written with a fraction or
// an exponent (100.0, 1e3) are accepted, as lenient OpenAI servers do.
func (o object) integer(name string) (*int64, error) {
	r, ok := o.raw(name)
	if !ok {
		return nil, nil
	}
	var n json.Number
	if err := json.Unmarshal(r, &n); err != nil || jsonKind(r) != "a number" {
		return nil, typeError(o.param(name), "an integer", r)
	}
	if i, err := strconv.ParseInt(string(n), 10, 64); err == nil {
		return &i, nil
	}
	f, err := strconv.ParseFloat(string(n), 64)
	switch {
	case err != nil || math.Abs(f) > maxExactInt:
		return nil, Invalid(o.param(name), "%s is out of range, got %s", o.param(name), n)
	case f != math.Trunc(f):
		return nil, &Error{Status: http.StatusBadRequest, Code: CodeInvalidType, Param: o.param(name),
			Message: fmt.Sprintf("%s must be an integer, got %s", o.param(name), n), Err: ErrInvalidRequest}
	}
	i := int64(f)
	return &i, nil
}

// member reads an object member.
func (o object) member(name string) (object, bool, error) {
	r, ok := o.raw(name)
	if !ok {
		return object{}, false, nil
	}
	var members map[string]json.RawMessage
	if err := json.Unmarshal(r, &members); err != nil {
		return object{}, false, typeError(o.param(name), "an object", r)
	}
	return object{members: members, prefix: o.param(name) + "."}, true, nil
}

// list reads an array member.
func (o object) list(name string) ([]json.RawMessage, bool, error) {
	r, ok := o.raw(name)
	if !ok {
		return nil, false, nil
	}
	var items []json.RawMessage
	if err := json.Unmarshal(r, &items); err != nil {
		return nil, false, typeError(o.param(name), "an array", r)
	}
	return items, true, nil
}

// inRange checks lo ≤ v ≤ hi (or lo < v when openLo).
func inRange(param string, v *float64, lo, hi float64, openLo bool) error {
	if v == nil {
		return nil
	}
	if math.IsNaN(*v) || *v > hi || *v < lo || (openLo && *v == lo) {
		lb := "["
		if openLo {
			lb = "("
		}
		return Invalid(param, "%s must be in %s%g, %g], got %g", param, lb, lo, hi, *v)
	}
	return nil
}
