package openai

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"
)

// SSEWriter writes an OpenAI-style Server-Sent Events stream: one
// "data: {json}\n\n" event per chunk, each flushed to the client at once,
// closed by "data: [DONE]\n\n" or, when the stream fails after it began, by
// one event carrying an "error" object.
type SSEWriter struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	started bool
	timeout time.Duration
}

// NewSSEWriter returns a writer on w. Nothing is sent until the first call.
func NewSSEWriter(w http.ResponseWriter) *SSEWriter {
	return &SSEWriter{w: w, rc: http.NewResponseController(w)}
}

// SetEventTimeout bounds how long writing one event may block: a client
// that stops reading makes the write fail after d instead of holding the
// handler (and its generation slot) forever. 0 means no bound.
func (s *SSEWriter) SetEventTimeout(d time.Duration) { s.timeout = d }

// Started reports whether the 200 header has been sent; after that, errors
// can only be reported in the stream (see Error).
func (s *SSEWriter) Started() bool { return s.started }

// Start sends the response header and flushes it, once.
func (s *SSEWriter) Start() error {
	if s.started {
		return nil
	}
	s.started = true
	h := s.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no") // keep reverse proxies from buffering
	if err := s.setDeadline(); err != nil {
		return err
	}
	s.w.WriteHeader(http.StatusOK)
	return s.flush()
}

// NamedEvent is an event with a name: an "event:" line comes before its
// data line, as Anthropic's streams have it.
type NamedEvent struct {
	Name string
	Data any
}

// Event sends v as one data event (a NamedEvent with its name) and
// flushes it.
func (s *SSEWriter) Event(v any) error {
	name := ""
	if ne, ok := v.(NamedEvent); ok {
		name, v = ne.Name, ne.Data
	}
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode stream event: %w", err)
	}
	return s.writeNamed(name, data)
}

// Done sends the closing "data: [DONE]" event.
func (s *SSEWriter) Done() error { return s.write([]byte("[DONE]")) }

// Error sends err as the final event {"error":{…}} (see Response). No
// [DONE] follows: the stream is over.
func (s *SSEWriter) Error(err error) error { return s.Event(Response(err)) }

func (s *SSEWriter) write(data []byte) error { return s.writeNamed("", data) }

func (s *SSEWriter) writeNamed(name string, data []byte) error {
	if s.started {
		if err := s.setDeadline(); err != nil {
			return err
		}
	} else if err := s.Start(); err != nil {
		return err
	}
	buf := make([]byte, 0, len(name)+len(data)+16)
	if name != "" {
		buf = append(buf, "event: "...)
		buf = append(buf, name...)
		buf = append(buf, '\n')
	}
	buf = append(buf, "data: "...)
	buf = append(buf, data...)
	buf = append(buf, "\n\n"...)
	if _, err := s.w.Write(buf); err != nil {
		return fmt.Errorf("write stream event: %w", err)
	}
	return s.flush()
}

// setDeadline gives the next write s.timeout; writers that cannot take a
// deadline (test recorders) are written without one.
func (s *SSEWriter) setDeadline() error {
	if s.timeout <= 0 {
		return nil
	}
	err := s.rc.SetWriteDeadline(time.Now().Add(s.timeout))
	if err != nil && !errors.Is(err, http.ErrNotSupported) {
		return fmt.Errorf("set write deadline: %w", err)
	}
	return nil
}

func (s *SSEWriter) flush() error {
	if err := s.rc.Flush(); err != nil {
		return fmt.Errorf("flush stream event: %w", err)
	}
	return nil
}
