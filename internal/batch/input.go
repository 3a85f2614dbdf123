package batch

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/apiary-llm/apiary/internal/openai"
	"github.com/apiary-llm/apiary/internal/responses"
)

// The endpoints a batch may name: OpenAI's list.
const (
	EndpointChat        = "/v1/chat/completions"
	EndpointCompletions = "/v1/completions"
	EndpointEmbeddings  = "/v1/embeddings"
	EndpointResponses   = "/v1/responses"
)

// MaxRequests bounds the requests of one batch, as OpenAI does.
const MaxRequests = 50000

// maxCustomID bounds a custom_id, in bytes.
const maxCustomID = 512

// Request is one line of a batch input file, checked.
type Request struct {
	Line     int // 1-based
	CustomID string
	URL      string
	Model    string
	Body     json.RawMessage
}

// endpointList names the endpoints a batch can run, for messages.
const endpointList = "/v1/chat/completions, /v1/completions, /v1/embeddings or /v1/responses"

// checkEndpoint refuses what a batch cannot run: anything but the two
// completion endpoints and embeddings; param names the field at fault.
func checkEndpoint(param, url string) error {
	switch url {
	case EndpointChat, EndpointCompletions, EndpointEmbeddings, EndpointResponses:
		return nil
	}
	return openai.Invalid(param, "%q is not an endpoint a batch can run: use %s", url, endpointList)
}

// lineError is a request line that is wrong: the answer names its line.
func lineError(line int, format string, a ...any) *openai.Error {
	return &openai.Error{Status: http.StatusBadRequest, Code: "invalid_file", Param: "file",
		Message: fmt.Sprintf("line %d: ", line) + fmt.Sprintf(format, a...), Err: openai.ErrInvalidRequest}
}

// ParseInput reads a batch input file: JSON Lines, one request a line,
// {"custom_id","method":"POST","url","body"}; blank lines are skipped.
// It checks every line as the worker would check its request (the body
// is decoded as POST url's body is), the custom_ids are unique, every
// line names the same url, and there are 1 to MaxRequests requests. The
// first line at fault gives a 400 *openai.Error whose message begins
// "line N: ".
func ParseInput(r io.Reader) ([]Request, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 64<<20)
	seen := map[string]int{}
	var out []Request
	line := 0
	for sc.Scan() {
		line++
		text := bytes.TrimSpace(sc.Bytes())
		if len(text) == 0 {
			continue
		}
		req, err := parseLine(line, text)
		if err != nil {
			return nil, err
		}
		if first, dup := seen[req.CustomID]; dup {
			return nil, lineError(line, "custom_id %q is also the custom_id of line %d: each request needs its own", req.CustomID, first)
		}
		seen[req.CustomID] = line
		if len(out) > 0 && req.URL != out[0].URL {
			return nil, lineError(line, "url %s differs from line %d's %s: a batch runs one endpoint", req.URL, out[0].Line, out[0].URL)
		}
		if len(out) == MaxRequests {
			return nil, lineError(line, "a batch holds at most %d requests", MaxRequests)
		}
		out = append(out, req)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, lineError(line+1, "the line is longer than 64 MiB")
		}
		return nil, fmt.Errorf("batch: read the input file: %w", err)
	}
	if len(out) == 0 {
		return nil, &openai.Error{Status: http.StatusBadRequest, Code: "invalid_file", Param: "file",
			Message: "the file has no requests: a batch input file holds one JSON request a line", Err: openai.ErrInvalidRequest}
	}
	return out, nil
}

func parseLine(line int, text []byte) (Request, error) {
	var raw struct {
		CustomID *string         `json:"custom_id"`
		Method   *string         `json:"method"`
		URL      *string         `json:"url"`
		Body     json.RawMessage `json:"body"`
	}
	if err := json.Unmarshal(text, &raw); err != nil {
		return Request{}, lineError(line, "not a JSON object of custom_id, method, url and body: %v", err)
	}
	switch {
	case raw.CustomID == nil || *raw.CustomID == "":
		return Request{}, lineError(line, "custom_id is missing: each request needs one, unique in the file")
	case len(*raw.CustomID) > maxCustomID:
		return Request{}, lineError(line, "custom_id is %d bytes; at most %d", len(*raw.CustomID), maxCustomID)
	case raw.Method == nil || *raw.Method != http.MethodPost:
		return Request{}, lineError(line, `method must be "POST"`)
	case raw.URL == nil:
		return Request{}, lineError(line, "url is missing: %s", endpointList)
	case len(raw.Body) == 0 || raw.Body[0] != '{':
		return Request{}, lineError(line, "body must be a JSON object: the request's body")
	}
	if err := checkEndpoint("url", *raw.URL); err != nil {
		return Request{}, lineError(line, "%s", openai.AsError(err).Message)
	}
	model, stream, err := decodeBody(*raw.URL, raw.Body)
	if err != nil {
		oe := openai.AsError(err)
		where := "body"
		if oe.Param != "" {
			where = "body." + oe.Param
		}
		return Request{}, lineError(line, "%s: %s", where, oe.Message)
	}
	switch {
	case model == "":
		return Request{}, lineError(line, "body.model is missing: name the model (apiary jobs submit --model sets it on every line)")
	case stream:
		return Request{}, lineError(line, "body.stream is true: a batch request is answered whole, not streamed")
	}
	return Request{Line: line, CustomID: *raw.CustomID, URL: *raw.URL, Model: model, Body: raw.Body}, nil
}

// decodeBody decodes a request body as POST url decodes it.
func decodeBody(url string, body []byte) (model string, stream bool, err error) {
	switch url {
	case EndpointChat:
		req, err := openai.DecodeChatCompletionRequest(body, openai.Limits{})
		return req.Model, req.Stream, err
	case EndpointEmbeddings:
		req, err := openai.DecodeEmbeddingRequest(body)
		return req.Model, false, err
	case EndpointResponses:
		// Checked as the queen checks one: translated, then the chat
		// completion it becomes.
		req, err := responses.Parse(body)
		if err != nil {
			return "", false, err
		}
		chat, _, err := responses.Build(req, nil)
		if err != nil {
			return req.Model, req.Stream, err
		}
		_, err = openai.DecodeChatCompletionRequest(chat, openai.Limits{})
		return req.Model, req.Stream, err
	}
	req, err := openai.DecodeCompletionRequest(body, openai.Limits{})
	return req.Model, req.Stream, err
}
