package worker

import (
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"math"
	"net/http"

	"github.com/apiary-llm/apiary/internal/engine"
	"github.com/apiary-llm/apiary/internal/openai"
)

// handleEmbeddings serves POST /v1/embeddings: each input is tokenized and
// embedded in turn, within one admitted slot.
func (w *Worker) handleEmbeddings(rw http.ResponseWriter, r *http.Request) error {
	eng, info, err := w.serving()
	if err != nil {
		return err
	}
	body, err := openai.ReadBody(rw, r, max(w.cfg.MaxBodyBytes, openai.MaxEmbeddingBodyBytes))
	if err != nil {
		return err
	}
	req, err := openai.DecodeEmbeddingRequest(body)
	if err != nil {
		return err
	}
	if err := w.checkModel(req.Model); err != nil {
		return err
	}
	inputs := make([][]int, len(req.Input))
	tokens := 0
	for i, s := range req.Input {
		param := fmt.Sprintf("input[%d]", i)
		if inputs[i], err = eng.Tokenize(s, true); err != nil {
			return fmt.Errorf("tokenize %s: %w", param, err)
		}
		if len(inputs[i]) > info.CtxSize {
			return &openai.Error{Status: http.StatusBadRequest, Code: openai.CodeContextLength, Param: param,
				Message: fmt.Sprintf("%s is %d tokens; the context holds %d", param, len(inputs[i]), info.CtxSize), Err: engine.ErrPromptTooLong}
		}
		tokens += len(inputs[i])
	}
	release, err := w.admit(r.Context())
	if err != nil {
		return err
	}
	defer release()
	out := openai.EmbeddingList{Object: openai.ObjectList, Model: w.answerModel(r), Data: make([]openai.Embedding, len(inputs)),
		Usage: openai.EmbeddingsUsage{PromptTokens: tokens, TotalTokens: tokens}}
	for i, ids := range inputs {
		v, err := eng.Embed(r.Context(), ids)
		if err != nil {
			return w.generationError(r.Context(), err)
		}
		if req.Dimensions != 0 && req.Dimensions != len(v) {
			return &openai.Error{Status: http.StatusBadRequest, Code: openai.CodeInvalidValue, Param: "dimensions",
				Message: fmt.Sprintf("dimensions %d: %s's embeddings have %d dimensions, and no other size can be given", req.Dimensions, w.cfg.ModelRef, len(v))}
		}
		out.Data[i] = openai.Embedding{Object: openai.ObjectEmbedding, Index: i, Embedding: v}
		if req.EncodingFormat == "base64" {
			b := make([]byte, 4*len(v))
			for k, x := range v {
				binary.LittleEndian.PutUint32(b[4*k:], math.Float32bits(x))
			}
			out.Data[i].Embedding = base64.StdEncoding.EncodeToString(b)
		}
	}
	openai.WriteJSON(rw, http.StatusOK, out)
	return nil
}
