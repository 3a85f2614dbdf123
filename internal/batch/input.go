package batch

import (
	"bufio"
	"bytes"
	"crypto/sha256"
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

// DefaultMaxLines bounds the requests of one batch, as OpenAI does.
const DefaultMaxLines = 50000

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

// InputLimits bound a batch input file as it is read.
type InputLimits struct {
	// MaxLines bounds the requests (lines that are not blank).
	MaxLines int
	// MaxLineBytes bounds one line, its newline left out: the queen's
	// limit on a request body (--max-body-bytes), which a request of the
	// batch may not pass either.
	MaxLineBytes int
	// Checked says the file was checked whole before (at its upload): a
	// body is read for its model and stream only, not decoded as its
	// endpoint decodes it (a third of the time). A body the routing
	// refuses later fails its request then.
	Checked bool
}

// ScanInput reads a batch input file as a stream, one line in memory at
// a time: JSON Lines, one request a line,
// {"custom_id","method":"POST","url","body"}; blank lines are skipped.
// It checks every line as the worker would check its request (the body
// is decoded as POST url's body is), the custom_ids are unique, every
// line names the same url, no line is longer than lim.MaxLineBytes, and
// there are 1 to lim.MaxLines requests. Each request checked goes to fn
// (nil: none), whose error ends the scan and is returned; the request's
// Body is valid only until fn returns. The first line at fault gives a
// 400 *openai.Error whose message begins "line N: ". It returns the
// number of requests.
//
// What it keeps beside the line is 16 bytes a request (a digest of its
// custom_id, to find a second use of it).
func ScanInput(r io.Reader, lim InputLimits, fn func(Request) error) (int, error) {
	sc := bufio.NewScanner(r)
	// Room for the line, its \r and its \n: a longer one is ErrTooLong.
	sc.Buffer(make([]byte, 0, min(64<<10, lim.MaxLineBytes+2)), lim.MaxLineBytes+2)
	seen := map[[16]byte]int{}
	var firstURL string
	firstLine, n, line := 0, 0, 0
	for sc.Scan() {
		line++
		raw := sc.Bytes()
		if len(raw) > lim.MaxLineBytes {
			return n, lineTooLong(line, lim.MaxLineBytes)
		}
		text := bytes.TrimSpace(raw)
		if len(text) == 0 {
			continue
		}
		req, err := parseLine(line, text, lim.Checked)
		if err != nil {
			return n, err
		}
		sum := sha256.Sum256([]byte(req.CustomID))
		key := [16]byte(sum[:16])
		if first, dup := seen[key]; dup {
			return n, lineError(line, "custom_id %q is also the custom_id of line %d: each request needs its own", req.CustomID, first)
		}
		seen[key] = line
		if n == 0 {
			firstURL, firstLine = req.URL, line
		} else if req.URL != firstURL {
			return n, lineError(line, "url %s differs from line %d's %s: a batch runs one endpoint", req.URL, firstLine, firstURL)
		}
		if n == lim.MaxLines {
			return n, lineError(line, "the file holds more than %d requests, the queen's limit on a batch (--batch-max-lines); split it into several batches", lim.MaxLines)
		}
		n++
		if fn != nil {
			if err := fn(req); err != nil {
				return n, err
			}
		}
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return n, lineTooLong(line+1, lim.MaxLineBytes)
		}
		return n, fmt.Errorf("read the input file: %w", err)
	}
	if n == 0 {
		return 0, &openai.Error{Status: http.StatusBadRequest, Code: "invalid_file", Param: "file",
			Message: "the file has no requests: a batch input file holds one JSON request a line", Err: openai.ErrInvalidRequest}
	}
	return n, nil
}

// lineTooLong is a line over the queen's limit on a request body.
func lineTooLong(line, most int) error {
	return lineError(line, "the line is longer than %d bytes, the queen's limit on a request body (--max-body-bytes); make the request smaller or raise the limit", most)
}

func parseLine(line int, text []byte, checked bool) (Request, error) {
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
	decode := decodeBody
	if checked {
		decode = modelOf
	}
	model, stream, err := decode(*raw.URL, raw.Body)
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

// modelOf reads a body's model and stream, and nothing else.
func modelOf(_ string, body []byte) (model string, stream bool, err error) {
	var b struct {
		Model  string `json:"model"`
		Stream bool   `json:"stream"`
	}
	if err := json.Unmarshal(body, &b); err != nil {
		return "", false, openai.Invalid("", "%v", err)
	}
	return b.Model, b.Stream, nil
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
