package rpc

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/jsonl"
)

// Stream is a call whose request body and answer are each a sequence of
// JSON values, one a line, exchanged in rounds (one value sent, one
// answered) on one connection for as long as the stream lives: a hive's
// heartbeats. An answer line that is an api.LineError is that round's
// *StatusError; the stream goes on after it. Any other failure breaks the
// stream: the round returns an error wrapping ErrUnreachable, and the
// caller opens a new one.
type Stream struct {
	method, url string
	pw          *io.PipeWriter
	answers     *jsonl.Reader
	body        io.Closer
	cancel      context.CancelFunc

	mu       sync.Mutex
	timedOut bool
}

// OpenStream opens c as a stream with hc, which must set no time limit of
// its own (transport.NewClient with 0): the stream lives until ctx ends or
// Close. c.In is not used; c.MaxAnswer bounds each answer line. The
// answer's head must come within timeout; a non-2xx answer is a
// *StatusError.
func OpenStream(ctx context.Context, hc *http.Client, c Call, timeout time.Duration) (*Stream, error) {
	method := cmp.Or(c.Method, http.MethodPost)
	ctx, cancel := context.WithCancel(ctx)
	pr, pw := io.Pipe()
	req, err := http.NewRequestWithContext(ctx, method, c.URL, pr)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("%w: %s %s: %w", ErrUnreachable, method, c.URL, err)
	}
	req.ContentLength = -1 // chunked from the start: no probe of the body for its length
	req.Header.Set("Content-Type", "application/json")
	// A server that answers without reading the body (an error, or no
	// such endpoint) would otherwise first read the body to its end,
	// which a stream never reaches: its answer would never come.
	req.Header.Set("Expect", "100-continue")
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	c.setHeader(req)
	s := &Stream{method: method, url: c.URL, pw: pw, cancel: cancel}
	t := time.AfterFunc(timeout, s.timeOut)
	resp, err := hc.Do(req)
	if !t.Stop() && err == nil { // the head came as the time ran out
		resp.Body.Close()
		err = context.DeadlineExceeded
	}
	if err != nil {
		s.Close()
		return nil, s.unreachable("open", timeout, err)
	}
	limit := int(cmp.Or(c.MaxAnswer, int64(DefaultMaxAnswer)))
	if resp.StatusCode/100 != 2 {
		data, _ := io.ReadAll(io.LimitReader(resp.Body, int64(limit)))
		resp.Body.Close()
		s.Close()
		d := api.RemoteError(resp.StatusCode, data)
		return nil, &StatusError{Method: method, URL: c.URL, Status: resp.StatusCode, Code: d.Code, Message: d.Message, Body: data, Header: resp.Header}
	}
	s.body, s.answers = resp.Body, jsonl.NewReader(resp.Body, 1<<10, limit)
	return s, nil
}

// Round sends in and decodes the answer into out, both within timeout.
func (s *Stream) Round(in, out any, timeout time.Duration) error {
	b, err := json.Marshal(in)
	if err != nil {
		return fmt.Errorf("%s %s: encode the request: %w", s.method, s.url, err)
	}
	t := time.AfterFunc(timeout, s.timeOut)
	defer t.Stop()
	if _, err := s.pw.Write(append(b, '\n')); err != nil {
		s.Close()
		return s.unreachable("send", timeout, err)
	}
	line, err := s.answers.Next()
	if err != nil {
		s.Close()
		return s.unreachable("read the answer", timeout, err)
	}
	if bytes.HasPrefix(line, []byte(`{"error":`)) {
		var e api.LineError
		if json.Unmarshal(line, &e) == nil && e.Status >= 400 && e.Error.Code != "" {
			return &StatusError{Method: s.method, URL: s.url, Status: e.Status, Code: api.Printable(e.Error.Code, 64),
				Message: api.Printable(e.Error.Message, api.MaxRemoteMessage), Body: bytes.Clone(line)}
		}
	}
	if out != nil {
		if err := json.Unmarshal(line, out); err != nil {
			s.Close()
			return fmt.Errorf("%w: %s %s: the answer is not what was asked for: %w", ErrUnreachable, s.method, s.url, err)
		}
	}
	return nil
}

// Close ends the stream: the request body, the answer and the connection.
func (s *Stream) Close() {
	s.cancel()
	s.pw.CloseWithError(errStreamClosed)
	if s.body != nil {
		s.body.Close()
	}
}

var errStreamClosed = errors.New("stream closed")

// timeOut breaks the stream when a round or the opening takes too long.
func (s *Stream) timeOut() {
	s.mu.Lock()
	s.timedOut = true
	s.mu.Unlock()
	s.Close()
}

func (s *Stream) unreachable(what string, timeout time.Duration, err error) error {
	s.mu.Lock()
	timedOut := s.timedOut
	s.mu.Unlock()
	if timedOut {
		return fmt.Errorf("%w: %s %s: %s: no answer within %s", ErrUnreachable, s.method, s.url, what, timeout)
	}
	return fmt.Errorf("%w: %s %s: %s: %w", ErrUnreachable, s.method, s.url, what, err)
}
