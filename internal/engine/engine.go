// Package engine is the boundary between apiary's worker and the inference
// library underneath it. The worker speaks only to these types, so the
// llama.cpp binding (package llamacpp) can be replaced without touching HTTP,
// lifecycle or routing code.
package engine

import (
	"context"
	"errors"
)

// Sentinel errors returned by engines. Callers test them with errors.Is.
var (
	// ErrPromptTooLong means the prompt does not fit the context window.
	ErrPromptTooLong = errors.New("prompt does not fit the context window")
	// ErrStop is returned by an Emit callback to end a generation early
	// (for example, because a stop sequence matched). Generate then returns
	// normally with FinishStop.
	ErrStop = errors.New("stop requested")
	// ErrGrammar means a request's grammar or JSON schema could not be
	// turned into a sampler; the error's text says why.
	ErrGrammar = errors.New("invalid grammar")
	// ErrTokenID means a request named a token id the model does not have.
	ErrTokenID = errors.New("no such token id")
	// ErrClosed means the engine was closed.
	ErrClosed = errors.New("closed")
	// ErrNotReranker means a rerank was asked of a model whose GGUF names
	// no rank pooling.
	ErrNotReranker = errors.New("not a reranker")
)

// Options configure how a model is loaded.
type Options struct {
	ModelPath string
	CtxSize   int // total context, shared by all slots; 0 = model default capped at 4096
	Slots     int // parallel sequences; each gets CtxSize/Slots positions
	Threads   int // 0 = number of CPUs
	BatchSize int // prompt processing batch; 0 = 512
	GPUDevice int // -1 = CPU only
	// GPUDevices, when more than one, are the GPUs the model is split
	// over (GPUDevice is the first): llama.cpp's tensor_split in
	// proportion to each one's free memory at load.
	GPUDevices []int
	// SplitMode is how a model is split over GPUDevices: SplitLayer
	// (default: whole layers on each GPU) or SplitRow (each layer's rows
	// over the GPUs; needs a backend with a split buffer type, as CUDA's).
	SplitMode string
	GPULayers int // layers offloaded when a GPU backend is present
	// Projector is the path of a vision projector GGUF (an "mmproj") to
	// load beside the model: the engine then reads images (Vision). ""
	// for none.
	Projector string
}

// Split modes of Options.SplitMode.
const (
	SplitLayer = "layer"
	SplitRow   = "row"
)

// ModelInfo describes the loaded model.
type ModelInfo struct {
	Architecture string
	CtxSize      int // context length per slot
	TrainCtx     int // context length the model was trained with
	Vocab        int
	ChatTemplate string // from GGUF metadata; empty when the model has none
	// Reranker reports whether the model's GGUF names rank pooling
	// ({arch}.pooling_type 4, llama.cpp's LLAMA_POOLING_TYPE_RANK): it
	// scores query/document pairs (Rank) instead of embedding texts.
	Reranker bool
	// BOSText and EOSText are the texts of the model's beginning- and
	// end-of-sequence tokens (chat templates write them).
	BOSText, EOSText string
	MemoryBytes      uint64 // weights + KV cache + compute buffers actually allocated
	// Vision: a projector is loaded, and the engine reads images in
	// prompts (it implements Vision).
	Vision bool
}

// Message is one chat message.
type Message struct {
	Role    string
	Content string
}

// Request is one generation.
type Request struct {
	Prompt      []int // token ids, from Tokenize
	MaxTokens   int   // > 0
	Temperature float32
	TopP        float32
	TopK        int
	MinP        float32
	Seed        uint32
	IgnoreEOS   bool
	// Background (a Batch API request) yields to the others: its prompt
	// is not decoded in a step that decodes another's prompt, so an
	// interactive request's first token waits for no batch prompt.
	Background bool
	// FrequencyPenalty and PresencePenalty (OpenAI's, -2..2; 0: off)
	// lower the odds of tokens already generated: by how often they came,
	// and for having come at all.
	FrequencyPenalty float32
	PresencePenalty  float32
	// RepeatPenalty (llama.cpp's; 0 or 1: off) divides the positive logits
	// of the last 64 tokens' ids and multiplies their negative ones.
	RepeatPenalty float32
	// LogitBias is added to the logits of the token ids it names.
	LogitBias map[int]float32
	// Grammar is a GBNF grammar (root rule "root") every sampled token must
	// keep the output within; "" for none.
	Grammar string
	// JSONSchema, when set, is turned into the grammar (Grammar is then
	// ignored): the output is JSON that the schema accepts.
	JSONSchema []byte
	// Wrap, with JSONSchema, puts fixed text around the JSON: a forced
	// tool call in a model family's syntax.
	Wrap *GrammarWrap
	// Logprobs fills Token.Logprob; TopLogprobs > 0 fills Token.Top with
	// that many most likely tokens.
	Logprobs    bool
	TopLogprobs int
	// Images are the pictures in Prompt, from Vision.TokenizeImages, in
	// order; Prompt holds placeholder ids (negative) at their positions.
	Images []Image
}

// ImageMarker stands for one image in a prompt's text given to
// Vision.TokenizeImages: the n-th marker is the n-th image.
const ImageMarker = "<__media__>"

// Image is one picture of a prompt: its Tokens positions from Start
// hold the projector's embeddings of it, not tokens of the vocabulary.
type Image struct {
	Start, Tokens int
	Chunk         any // the engine's encoded-image handle
}

// CacheUsage is an engine that says how full its KV cache is.
type CacheUsage interface {
	// KVCacheUsage is the share of the KV cache the running sequences
	// hold, 0…1.
	KVCacheUsage() float64
}

// Vision is implemented by an engine that loaded a projector
// (Options.Projector, ModelInfo.Vision).
type Vision interface {
	// TokenizeImages tokenizes text, as Tokenize with addSpecial does, in
	// which each ImageMarker stands for the next of images (PNG, JPEG,
	// GIF, BMP … bytes). The prompt holds, in each image's place,
	// placeholder ids derived from the image's bytes (the same image
	// gives the same ids, so a later prompt with it reuses the cache).
	// free releases the images; call it once the generation is over.
	TokenizeImages(text string, images [][]byte) (prompt []int, imgs []Image, free func(), err error)
}

// GrammarWrap describes output made of Prefix, JSON the request's schema
// accepts, Suffix; with Repeat, one or more of those separated by
// Separator.
type GrammarWrap struct {
	Prefix, Suffix, Separator string
	Repeat                    bool
}

// Token is one sampled token. Piece holds the raw bytes of its text, which
// may be part of a multi-byte UTF-8 character.
type Token struct {
	ID    int
	Piece []byte
	// Logprob is the token's log probability, and Top the most likely
	// tokens at its place, best first, when the request asked for them:
	// the log-softmax of the model's logits, before penalties, biases,
	// grammar and temperature.
	Logprob float32
	Top     []TokenLogprob
}

// TokenLogprob is one candidate token and its log probability.
type TokenLogprob struct {
	ID      int
	Piece   []byte
	Logprob float32
}

// Finish reasons, as OpenAI names them.
const (
	FinishStop   = "stop"
	FinishLength = "length"
)

// Result summarises a finished generation.
type Result struct {
	PromptTokens     int
	CompletionTokens int
	FinishReason     string
	// CachedTokens counts the prompt tokens found in the slot's memory
	// (a previous request's prefix), not decoded again.
	CachedTokens int
	// Slot is the slot (llama.cpp sequence) that ran it, for engines
	// that keep a slot's memory between requests.
	Slot int
}

// Emit receives each token as soon as it is sampled. Returning ErrStop ends
// the generation cleanly; any other error aborts it and is returned by
// Generate.
type Emit func(Token) error

// EmitChoice receives each token of choice i as soon as it is sampled,
// as Emit does for one generation.
type EmitChoice func(choice int, t Token) error

// Choices is implemented by an engine that runs several choices of one
// request at once: it decodes the prompt once and copies it to the
// others. Choice i samples with req.Seed+i. n counts as n of the
// engine's slots.
type Choices interface {
	GenerateChoices(ctx context.Context, req Request, n int, emit EmitChoice) ([]Result, error)
}

// Engine is a loaded model able to run up to Options.Slots generations at once.
type Engine interface {
	Info() ModelInfo
	// Tokenize turns text into token ids, adding BOS when the model wants it
	// and addSpecial is true.
	Tokenize(text string, addSpecial bool) ([]int, error)
	// ChatPrompt renders messages with the model's chat template (or the
	// documented fallback) and returns the prompt text.
	ChatPrompt(msgs []Message) (string, error)
	// Check reports whether req can run: an error wrapping ErrGrammar
	// for a grammar or JSON schema the engine cannot enforce, ErrTokenID
	// for a bias on a token the model does not have.
	Check(req Request) error
	// Generate runs one sequence to completion, cancellation (ctx) or an Emit
	// error. Callers must not run more than Slots at once.
	Generate(ctx context.Context, req Request, emit Emit) (Result, error)
	// Embed returns the pooled, L2-normalised embedding of a tokenized
	// input (ErrPromptTooLong past one slot's context).
	Embed(ctx context.Context, input []int) ([]float32, error)
	// RerankInput is the token sequence a reranker scores for a query and
	// a document, made as llama.cpp's server makes it (the model's rerank
	// template, else [BOS] query [EOS] [SEP] document [EOS]).
	RerankInput(query, document string) ([]int, error)
	// Rank returns a reranker's relevance score of a RerankInput
	// (ErrNotReranker for a model that is none, ErrPromptTooLong past one
	// slot's context).
	Rank(ctx context.Context, input []int) (float32, error)
	// Close frees the model. Generations in flight end with ErrClosed.
	Close() error
}
