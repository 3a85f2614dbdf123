package worker

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/apiary-llm/apiary/internal/engine"
	"github.com/apiary-llm/apiary/internal/openai"
)

// handleRerank serves POST /v1/rerank (and llama.cpp's other names of
// it): each document is paired with the query as llama.cpp's server pairs
// them (engine.RerankInput) and scored through the model's rank pooling,
// in turn, within one admitted slot; the answer lists the scores, the
// highest first. A model that is no reranker is refused 400.
func (w *Worker) handleRerank(rw http.ResponseWriter, r *http.Request) error {
	eng, info, err := w.serving()
	if err != nil {
		return err
	}
	body, err := openai.ReadBody(rw, r, max(w.cfg.MaxBodyBytes, openai.MaxRerankBodyBytes))
	if err != nil {
		return err
	}
	req, err := openai.DecodeRerankRequest(body)
	if err != nil {
		return err
	}
	if err := w.checkModel(req.Model); err != nil {
		return err
	}
	if !info.Reranker {
		return openai.NotReranker(w.answerModel(r), engine.ErrNotReranker)
	}
	inputs := make([][]int, len(req.Documents))
	tokens := 0
	for i, doc := range req.Documents {
		param := fmt.Sprintf("documents[%d]", i)
		if inputs[i], err = eng.RerankInput(req.Query, doc); err != nil {
			return fmt.Errorf("tokenize %s: %w", param, err)
		}
		if len(inputs[i]) > info.CtxSize {
			return &openai.Error{Status: http.StatusBadRequest, Code: openai.CodeContextLength, Param: param,
				Message: fmt.Sprintf("query and %s are %d tokens; the context holds %d", param, len(inputs[i]), info.CtxSize), Err: engine.ErrPromptTooLong}
		}
		tokens += len(inputs[i])
	}
	release, err := w.admit(r.Context())
	if err != nil {
		return err
	}
	defer release()
	results := make([]openai.RerankResult, len(inputs))
	for i, ids := range inputs {
		score, err := eng.Rank(r.Context(), ids)
		if errors.Is(err, engine.ErrNotReranker) {
			return openai.NotReranker(w.answerModel(r), err)
		}
		if err != nil {
			return w.generationError(r.Context(), err)
		}
		results[i] = openai.RerankResult{Index: i, RelevanceScore: float64(score)}
		if req.ReturnDocuments {
			results[i].Document = &openai.RerankDocument{Text: req.Documents[i]}
		}
	}
	openai.WriteJSON(rw, http.StatusOK, openai.RerankResponse{Model: w.answerModel(r), Object: openai.ObjectList,
		Results: openai.Ranked(results, req.TopN), Usage: openai.EmbeddingsUsage{PromptTokens: tokens, TotalTokens: tokens}})
	return nil
}
