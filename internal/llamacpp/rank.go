package llamacpp

/*
#include <stdlib.h>
#include "llama.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"unsafe"

	"github.com/apiary-llm/apiary/internal/engine"
)

// rerankFormat is how a query and a document make a reranker's input, as
// llama.cpp's server makes it (tools/server format_prompt_rerank): the
// model's rerank template (tokenizer.chat_template.rerank) with {query}
// and {document} replaced, tokenized with its special tokens parsed and
// none added; without one, [BOS] query [EOS] [SEP] document [EOS], each
// special token there when the vocabulary adds it (add_bos, add_eos,
// add_sep), EOS being SEP when the model has no EOS, and the texts
// tokenized as plain text.
type rerankFormat struct {
	template       string // "" when the model has none
	bos, eos, sep  int
	addBOS, addEOS bool
	addSEP         bool
}

// tokens makes the input of query and document; tokenize(text,
// parseSpecial) tokenizes without adding special tokens.
func (f rerankFormat) tokens(query, document string, tokenize func(text string, parseSpecial bool) ([]int, error)) ([]int, error) {
	if f.template != "" {
		prompt := strings.ReplaceAll(f.template, "{query}", query)
		prompt = strings.ReplaceAll(prompt, "{document}", document)
		return tokenize(prompt, true)
	}
	q, err := tokenize(query, false)
	if err != nil {
		return nil, err
	}
	d, err := tokenize(document, false)
	if err != nil {
		return nil, err
	}
	var out []int
	if f.addBOS {
		out = append(out, f.bos)
	}
	out = append(out, q...)
	if f.addEOS {
		out = append(out, f.eos)
	}
	if f.addSEP {
		out = append(out, f.sep)
	}
	out = append(out, d...)
	if f.addEOS {
		out = append(out, f.eos)
	}
	return out, nil
}

// newRerankFormat reads the model's rerank template and special tokens.
func (e *Engine) newRerankFormat() rerankFormat {
	name := C.CString("rerank")
	defer C.free(unsafe.Pointer(name))
	f := rerankFormat{
		bos:    int(C.llama_vocab_bos(e.vocab)),
		eos:    int(C.llama_vocab_eos(e.vocab)),
		sep:    int(C.llama_vocab_sep(e.vocab)),
		addBOS: bool(C.llama_vocab_get_add_bos(e.vocab)),
		addEOS: bool(C.llama_vocab_get_add_eos(e.vocab)),
		addSEP: bool(C.llama_vocab_get_add_sep(e.vocab)),
	}
	if f.eos == int(C.LLAMA_TOKEN_NULL) {
		f.eos = f.sep
	}
	if t := C.llama_model_chat_template(e.model, name); t != nil {
		f.template = C.GoString(t)
	}
	return f
}

// RerankInput is the token sequence a reranker scores for query and
// document (rerankFormat).
func (e *Engine) RerankInput(query, document string) ([]int, error) {
	return e.rerank.tokens(query, document, func(text string, parseSpecial bool) ([]int, error) {
		if text == "" {
			return nil, nil
		}
		return e.tokenize(text, false, parseSpecial)
	})
}

// Rank returns the relevance score of input (from RerankInput): the first
// output of the model's classifier head over its rank pooling, as
// llama.cpp's server answers it. Ranks run one at a time on their own
// llama.cpp context, made on the first call, beside the embeddings one
// (and under the same lock).
func (e *Engine) Rank(ctx context.Context, input []int) (float32, error) {
	if !e.info.Reranker {
		return 0, fmt.Errorf("%w: its GGUF names no rank pooling", engine.ErrNotReranker)
	}
	if len(input) == 0 {
		return 0, errors.New("empty input")
	}
	if len(input) > e.nCtxSeq {
		return 0, fmt.Errorf("%w: %d tokens, context holds %d", engine.ErrPromptTooLong, len(input), e.nCtxSeq)
	}
	for _, id := range input {
		if id < 0 || id >= e.info.Vocab {
			return 0, fmt.Errorf("%w: %d", engine.ErrTokenID, id)
		}
	}
	e.embMu.Lock()
	defer e.embMu.Unlock()
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if e.embOff {
		return 0, engine.ErrClosed
	}
	if e.rank == nil {
		lctx, err := e.newPoolingContext(C.LLAMA_POOLING_TYPE_RANK)
		if err != nil {
			return 0, err
		}
		if C.llama_pooling_type(lctx) != C.LLAMA_POOLING_TYPE_RANK {
			C.llama_free(lctx)
			return 0, fmt.Errorf("%w: llama.cpp gives it no rank pooling", engine.ErrNotReranker)
		}
		e.rank = lctx
	}
	p, err := e.decodePooled(e.rank, input)
	if err != nil {
		return 0, err
	}
	return float32(*p), nil
}
