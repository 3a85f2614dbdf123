// Package testmodel generates small, deterministic GGUF models that
// llama.cpp loads and generates from, of the architectures Archs lists
// (llama by default). Their weights are random, so what they generate is
// gibberish, but everything around the weights — tokenizer,
// hyperparameters, tensor names and shapes — is that of a real model of the
// architecture, which lets tests and demos run the whole system without
// downloading one.
//
// The tokenizer, the same for every architecture, is SentencePiece style
// (tokenizer.ggml.model "llama") with a byte-level vocabulary: <unk>, <s>,
// </s>, the 256 byte tokens <0x00> … <0xFF>, "▁" (U+2581, SentencePiece's
// space) and the printable ASCII characters. Plain text therefore
// tokenizes one character a token, and anything else falls back to its
// bytes. Such a model writes mostly byte tokens, which are no text; a text
// model (Options.Text) has words besides, and writes only those.
package testmodel

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"

	"github.com/apiary-llm/apiary/internal/gguf"
)

// Hyperparameters of every test model, and the defaults of Options.
const (
	// Heads is the default number of attention heads. Llama models have
	// as many KV heads as heads by default (no grouped-query attention),
	// the other architectures half as many when Heads is even.
	Heads         = 4
	ContextLength = 2048
	// RopeFreqBase and RMSEpsilon are llama's; the other architectures
	// take their families' (1e6 and 1e-6 for Qwen and Gemma, …).
	RopeFreqBase = 10000
	RMSEpsilon   = 1e-5
	// FeedForwardFactor times Dim is the default feed-forward length.
	FeedForwardFactor = 4
	// WeightStdDev is the standard deviation of llama's random weights
	// and of every model's random vectors; the norm weights are 1.
	WeightStdDev = 0.02
)

// Token ids of the special tokens.
const (
	UnknownToken = 0
	BOSToken     = 1
	EOSToken     = 2
)

// Limits of Options.
const (
	MaxLayers = 64
	MinDim    = 8
	MaxDim    = 4096
	MaxHeads  = 128
	MaxFF     = 4 * MaxDim
)

// ErrOptions means Options are out of range.
var ErrOptions = errors.New("invalid options")

// Options choose the model. A zero field takes its default.
type Options struct {
	// Arch is the architecture, one of Archs; default Llama.
	Arch   Arch
	Seed   int64 // of the random weights; default 1
	Layers int   // transformer blocks, 1 … MaxLayers; default 2
	Dim    int   // embedding length, a multiple of Heads in MinDim … MaxDim; default 64
	Heads  int   // attention heads, 1 … MaxHeads, each of an even size; default 4
	// KVHeads is the number of K and V heads, a divisor of Heads;
	// default Heads for Llama, Heads/2 (when even) for the others. Gemma4's
	// global layers have half as many (when even).
	KVHeads int
	// FF is the feed-forward length, 1 … MaxFF; default FeedForwardFactor
	// × Dim. Each expert of a mixture of experts has FF / ExpertsUsed.
	FF int
	// Experts and ExpertsUsed are the experts of each layer of a mixture
	// of experts (Qwen3MoE), 2 … MaxExperts and 1 … Experts; default
	// DefaultExperts and DefaultExpertsUsed. Other architectures take
	// none.
	Experts, ExpertsUsed int
	// Vocab is the number of tokens, VocabSize … MaxVocab; default
	// VocabSize. Tokens beyond the byte-level ones are pairs of printable
	// ASCII characters ("th", "e!" …), which the tokenizer merges. A text
	// model's are TextVocabSize … MaxVocab+TextVocabSize-VocabSize
	// (default TextVocabSize): its words come before the pairs.
	Vocab int
	// Text makes a text model: words in its vocabulary (after the
	// byte-level tokens, which keep their ids), and weights that let it
	// write nothing else (text.go), so that what it generates reads as
	// words, not bytes. Default false: the byte-level model that other
	// packages' tests rely on.
	Text bool
	// ToolTemplate gives the model ToolChatTemplate as its
	// tokenizer.chat_template; without, it has none (and chats get the
	// worker's fallback).
	ToolTemplate bool
	// Rerank makes a reranker, as Qwen3-Reranker is one to llama.cpp: a
	// Qwen3 model (the default Arch with Rerank; no other is allowed)
	// whose metadata names rank pooling ({arch}.pooling_type 4) and two
	// classifier labels ("yes", "no"), with a classifier head
	// cls.output.weight ([dim, 2]) and RerankTemplate as its
	// tokenizer.chat_template.rerank. llama.cpp's rank pooling takes the
	// last token's state through the head and a softmax: a document's
	// score is the probability of "yes", in 0…1.
	Rerank bool
}

// RerankTemplate is a reranker's tokenizer.chat_template.rerank: the
// prompt llama.cpp's server (and the worker) makes of a query and a
// document, as Qwen3-Reranker's is, made short.
const RerankTemplate = "Query: {query}\nDocument: {document}\nRelevant:"

// RerankLabels are a reranker's {arch}.classifier.output_labels.
var RerankLabels = []string{"yes", "no"}

// poolingRank is llama.cpp's LLAMA_POOLING_TYPE_RANK.
const poolingRank = 4

// ToolChatTemplate is a ChatML chat template with Hermes/Qwen-style tool
// calling: tools listed in the system message in <tools>, calls written
// as <tool_call>{"name", "arguments"}</tool_call>, results given back in
// <tool_response>. It is Qwen 2.5's template made shorter (every
// character of a test model's prompt is a token).
const ToolChatTemplate = `{%- if tools %}
{{- '<|im_start|>system\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\n\n' }}{%- endif %}
{{- '# Tools\n<tools>' }}
{%- for tool in tools %}{{- '\n' }}{{- tool | tojson }}{%- endfor %}
{{- '\n</tools>\nCall a function as <tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'user' or (message.role == 'system' and not loop.first) or (message.role == 'assistant' and not message.tool_calls) %}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant' }}
{%- if message.content %}{{- '\n' + message.content }}{%- endif %}
{%- for tool_call in message.tool_calls %}
{{- '\n<tool_call>\n{"name": "' + tool_call.function.name + '", "arguments": ' + tool_call.function.arguments | tojson + '}\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\n' }}
{%- elif message.role == 'tool' %}
{%- if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\n<tool_response>\n' + message.content + '\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\n' }}{%- endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}`

func (o Options) withDefaults() Options {
	if o.Arch == "" {
		o.Arch = Llama
		if o.Rerank {
			o.Arch = Qwen3
		}
	}
	if o.Seed == 0 {
		o.Seed = 1
	}
	if o.Layers == 0 {
		o.Layers = 2
	}
	if o.Dim == 0 {
		o.Dim = 64
	}
	if o.Heads == 0 {
		o.Heads = Heads
	}
	if o.KVHeads == 0 {
		o.KVHeads = o.Heads
		if o.Arch != Llama && o.Heads%2 == 0 {
			o.KVHeads = o.Heads / 2
		}
	}
	if o.FF == 0 {
		o.FF = FeedForwardFactor * o.Dim
	}
	if o.Vocab == 0 {
		o.Vocab, _ = o.vocabRange()
	}
	if o.Arch.moe() {
		if o.Experts == 0 {
			o.Experts = DefaultExperts
		}
		if o.ExpertsUsed == 0 {
			o.ExpertsUsed = min(DefaultExpertsUsed, o.Experts)
		}
	}
	return o
}

// Validate reports options out of range, after defaults are applied.
func (o Options) Validate() error {
	if o.Arch != "" && !o.Arch.known() {
		return fmt.Errorf("%w: unknown architecture %q (known: %s)", ErrOptions, o.Arch, ArchNames())
	}
	o = o.withDefaults()
	if o.Rerank && o.Arch != Qwen3 {
		return fmt.Errorf("%w: a reranker is of architecture %s, not %s", ErrOptions, Qwen3, o.Arch)
	}
	if o.Layers < 1 || o.Layers > MaxLayers {
		return fmt.Errorf("%w: layers %d is not in 1…%d", ErrOptions, o.Layers, MaxLayers)
	}
	if o.Layers < 2 && o.Arch.hybrid() {
		return fmt.Errorf("%w: architecture %s needs at least 2 layers (it alternates two kinds)", ErrOptions, o.Arch)
	}
	if o.Heads < 1 || o.Heads > MaxHeads {
		return fmt.Errorf("%w: heads %d is not in 1…%d", ErrOptions, o.Heads, MaxHeads)
	}
	if o.Dim < MinDim || o.Dim > MaxDim || o.Dim%o.Heads != 0 || (o.Dim/o.Heads)%2 != 0 {
		return fmt.Errorf("%w: dim %d is not a multiple of %d (2 × heads) in %d…%d", ErrOptions, o.Dim, 2*o.Heads, MinDim, MaxDim)
	}
	if o.KVHeads < 1 || o.KVHeads > o.Heads || o.Heads%o.KVHeads != 0 {
		return fmt.Errorf("%w: KV heads %d do not divide heads %d", ErrOptions, o.KVHeads, o.Heads)
	}
	if o.FF < 1 || o.FF > MaxFF {
		return fmt.Errorf("%w: feed-forward length %d is not in 1…%d", ErrOptions, o.FF, MaxFF)
	}
	switch {
	case !o.Arch.moe() && (o.Experts != 0 || o.ExpertsUsed != 0):
		return fmt.Errorf("%w: architecture %s has no experts (only %s has)", ErrOptions, o.Arch, Qwen3MoE)
	case o.Arch.moe() && (o.Experts < 2 || o.Experts > MaxExperts):
		return fmt.Errorf("%w: experts %d is not in 2…%d", ErrOptions, o.Experts, MaxExperts)
	case o.Arch.moe() && (o.ExpertsUsed < 1 || o.ExpertsUsed > o.Experts):
		return fmt.Errorf("%w: experts used %d is not in 1…%d (the experts)", ErrOptions, o.ExpertsUsed, o.Experts)
	}
	if least, most := o.vocabRange(); o.Vocab < least || o.Vocab > most {
		return fmt.Errorf("%w: vocab %d is not in %d…%d", ErrOptions, o.Vocab, least, most)
	}
	return nil
}

// vocabRange is the least and the most tokens of the model's vocabulary;
// the least is the default.
func (o Options) vocabRange() (least, most int) {
	if o.Text {
		return TextVocabSize, MaxVocab + TextVocabSize - VocabSize
	}
	return VocabSize, MaxVocab
}

// custom reports whether o (with defaults) changes a hyperparameter that
// llama models had fixed before it was an option.
func (o Options) custom() bool {
	least, _ := o.vocabRange()
	return o.Heads != Heads || o.KVHeads != o.Heads || o.FF != FeedForwardFactor*o.Dim || o.Vocab != least
}

// name is the model's general.name. A llama model's names only the seed,
// layers and dimension unless it changes another hyperparameter; the
// other architectures' name every hyperparameter. None names the
// architecture (general.architecture does): llama.cpp gives special
// tokens of a model whose name contains "phi3" a treatment that needs
// Phi-3's vocabulary. A text model's name says so at the end.
func (o Options) name() string {
	text := ""
	if o.Text {
		text = ", text"
	}
	if o.Arch == Llama && !o.custom() {
		return fmt.Sprintf("apiary test model (seed %d, %d layers, dim %d%s)", o.Seed, o.Layers, o.Dim, text)
	}
	heads := fmt.Sprintf("%d heads", o.Heads)
	if o.KVHeads != o.Heads {
		heads += fmt.Sprintf(", %d KV heads", o.KVHeads)
	}
	experts := ""
	if o.Arch.moe() {
		experts = fmt.Sprintf(", %d experts, %d used", o.Experts, o.ExpertsUsed)
	}
	if o.Rerank {
		text += ", reranker"
	}
	return fmt.Sprintf("apiary test model (seed %d, %d layers, dim %d, %s, feed-forward %d, vocab %d%s%s)",
		o.Seed, o.Layers, o.Dim, heads, o.FF, o.Vocab, experts, text)
}

// token types of llama.cpp (enum llama_token_type).
const (
	tokenNormal  = 1
	tokenUnknown = 2
	tokenControl = 3
	tokenByte    = 6
)

// vocabulary returns the tokens, their scores and their types: the
// byte-level vocabulary, a text model's words, then pairs of printable
// characters up to n tokens.
func vocabulary(n int, text bool) (tokens []string, scores []float32, types []int32) {
	add := func(tok string, typ int32) {
		tokens = append(tokens, tok)
		types = append(types, typ)
		scores = append(scores, 0)
	}
	add("<unk>", tokenUnknown)
	add("<s>", tokenControl)
	add("</s>", tokenControl)
	for b := range 256 {
		add(fmt.Sprintf("<0x%02X>", b), tokenByte)
	}
	add("▁", tokenNormal)
	for c := '!'; c <= '~'; c++ {
		add(string(c), tokenNormal)
	}
	if text {
		for _, w := range textWords {
			add("▁"+w, tokenNormal)
		}
	}
	for a := '!'; a <= '~' && len(tokens) < n; a++ {
		for b := '!'; b <= '~' && len(tokens) < n; b++ {
			add(string([]rune{a, b}), tokenNormal)
		}
	}
	// Normal tokens get decreasing scores, as real SentencePiece
	// vocabularies have; they decide which pairs merge first.
	for i, typ := range types {
		if typ == tokenNormal {
			scores[i] = -float32(i)
		}
	}
	return tokens, scores, types
}

// VocabSize is the number of tokens of the byte-level vocabulary: the
// default and least Options.Vocab of a byte-level model. MaxVocab adds
// every pair of printable ASCII characters.
var (
	VocabSize = func() int { t, _, _ := vocabulary(0, false); return len(t) }()
	MaxVocab  = VocabSize + 94*94
)

// metadata returns the model's metadata, in the order llama.cpp's
// converters write it.
func metadata(s shape) gguf.Metadata {
	tokens, scores, types := vocabulary(s.Vocab, s.Text)
	u32 := func(n int) gguf.Value { return gguf.Uint32(uint32(n)) }
	var md gguf.Metadata
	add := func(key string, v gguf.Value) { md = append(md, gguf.KV{Key: key, Value: v}) }
	key := func(k string) string { return string(s.Arch) + "." + k }
	add("general.architecture", gguf.String(string(s.Arch)))
	add("general.name", gguf.String(s.name()))
	add("general.file_type", gguf.Uint32(0)) // all F32
	add(key("vocab_size"), u32(len(tokens)))
	add(key("context_length"), u32(ContextLength))
	add(key("embedding_length"), u32(s.Dim))
	add(key("block_count"), u32(s.Layers))
	add(key("feed_forward_length"), u32(s.FF))
	add(key("rope.dimension_count"), u32(s.ropeDims()))
	add(key("rope.freq_base"), gguf.Float32(s.Arch.ropeFreqBase()))
	add(key("attention.head_count"), u32(s.Heads))
	add(key("attention.head_count_kv"), s.headCountKV())
	add(key("attention.layer_norm_rms_epsilon"), gguf.Float32(s.Arch.rmsEpsilon()))
	archMetadata(s, add)
	if s.Rerank {
		add(key("pooling_type"), u32(poolingRank))
		add(key("classifier.output_labels"), gguf.Array(RerankLabels))
	}
	add("tokenizer.ggml.model", gguf.String("llama"))
	add("tokenizer.ggml.tokens", gguf.Array(tokens))
	add("tokenizer.ggml.scores", gguf.Array(scores))
	add("tokenizer.ggml.token_type", gguf.Array(types))
	add("tokenizer.ggml.bos_token_id", u32(BOSToken))
	add("tokenizer.ggml.eos_token_id", u32(EOSToken))
	add("tokenizer.ggml.unknown_token_id", u32(UnknownToken))
	add("tokenizer.ggml.add_bos_token", gguf.Bool(true))
	add("tokenizer.ggml.add_eos_token", gguf.Bool(false))
	if s.ToolTemplate {
		add("tokenizer.chat_template", gguf.String(ToolChatTemplate))
	}
	if s.Rerank {
		add("tokenizer.chat_template.rerank", gguf.String(RerankTemplate))
	}
	return md
}

// tensor is one tensor of the model: its layout and its values, fill(i)
// for element i, or, when fill is nil, random weights of mean 0 and
// standard deviation std; adjust, when set, changes value v of element i
// after that (a text model's, text.go).
type tensor struct {
	gguf.Tensor
	fill   func(i int) float32
	std    float64
	adjust func(i int, v float32) float32
}

// Write writes the model o describes to w. The same options always give
// the same bytes. Tensors are generated one at a time, so memory use is
// that of the largest tensor.
func Write(w io.Writer, o Options) error {
	if err := o.Validate(); err != nil {
		return err
	}
	s := shapeOf(o.withDefaults())
	return writeGGUF(w, metadata(s), tensors(s), s.Seed)
}

// writeGGUF writes a GGUF file of metadata md and tensors ts, whose
// random weights are drawn from seed.
func writeGGUF(w io.Writer, md gguf.Metadata, ts []tensor, seed int64) error {
	layouts := make([]gguf.Tensor, len(ts))
	for i, t := range ts {
		layouts[i] = t.Tensor
	}
	gw, err := gguf.NewWriter(w, md, layouts)
	if err != nil {
		return err
	}
	// One generator for all weights, drawn in file order: the bytes depend
	// on the seed and the options only.
	rng := rand.New(rand.NewPCG(uint64(seed), 0x61706961727921)) // "apiary!"
	var buf []byte
	for _, t := range ts {
		n := 1
		for _, d := range t.Shape {
			n *= int(d)
		}
		buf = buf[:0]
		for i := range n {
			var v float32
			if t.fill != nil {
				v = t.fill(i)
			} else {
				v = float32(rng.NormFloat64() * t.std)
			}
			if t.adjust != nil {
				v = t.adjust(i, v)
			}
			buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(v))
		}
		if err := gw.WriteTensor(buf); err != nil {
			return err
		}
	}
	return gw.Close()
}

// WriteFile writes the model o describes to path, through a temporary file
// in the same directory renamed into place, so that path never holds a
// partial model. An existing file at path is replaced.
func WriteFile(path string, o Options) error {
	if err := o.Validate(); err != nil {
		return err
	}
	return writeFileVia(path, func(w io.Writer) error { return Write(w, o) })
}

// writeFileVia writes path with write, through a temporary file in the
// same directory renamed into place (mode 0644).
func writeFileVia(path string, write func(io.Writer) error) (err error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if err := write(tmp); err != nil {
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
