package routing

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/openai"
	"github.com/apiary-llm/apiary/internal/responses"
	"github.com/apiary-llm/apiary/internal/store"
	"github.com/apiary-llm/apiary/internal/translate"
)

// postResponses serves OpenAI's POST /v1/responses as a chat completion
// (internal/responses translates both ways): the same routing, placement
// and strikes, to built-in workers and engines alike.
func (s *Service) postResponses(w http.ResponseWriter, r *http.Request, c *call) error {
	body, err := s.readBody(w, r, "/v1/chat/completions")
	if err != nil {
		return err
	}
	req, err := responses.Parse(body)
	if err != nil {
		return err
	}
	keep := s.cfg.Responses
	// The conversation a previous response ended.
	var prior []map[string]any
	if id := req.PreviousResponseID; id != nil {
		if keep == nil {
			return responses.Refuse("previous_response_id", "responses are not kept here: send the conversation in input")
		}
		prev, err := keep.Response(r.Context(), *id)
		if errors.Is(err, store.ErrNotFound) {
			return &openai.Error{Status: http.StatusBadRequest, Code: "previous_response_not_found", Param: "previous_response_id",
				Message: fmt.Sprintf("previous response with id '%s' not found (kept for --rows-retention, or deleted)", api.Printable(*id, 100)), Err: openai.ErrInvalidRequest}
		}
		if err != nil {
			return err
		}
		if err := json.Unmarshal(prev.Messages, &prior); err != nil {
			return fmt.Errorf("the kept conversation of %s: %w", *id, err)
		}
	}
	out, conversation, err := responses.Build(req, prior)
	if err != nil {
		return err
	}
	decode := func(b []byte) (string, bool, error) {
		req, err := openai.DecodeChatCompletionRequest(b, openai.Limits{})
		return req.Model, req.Stream, err
	}
	answer := responses.NewAnswer(req, req.Model, c.start)
	answer.Stored = keep != nil && (req.Store == nil || *req.Store)
	tw := translate.New(w, answer, responses.Dialect)
	err = s.serveRead(tw, r, c, "/v1/chat/completions", out, int64(len(body)), decode)
	if ferr := tw.Finish(); ferr != nil && err == nil {
		err = ferr
	}
	if final := answer.Final(); answer.Stored && final != nil {
		// Kept after the answer went out: a client that continues at once
		// may find it missing only if the store failed, which is logged.
		msgs, _ := json.Marshal(append(conversation, answer.Messages()...))
		if perr := keep.PutResponse(context.WithoutCancel(r.Context()), store.StoredResponse{ID: answer.ID(),
			CreatedAt: time.Unix(answer.Created(), 0), Response: final, Messages: msgs}); perr != nil {
			s.log.Error("could not keep a response", "response_id", answer.ID(), "err", perr)
		}
	}
	return err
}

// getResponse answers GET /v1/responses/{id}: a kept response.
func (s *Service) getResponse(w http.ResponseWriter, r *http.Request, c *call) error {
	kept, err := s.keptResponse(r)
	if err != nil {
		return err
	}
	w.Header().Set("Content-Type", "application/json")
	_, err = w.Write(append(kept.Response, '\n'))
	return err
}

// deleteResponse answers DELETE /v1/responses/{id}.
func (s *Service) deleteResponse(w http.ResponseWriter, r *http.Request, c *call) error {
	if _, err := s.keptResponse(r); err != nil {
		return err
	}
	id := r.PathValue("id")
	if err := s.cfg.Responses.DeleteResponse(r.Context(), id); err != nil && !errors.Is(err, store.ErrNotFound) {
		return err
	}
	openai.WriteJSON(w, http.StatusOK, map[string]any{"id": id, "object": "response.deleted", "deleted": true})
	return nil
}

func (s *Service) keptResponse(r *http.Request) (store.StoredResponse, error) {
	id := r.PathValue("id")
	notFound := &openai.Error{Status: http.StatusNotFound, Code: openai.CodeNotFound, Param: "response_id",
		Message: fmt.Sprintf("no response %s is kept (responses are kept for --rows-retention when store is not false)", api.Printable(id, 100))}
	if s.cfg.Responses == nil {
		return store.StoredResponse{}, notFound
	}
	kept, err := s.cfg.Responses.Response(r.Context(), id)
	if errors.Is(err, store.ErrNotFound) {
		return kept, notFound
	}
	return kept, err
}
