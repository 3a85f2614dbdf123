// Package rpc is how one apiary process calls another's JSON API: the
// bearer token, the request as JSON, a bounded read of the answer, and
// the error shape ({"error":{"code","message"}}) of an answer that is not
// 2xx. Every client between apiary's processes (queen → hive, hive →
// queen, worker → hive, hive → worker, keeper → queen) calls through Do,
// so they all set the token, bound the answer and read an error alike.
package rpc

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"

	"github.com/apiary-llm/apiary/internal/api"
)

// ErrUnreachable: the call got no usable answer (no connection, a reset,
// a timeout, an answer that could not be read, or a 2xx answer that is
// not the JSON asked for).
var ErrUnreachable = errors.New("no answer")

// DefaultMaxAnswer bounds what is read of an answer when the call says
// nothing.
const DefaultMaxAnswer = 8 << 20

// Call is one request.
type Call struct {
	Method string // default POST when In is set, GET when not
	URL    string // checked by its caller (transport.CheckBaseURL) before
	Token  string // sent as a bearer token when not ""
	In     any    // sent as JSON; nil: no body
	// Out receives a 2xx answer's JSON; nil: the answer is discarded. An
	// empty 2xx body leaves Out as it is.
	Out any
	// MaxAnswer bounds the bytes read of the answer; default
	// DefaultMaxAnswer.
	MaxAnswer int64
	// Header is added to the request's headers (nil: none).
	Header http.Header
}

// setHeader adds c.Header to req's headers.
func (c Call) setHeader(req *http.Request) {
	for k, vs := range c.Header {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
}

// StatusError is an answer that is not 2xx: its status and the error
// shape's code and message, cut to api.MaxRemoteMessage printable bytes (a
// body of another shape gives code unexpected_answer). Body is the answer
// as it came (up to MaxAnswer), for a caller that shows it itself.
type StatusError struct {
	Method, URL string
	Status      int
	Code        string
	Message     string
	Body        []byte
	// Header is the answer's (a standby queen's names the active one,
	// api.ActiveQueenHeader).
	Header http.Header
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("%s %s: %d %s: %s", e.Method, e.URL, e.Status, e.Code, e.Message)
}

// Do makes the call with hc. It returns nil for a 2xx answer (decoded into
// c.Out), a *StatusError for any other answer, and an error wrapping
// ErrUnreachable when no usable answer came.
func Do(ctx context.Context, hc *http.Client, c Call) error {
	method := c.Method
	if method == "" {
		method = http.MethodGet
		if c.In != nil {
			method = http.MethodPost
		}
	}
	var body io.Reader
	if c.In != nil {
		b, err := json.Marshal(c.In)
		if err != nil {
			return fmt.Errorf("%s %s: encode the request: %w", method, c.URL, err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.URL, body)
	if err != nil {
		return fmt.Errorf("%w: %s %s: %w", ErrUnreachable, method, c.URL, err)
	}
	if method != http.MethodGet && method != http.MethodHead {
		// Declared JSON even without a body: apiary's servers refuse a
		// state change that is not (a browser's form cannot forge one).
		req.Header.Set("Content-Type", "application/json")
	}
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	c.setHeader(req)
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("%w: %s %s: %w", ErrUnreachable, method, c.URL, err)
	}
	defer resp.Body.Close()
	limit := c.MaxAnswer
	if limit <= 0 {
		limit = DefaultMaxAnswer
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, limit))
	if err != nil {
		return fmt.Errorf("%w: %s %s: read the answer: %w", ErrUnreachable, method, c.URL, err)
	}
	if resp.StatusCode/100 != 2 {
		d := api.RemoteError(resp.StatusCode, data)
		return &StatusError{Method: method, URL: c.URL, Status: resp.StatusCode, Code: d.Code, Message: d.Message, Body: data, Header: resp.Header}
	}
	if c.Out != nil && len(bytes.TrimSpace(data)) > 0 {
		if err := json.Unmarshal(data, c.Out); err != nil {
			return fmt.Errorf("%w: %s %s: the answer is not what was asked for: %w", ErrUnreachable, method, c.URL, err)
		}
	}
	return nil
}

// maxHealth bounds a worker's health answer.
const maxHealth = 64 << 10

// WorkerHealth asks a worker's GET /health (it needs no token): its health
// when it answers 2xx, else the error Do gives.
func WorkerHealth(ctx context.Context, hc *http.Client, uri string) (api.WorkerHealth, error) {
	var h api.WorkerHealth
	err := Do(ctx, hc, Call{URL: strings.TrimSuffix(uri, "/") + "/health", Out: &h, MaxAnswer: maxHealth})
	return h, err
}

// NetReason says why a connection failed in the network's words —
// connection refused, no such host, no answer in time, the connection
// closed — without the address it was to; ok is false when err says none
// of these.
func NetReason(err error) (why string, ok bool) {
	var errno syscall.Errno
	var dns *net.DNSError
	var ne net.Error
	switch {
	case errors.As(err, &errno):
		return errno.Error(), true
	case errors.As(err, &dns):
		return dns.Error(), true
	case errors.As(err, &ne) && ne.Timeout():
		return "no answer in time", true
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "the connection closed", true
	}
	return "", false
}
