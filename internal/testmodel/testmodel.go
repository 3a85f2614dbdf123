// Package testmodel generates small, deterministic llama-architecture GGUF
// models that llama.cpp loads and generates from. Their weights are random,
// so what they generate is gibberish, but everything around the weights —
// tokenizer, hyperparameters, tensor names and shapes — is that of a real
// model, which lets tests and demos run the whole system without
// downloading one.
//
// The tokenizer is SentencePiece style (tokenizer.ggml.model "llama") with a
// byte-level vocabulary: <unk>, <s>, </s>, the 256 byte tokens <0x00> …
// <0xFF>, "▁" (U+2581, SentencePiece's space) and the printable ASCII
// characters. Plain text therefore tokenizes one character a token, and
// anything else falls back to its bytes.
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
	// Heads is the default number of attention heads; every model has
	// as many KV heads as heads (no grouped-query attention).
	Heads         = 4
	ContextLength = 2048
	RopeFreqBase  = 10000
	RMSEpsilon    = 1e-5
	// FeedForwardFactor times Dim is the default feed-forward length.
	FeedForwardFactor = 4
	// WeightStdDev is the standard deviation of the random weights; the
	// norm weights are 1.
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
var ErrOptions = errors.New("testmodel: invalid options")

// Options choose the model. A zero field takes its default.
type Options struct {
	Seed   int64 // of the random weights; default 1
	Layers int   // transformer blocks, 1 … MaxLayers; default 2
	Dim    int   // embedding length, a multiple of Heads in MinDim … MaxDim; default 64
	Heads  int   // attention heads, 1 … MaxHeads, each of an even size; default 4
	FF     int   // feed-forward length, 1 … MaxFF; default FeedForwardFactor × Dim
	// Vocab is the number of tokens, VocabSize … MaxVocab; default
	// VocabSize. Tokens beyond the byte-level ones are pairs of printable
	// ASCII characters ("th", "e!" …), which the tokenizer merges.
	Vocab int
	// ToolTemplate gives the model ToolChatTemplate as its
	// tokenizer.chat_template; without, it has none (and chats get the
	// worker's fallback).
	ToolTemplate bool
}

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
	if o.FF == 0 {
		o.FF = FeedForwardFactor * o.Dim
	}
	if o.Vocab == 0 {
		o.Vocab = VocabSize
	}
	return o
}

// Validate reports options out of range, after defaults are applied.
func (o Options) Validate() error {
	o = o.withDefaults()
	if o.Layers < 1 || o.Layers > MaxLayers {
		return fmt.Errorf("%w: layers %d is not in 1…%d", ErrOptions, o.Layers, MaxLayers)
	}
	if o.Heads < 1 || o.Heads > MaxHeads {
		return fmt.Errorf("%w: heads %d is not in 1…%d", ErrOptions, o.Heads, MaxHeads)
	}
	if o.Dim < MinDim || o.Dim > MaxDim || o.Dim%o.Heads != 0 || (o.Dim/o.Heads)%2 != 0 {
		return fmt.Errorf("%w: dim %d is not a multiple of %d (2 × heads) in %d…%d", ErrOptions, o.Dim, 2*o.Heads, MinDim, MaxDim)
	}
	if o.FF < 1 || o.FF > MaxFF {
		return fmt.Errorf("%w: feed-forward length %d is not in 1…%d", ErrOptions, o.FF, MaxFF)
	}
	if o.Vocab < VocabSize || o.Vocab > MaxVocab {
		return fmt.Errorf("%w: vocab %d is not in %d…%d", ErrOptions, o.Vocab, VocabSize, MaxVocab)
	}
	return nil
}

// custom reports whether o (with defaults) changes a hyperparameter that
// models had fixed before it was an option.
func (o Options) custom() bool {
	return o.Heads != Heads || o.FF != FeedForwardFactor*o.Dim || o.Vocab != VocabSize
}

// token types of llama.cpp (enum llama_token_type).
const (
	tokenNormal  = 1
	tokenUnknown = 2
	tokenControl = 3
	tokenByte    = 6
)

// vocabulary returns the tokens, their scores and their types: the
// byte-level vocabulary, then n - VocabSize pairs of printable characters.
func vocabulary(n int) (tokens []string, scores []float32, types []int32) {
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
// default and least Options.Vocab. MaxVocab adds every pair of printable
// ASCII characters.
var (
	VocabSize = func() int { t, _, _ := vocabulary(0); return len(t) }()
	MaxVocab  = VocabSize + 94*94
)

// metadata returns the model's metadata, in the order llama.cpp's
// converters write it.
func metadata(o Options) gguf.Metadata {
	tokens, scores, types := vocabulary(o.Vocab)
	u32 := func(n int) gguf.Value { return gguf.Uint32(uint32(n)) }
	var md gguf.Metadata
	add := func(key string, v gguf.Value) { md = append(md, gguf.KV{Key: key, Value: v}) }
	add("general.architecture", gguf.String("llama"))
	name := fmt.Sprintf("apiary test model (seed %d, %d layers, dim %d)", o.Seed, o.Layers, o.Dim)
	if o.custom() {
		name = fmt.Sprintf("apiary test model (seed %d, %d layers, dim %d, %d heads, feed-forward %d, vocab %d)",
			o.Seed, o.Layers, o.Dim, o.Heads, o.FF, o.Vocab)
	}
	add("general.name", gguf.String(name))
	add("general.file_type", gguf.Uint32(0)) // all F32
	add("llama.vocab_size", u32(len(tokens)))
	add("llama.context_length", u32(ContextLength))
	add("llama.embedding_length", u32(o.Dim))
	add("llama.block_count", u32(o.Layers))
	add("llama.feed_forward_length", u32(o.FF))
	add("llama.rope.dimension_count", u32(o.Dim/o.Heads))
	add("llama.rope.freq_base", gguf.Float32(RopeFreqBase))
	add("llama.attention.head_count", u32(o.Heads))
	add("llama.attention.head_count_kv", u32(o.Heads))
	add("llama.attention.layer_norm_rms_epsilon", gguf.Float32(RMSEpsilon))
	add("tokenizer.ggml.model", gguf.String("llama"))
	add("tokenizer.ggml.tokens", gguf.Array(tokens))
	add("tokenizer.ggml.scores", gguf.Array(scores))
	add("tokenizer.ggml.token_type", gguf.Array(types))
	add("tokenizer.ggml.bos_token_id", u32(BOSToken))
	add("tokenizer.ggml.eos_token_id", u32(EOSToken))
	add("tokenizer.ggml.unknown_token_id", u32(UnknownToken))
	add("tokenizer.ggml.add_bos_token", gguf.Bool(true))
	add("tokenizer.ggml.add_eos_token", gguf.Bool(false))
	if o.ToolTemplate {
		add("tokenizer.chat_template", gguf.String(ToolChatTemplate))
	}
	return md
}

// tensor is one tensor of the model: its layout and whether it is a norm
// (all ones) or random.
type tensor struct {
	gguf.Tensor
	norm bool
}

// tensors lists the model's tensors in file order. Shapes are in ggml
// order, [columns, rows]: a weight that maps n inputs to m outputs is
// [n, m].
func tensors(o Options) []tensor {
	dim, ff, vocab := uint64(o.Dim), uint64(o.FF), uint64(o.Vocab)
	dimKV := dim // K and V have as many heads as Q
	mk := func(name string, norm bool, shape ...uint64) tensor {
		return tensor{Tensor: gguf.Tensor{Name: name, Shape: shape, Type: gguf.TypeF32}, norm: norm}
	}
	ts := []tensor{
		mk("token_embd.weight", false, dim, vocab),
		mk("output_norm.weight", true, dim),
		mk("output.weight", false, dim, vocab),
	}
	for l := range o.Layers {
		blk := func(name string) string { return fmt.Sprintf("blk.%d.%s.weight", l, name) }
		ts = append(ts,
			mk(blk("attn_norm"), true, dim),
			mk(blk("attn_q"), false, dim, dim),
			mk(blk("attn_k"), false, dim, dimKV),
			mk(blk("attn_v"), false, dim, dimKV),
			mk(blk("attn_output"), false, dim, dim),
			mk(blk("ffn_norm"), true, dim),
			mk(blk("ffn_gate"), false, dim, ff),
			mk(blk("ffn_up"), false, dim, ff),
			mk(blk("ffn_down"), false, ff, dim),
		)
	}
	return ts
}

// Write writes the model o describes to w. The same options always give
// the same bytes. Tensors are generated one at a time, so memory use is
// that of the largest tensor.
func Write(w io.Writer, o Options) error {
	if err := o.Validate(); err != nil {
		return err
	}
	o = o.withDefaults()
	ts := tensors(o)
	layouts := make([]gguf.Tensor, len(ts))
	for i, t := range ts {
		layouts[i] = t.Tensor
	}
	gw, err := gguf.NewWriter(w, metadata(o), layouts)
	if err != nil {
		return fmt.Errorf("testmodel: %w", err)
	}
	// One generator for all weights, drawn in file order: the bytes depend
	// on the seed and the options only.
	rng := rand.New(rand.NewPCG(uint64(o.Seed), 0x61706961727921)) // "apiary!"
	var buf []byte
	for _, t := range ts {
		n := 1
		for _, d := range t.Shape {
			n *= int(d)
		}
		buf = buf[:0]
		for range n {
			v := float32(1)
			if !t.norm {
				v = float32(rng.NormFloat64() * WeightStdDev)
			}
			buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(v))
		}
		if err := gw.WriteTensor(buf); err != nil {
			return fmt.Errorf("testmodel: %w", err)
		}
	}
	if err := gw.Close(); err != nil {
		return fmt.Errorf("testmodel: %w", err)
	}
	return nil
}

// WriteFile writes the model o describes to path, through a temporary file
// in the same directory renamed into place, so that path never holds a
// partial model. An existing file at path is replaced.
func WriteFile(path string, o Options) (err error) {
	if err := o.Validate(); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return fmt.Errorf("testmodel: %w", err)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if err := Write(tmp, o); err != nil {
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		return fmt.Errorf("testmodel: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("testmodel: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("testmodel: %w", err)
	}
	return nil
}
