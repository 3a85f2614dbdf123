// Package translate serves another API's answers from a worker's OpenAI
// answer: a Writer is the http.ResponseWriter a chat completion (or
// completion, or embeddings) answer is written to, and it writes the
// other API's answer — Ollama's (internal/ollama), the Responses API's
// (internal/responses) — to the real one, a stream event by event.
package translate

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/openai"
)

// Translator turns a worker's OpenAI answer into another API's: each
// event of a stream (its data: the event's data lines, joined), or a whole
// body (internal/ollama, internal/responses).
type Translator interface {
	Event(data []byte, now time.Time) (out [][]byte, last bool, err error)
	Whole(data []byte, now time.Time) ([]byte, error)
}

// Dialect is how a translated answer is framed.
type Dialect struct {
	ContentType string                                               // of a stream
	Frame       func([]byte) []byte                                  // one translated piece as written
	ErrorEvent  func(msg string) []byte                              // a stream's closing error, framed
	HeldError   func(w http.ResponseWriter, status int, held []byte) // the worker's error answer, rewritten
}

// Writer is the ResponseWriter the relay writes the worker's
// OpenAI answer to: it writes the translated answer to w instead. An
// error answer and a whole body are held until finish; a stream's events
// are translated as they come, each flushed at once.
type Writer struct {
	w       http.ResponseWriter
	answer  Translator
	dialect Dialect
	header  http.Header
	status  int
	held    bytes.Buffer // an error answer, a whole body, or a part of an event
	lines   bool         // translated pieces went out
	ended   bool         // the last piece went out
	err     error
}

// New is the Writer of answer's translation to w, framed as d.
func New(w http.ResponseWriter, answer Translator, d Dialect) *Writer {
	return &Writer{w: w, answer: answer, dialect: d}
}

// ErrClientGone wraps a failed write to the client.
var ErrClientGone = errors.New("the client went away")

// maxHeld bounds what the writer holds of a whole answer (an embedding
// list of 2048 inputs is the largest: well under this).
const maxHeld = 256 << 20

func (o *Writer) Header() http.Header {
	if o.header == nil {
		o.header = http.Header{}
	}
	return o.header
}

func (o *Writer) WriteHeader(status int) {
	if o.status == 0 {
		o.status = status
	}
}

func (o *Writer) Write(p []byte) (int, error) {
	if o.status == 0 {
		o.status = http.StatusOK
	}
	if o.err != nil {
		return 0, o.err
	}
	if o.held.Len()+len(p) > maxHeld {
		o.err = fmt.Errorf("the worker's answer is over %d bytes", maxHeld)
		return 0, o.err
	}
	o.held.Write(p)
	if o.status != http.StatusOK || !strings.HasPrefix(o.Header().Get("Content-Type"), "text/event-stream") {
		return len(p), nil
	}
	// Events end with a blank line; translate each whole one.
	for {
		buf := o.held.Bytes()
		i := bytes.Index(buf, []byte("\n\n"))
		if i < 0 {
			break
		}
		ev := append([]byte(nil), buf[:i]...)
		o.held.Next(i + 2)
		if err := o.event(ev); err != nil {
			o.err = err
			return 0, err
		}
	}
	return len(p), nil
}

// event translates one SSE event and writes what it makes.
func (o *Writer) event(ev []byte) error {
	if o.ended {
		return nil
	}
	var data []byte
	for _, l := range bytes.Split(ev, []byte("\n")) {
		if d, ok := bytes.CutPrefix(bytes.TrimRight(l, "\r"), []byte("data:")); ok {
			data = append(data, bytes.TrimSpace(d)...)
		}
	}
	if len(data) == 0 {
		return nil // a comment or a named event without data
	}
	pieces, last, err := o.answer.Event(data, time.Now())
	var framed [][]byte
	for _, p := range pieces {
		framed = append(framed, o.dialect.Frame(p))
	}
	if err != nil {
		framed, last = append(framed, o.dialect.ErrorEvent(err.Error())), true
	}
	if len(framed) == 0 {
		return nil
	}
	if !o.lines {
		o.lines = true
		o.w.Header().Set("Content-Type", o.dialect.ContentType)
		o.w.Header().Set("Cache-Control", "no-cache")
		o.w.Header().Set("X-Accel-Buffering", "no")
		if v := o.Header().Get(api.WorkerHeader); v != "" {
			o.w.Header().Set(api.WorkerHeader, v)
		}
		o.w.WriteHeader(http.StatusOK)
	}
	for _, f := range framed {
		if _, err := o.w.Write(f); err != nil {
			return fmt.Errorf("%w: %w", ErrClientGone, err)
		}
	}
	o.ended = last
	if err := http.NewResponseController(o.w).Flush(); err != nil {
		return fmt.Errorf("%w: %w", ErrClientGone, err)
	}
	return nil
}

// Unwrap lets http.ResponseController reach the client's writer (write
// deadlines).
func (o *Writer) Unwrap() http.ResponseWriter { return o.w }

// Flush is the relay's flush of each event: the translation flushes
// what it writes.
func (o *Writer) Flush() {}

// Finish writes what was held: the worker's error, or the translated
// whole answer.
func (o *Writer) Finish() error {
	switch {
	case o.status == 0 || o.lines:
		return nil // nothing came (the caller answers the error), or a stream went out
	case o.status != http.StatusOK:
		for _, h := range []string{"Retry-After", "WWW-Authenticate"} {
			if v := o.Header().Get(h); v != "" {
				o.w.Header().Set(h, v)
			}
		}
		o.dialect.HeldError(o.w, o.status, o.held.Bytes())
		return nil
	case o.err != nil:
		return o.err
	}
	out, err := o.answer.Whole(o.held.Bytes(), time.Now())
	if err != nil {
		return &openai.Error{Status: http.StatusBadGateway, Code: "worker_failed", Type: openai.TypeServer, Message: err.Error()}
	}
	if v := o.Header().Get(api.WorkerHeader); v != "" {
		o.w.Header().Set(api.WorkerHeader, v)
	}
	o.w.Header().Set("Content-Type", "application/json")
	o.w.WriteHeader(http.StatusOK)
	_, err = o.w.Write(append(out, '\n'))
	return err
}
