package routing

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/openai"
	"github.com/apiary-llm/apiary/internal/responses"
)

// postResponses serves OpenAI's POST /v1/responses as a chat completion
// (internal/responses translates both ways): the same routing, placement
// and strikes, to built-in workers and engines alike.
func (s *Service) postResponses(w http.ResponseWriter, r *http.Request, c *call) error {
	body, err := openai.ReadBody(w, r, s.cfg.MaxBodyBytes)
	if err != nil {
		return err
	}
	req, out, err := responses.Chat(body)
	if err != nil {
		oe := &openai.Error{Status: http.StatusBadRequest, Code: openai.CodeInvalidValue, Message: err.Error(), Err: openai.ErrInvalidRequest}
		var p *responses.Param
		if errors.As(err, &p) {
			oe.Param = p.Name
		}
		return oe
	}
	decode := func(b []byte) (string, bool, error) {
		req, err := openai.DecodeChatCompletionRequest(b, openai.Limits{})
		return req.Model, req.Stream, err
	}
	tw := &translatingWriter{w: w, answer: responses.NewAnswer(req, req.Model, c.start), dialect: responsesDialect}
	err = s.serveRead(tw, r, c, "/v1/chat/completions", out, decode)
	if ferr := tw.finish(); ferr != nil && err == nil {
		err = ferr
	}
	return err
}

// responsesDialect: the Responses API's typed SSE events (framed by the
// translation); a worker's error answer passes as it came (OpenAI's shape).
var responsesDialect = dialect{
	contentType: "text/event-stream",
	frame:       func(ev []byte) []byte { return ev },
	errorEvent: func(msg string) []byte {
		b, _ := json.Marshal(map[string]any{"type": "error", "code": "worker_failed", "message": msg, "param": nil})
		return []byte("event: error\ndata: " + string(b) + "\n\n")
	},
	heldError: func(w http.ResponseWriter, status int, held []byte) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = w.Write(held)
	},
}

// getResponse answers GET and DELETE /v1/responses/{id}: responses are
// not stored.
func (s *Service) getResponse(w http.ResponseWriter, r *http.Request, c *call) error {
	return &openai.Error{Status: http.StatusNotFound, Code: openai.CodeNotFound, Param: "response_id",
		Message: fmt.Sprintf("no response %s: responses are not stored here (send the conversation in input)", api.Printable(r.PathValue("id"), 100))}
}
