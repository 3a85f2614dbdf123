package llamacpp

/*
#include "llama.h"

static void embed_put(struct llama_batch *b, llama_token id, llama_pos pos) {
	int i = b->n_tokens;
	b->token[i] = id;
	b->pos[i] = pos;
	b->n_seq_id[i] = 1;
	b->seq_id[i][0] = 0;
	b->logits[i] = 1;
	b->n_tokens = i + 1;
}
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"math"
	"unsafe"

	"github.com/apiary-llm/apiary/internal/engine"
)

// Embed returns the L2-normalised embedding of prompt: the model's own
// pooling when its GGUF names one, else the mean of the last layer's token
// states. Embeddings run one at a time on a second llama.cpp context (its
// own KV cache of one slot's size), made on the first call, so that they
// never wait for or slow the decode loop's batches beyond sharing the CPU.
func (e *Engine) Embed(ctx context.Context, prompt []int) ([]float32, error) {
	if len(prompt) == 0 {
		return nil, errors.New("empty input")
	}
	if len(prompt) > e.nCtxSeq {
		return nil, fmt.Errorf("%w: %d tokens, context holds %d", engine.ErrPromptTooLong, len(prompt), e.nCtxSeq)
	}
	e.embMu.Lock()
	defer e.embMu.Unlock()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if e.embOff {
		return nil, engine.ErrClosed
	}
	if e.emb == nil {
		lctx, err := e.newEmbeddingContext()
		if err != nil {
			return nil, err
		}
		e.emb = lctx
	}
	for _, id := range prompt {
		if id < 0 || id >= e.info.Vocab {
			return nil, fmt.Errorf("%w: %d", engine.ErrTokenID, id)
		}
	}
	p, err := e.decodePooled(e.emb, prompt)
	if err != nil {
		return nil, err
	}
	n := int(C.llama_model_n_embd(e.model))
	v := make([]float32, n)
	copy(v, unsafe.Slice((*float32)(unsafe.Pointer(p)), n))
	var sum float64
	for _, x := range v {
		sum += float64(x) * float64(x)
	}
	if norm := math.Sqrt(sum); norm > 0 {
		for i := range v {
			v[i] = float32(float64(v[i]) / norm)
		}
	}
	return v, nil
}

// decodePooled decodes prompt, one sequence, on lctx (a context of
// embeddings, whose KV it clears before and after) and returns its pooled
// output: the embedding, or a reranker's class scores. Callers hold embMu
// and have checked the token ids.
func (e *Engine) decodePooled(lctx *C.struct_llama_context, prompt []int) (*C.float, error) {
	batch := C.llama_batch_init(C.int32_t(len(prompt)), 0, 1)
	defer C.llama_batch_free(batch)
	for i, id := range prompt {
		C.embed_put(&batch, C.llama_token(id), C.llama_pos(i))
	}
	mem := C.llama_get_memory(lctx)
	C.llama_memory_clear(mem, true)
	defer C.llama_memory_clear(mem, true)
	if rc := C.llama_decode(lctx, batch); rc != 0 {
		return nil, fmt.Errorf("embedding decode failed (code %d)", int(rc))
	}
	p := C.llama_get_embeddings_seq(lctx, 0)
	if p == nil {
		return nil, errors.New("llama.cpp returned no pooled embedding")
	}
	return p, nil
}

// newEmbeddingContext makes a context with embeddings on and pooling the
// model's, or mean pooling when the model names none; the whole input is
// one micro-batch, as pooling needs.
func (e *Engine) newEmbeddingContext() (*C.struct_llama_context, error) {
	for _, pooling := range []C.enum_llama_pooling_type{C.LLAMA_POOLING_TYPE_UNSPECIFIED, C.LLAMA_POOLING_TYPE_MEAN} {
		lctx, err := e.newPoolingContext(pooling)
		if err != nil {
			return nil, err
		}
		if got := C.llama_pooling_type(lctx); got == C.LLAMA_POOLING_TYPE_NONE || got == C.LLAMA_POOLING_TYPE_RANK {
			C.llama_free(lctx)
			continue
		}
		return lctx, nil
	}
	return nil, errors.New("no pooled embeddings context")
}

// newPoolingContext makes a context of one slot's size with embeddings
// on and the pooling given.
func (e *Engine) newPoolingContext(pooling C.enum_llama_pooling_type) (*C.struct_llama_context, error) {
	cparams := C.llama_context_default_params()
	cparams.n_ctx = C.uint32_t(e.nCtxSeq)
	cparams.n_batch = C.uint32_t(e.nCtxSeq)
	cparams.n_ubatch = C.uint32_t(e.nCtxSeq)
	cparams.n_seq_max = 1
	cparams.n_threads = C.int32_t(e.threads)
	cparams.n_threads_batch = C.int32_t(e.threads)
	cparams.no_perf = true
	cparams.embeddings = true
	cparams.pooling_type = pooling
	lctx := C.llama_init_from_model(e.model, cparams)
	if lctx == nil {
		return nil, fmt.Errorf("llama.cpp could not create an embeddings context of %d tokens", e.nCtxSeq)
	}
	return lctx, nil
}
