package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strings"
	"sync"

	"github.com/apiary-llm/apiary/internal/openai"
)

// Bearer is the token of r's "Authorization: Bearer …" header, or "".
// The scheme is matched in any case, as RFC 7235 has it ("bearer T" and
// "BEARER T" carry T too), and the spaces around the token are not part
// of it. Every daemon's token check reads the bearer here.
func Bearer(r *http.Request) string {
	scheme, token, ok := strings.Cut(strings.TrimSpace(r.Header.Get("Authorization")), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return ""
	}
	return strings.TrimSpace(token)
}

// Decode reads r's body as one JSON object, strictly: unknown fields are
// a 400 (BadRequest), and so is anything after the object. An empty body
// leaves dst as it is when allowEmpty. A body over the server's limit
// returns the *http.MaxBytesError for the caller's mapper (413).
func Decode(r *http.Request, dst any, allowEmpty bool) error {
	buf := bodyBuffers.Get().(*bytes.Buffer)
	defer putBodyBuffer(buf)
	_, err := buf.ReadFrom(r.Body)
	b := buf.Bytes() // dst never holds on to it: the decoder copies what it keeps
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return err
		}
		return BadRequest("read body: %v", err)
	}
	if len(bytes.TrimSpace(b)) == 0 {
		if allowEmpty {
			return nil
		}
		return BadRequest("request body is empty; send a JSON object")
	}
	return DecodeBytes(b, dst)
}

// DecodeBytes decodes one JSON value from b into dst as Decode does a
// request body: unknown fields and trailing values refused, every
// error a 400 that says what was wrong.
func DecodeBytes(b []byte, dst any) error {
	if len(bytes.TrimSpace(b)) == 0 {
		return BadRequest("empty; send a JSON object")
	}
	if k, ok := dst.(knownBodies); ok && k.decodeKnown(bytes.TrimSpace(b)) {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		return BadRequest("invalid JSON body: %w", jsonProblem(err))
	}
	if dec.More() {
		return BadRequest("invalid JSON body: more than one value")
	}
	return nil
}

// LineDecoder decodes one JSON value a line, as DecodeBytes does, with
// one json.Decoder for all the lines of a stream: the decoder's buffer and
// state are made once, not for each line.
type LineDecoder struct {
	src     lineSource
	dec     *json.Decoder
	decoded int64 // the decoder's input offset after the last line
}

// lineSource gives a json.Decoder the current line, and an error past its
// end: the decoder reads further only for a value the line does not
// complete.
type lineSource struct{ line []byte }

func (l *lineSource) Read(p []byte) (int, error) {
	if len(l.line) == 0 {
		return 0, io.ErrUnexpectedEOF
	}
	n := copy(p, l.line)
	l.line = l.line[n:]
	return n, nil
}

// Decode decodes line (one JSON value, nothing after it) into dst.
func (d *LineDecoder) Decode(line []byte, dst any) error {
	trimmed := bytes.TrimSpace(line)
	if len(trimmed) == 0 {
		return BadRequest("empty; send a JSON object")
	}
	if k, ok := dst.(knownBodies); ok && k.decodeKnown(trimmed) {
		return nil
	}
	if d.dec == nil {
		d.dec = json.NewDecoder(&d.src)
		d.dec.DisallowUnknownFields()
	}
	d.src.line = trimmed
	err := d.dec.Decode(dst)
	rest := len(d.src.line) > 0 || d.dec.InputOffset() != d.decoded+int64(len(trimmed))
	d.decoded = d.dec.InputOffset()
	if err != nil || rest {
		// The decoder holds what it read of this line (and a syntax
		// error for good): the next line gets a new one.
		d.dec, d.decoded = nil, 0
		if err != nil {
			return BadRequest("invalid JSON body: %w", jsonProblem(err))
		}
		return BadRequest("invalid JSON body: more than one value")
	}
	return nil
}

// knownBodies is a request type some of whose bodies are sent often, byte
// for byte the same: decodeKnown sets the value of such a body without the
// JSON decoder (which costs a heartbeat more than the rest of its
// handling) and reports whether b was one; any other body is decoded.
type knownBodies interface {
	decodeKnown(b []byte) bool
}

// bodyBuffers are Decode's buffers, reused: a heartbeat a second from
// each of thousands of hives would otherwise grow a new one each.
var bodyBuffers = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// maxPooledBody bounds the buffers kept in bodyBuffers: one large body
// must not stay in memory after its request.
const maxPooledBody = 64 << 10

func putBodyBuffer(b *bytes.Buffer) {
	if b.Cap() > maxPooledBody {
		return
	}
	b.Reset()
	bodyBuffers.Put(b)
}

// StatusRecorder wraps a ResponseWriter and remembers the status written
// (0: none yet), for a handler's metrics, logs and error mapping. Unwrap
// keeps http.ResponseController (flushing) working through it.
type StatusRecorder struct {
	http.ResponseWriter
	Status int
}

func (s *StatusRecorder) WriteHeader(code int) {
	if s.Status == 0 {
		s.Status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *StatusRecorder) Write(b []byte) (int, error) {
	if s.Status == 0 {
		s.Status = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

// Code is the status the client got: 200 when nothing was written.
func (s *StatusRecorder) Code() int {
	if s.Status == 0 {
		return http.StatusOK
	}
	return s.Status
}

func (s *StatusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// WriteJSON answers v as JSON with status.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// WriteError answers {"error":{"code","message"}} with status; a 401
// also says how to authenticate.
func WriteError(w http.ResponseWriter, status int, code, message string) {
	if status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="apiary"`)
	}
	WriteJSON(w, status, Error{Error: ErrorDetail{Code: code, Message: message, Type: openai.TypeFor(status)}})
}

// jsonProblem says what is wrong with a JSON body in words: the errors of
// encoding/json start with its package name ("json: unknown field …") or
// name Go types ("Go struct field StartWorker.gpu of type int"). The cause
// stays wrapped.
func jsonProblem(err error) error {
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	var msg string
	switch {
	case errors.As(err, &te) && te.Field != "":
		msg = fmt.Sprintf("%s must be %s, not %s", te.Field, jsonKind(te.Type), te.Value)
	case errors.As(err, &te):
		msg = fmt.Sprintf("want %s, not %s", jsonKind(te.Type), te.Value)
	case errors.As(err, &se):
		msg = fmt.Sprintf("%s (at byte %d)", se.Error(), se.Offset)
	case errors.Is(err, io.ErrUnexpectedEOF):
		msg = "the JSON ends before its value does"
	default:
		msg = strings.TrimPrefix(err.Error(), "json: ")
	}
	return &jsonError{msg: msg, err: err}
}

type jsonError struct {
	msg string
	err error
}

func (e *jsonError) Error() string { return e.msg }
func (e *jsonError) Unwrap() error { return e.err }

// jsonKind names what a Go type takes in JSON.
func jsonKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "a whole number"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a whole number of 0 or more"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Map, reflect.Struct:
		return "an object"
	case reflect.Pointer:
		return jsonKind(t.Elem())
	}
	return "another kind of value"
}
