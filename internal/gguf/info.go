package gguf

import (
	"fmt"
	"math"
	"math/bits"
)

// Info is what apiary needs to know about a model without loading it: what
// it is, how big it is, and the hyperparameters that size its KV cache.
// Hyperparameters are read from the architecture-prefixed keys
// ("llama.block_count", …); a missing key reads as 0. Some architectures
// store a per-layer array for the head counts or the feed-forward length;
// Info takes the largest element, which keeps the memory estimate an upper
// bound.
type Info struct {
	Architecture      string   `json:"architecture"`     // general.architecture
	Name              string   `json:"name,omitempty"`   // general.name
	FileType          FileType `json:"file_type"`        // general.file_type
	ContextLength     uint64   `json:"context_length"`   // trained context, {arch}.context_length
	BlockCount        uint64   `json:"block_count"`      // layers, {arch}.block_count
	EmbeddingLength   uint64   `json:"embedding_length"` // {arch}.embedding_length
	FeedForwardLength uint64   `json:"feed_forward_length"`
	HeadCount         uint64   `json:"head_count"`    // {arch}.attention.head_count
	HeadCountKV       uint64   `json:"head_count_kv"` // {arch}.attention.head_count_kv, default HeadCount
	// KeyLength and ValueLength are the per-head sizes of K and V,
	// {arch}.attention.key_length / value_length, default
	// EmbeddingLength/HeadCount.
	KeyLength    uint64 `json:"key_length"`
	ValueLength  uint64 `json:"value_length"`
	VocabSize    uint64 `json:"vocab_size"`              // len(tokenizer.ggml.tokens)
	ChatTemplate string `json:"chat_template,omitempty"` // tokenizer.chat_template
	// Pooling is the pooling {arch}.pooling_type names, as llama.cpp
	// names it (PoolingNames: "mean", "cls", "last", "rank" …); "" when
	// the GGUF names none. A reranker's is "rank".
	Pooling        string `json:"pooling,omitempty"`
	ParameterCount uint64 `json:"parameter_count"` // elements of all tensors
	WeightsBytes   uint64 `json:"weights_bytes"`   // bytes of all tensors
}

// Info summarises the file.
func (f *File) Info() Info {
	md := f.Metadata
	arch := f.Architecture()
	key := func(k string) string { return arch + "." + k }
	i := Info{
		Architecture:      arch,
		Name:              md.String("general.name"),
		FileType:          FileType(md.Uint("general.file_type")),
		ContextLength:     md.Uint(key("context_length")),
		BlockCount:        md.Uint(key("block_count")),
		EmbeddingLength:   md.Uint(key("embedding_length")),
		FeedForwardLength: maxUint(md, key("feed_forward_length")),
		HeadCount:         maxUint(md, key("attention.head_count")),
		HeadCountKV:       maxUint(md, key("attention.head_count_kv")),
		KeyLength:         md.Uint(key("attention.key_length")),
		ValueLength:       md.Uint(key("attention.value_length")),
		ChatTemplate:      md.String("tokenizer.chat_template"),
	}
	if _, ok := md.Lookup(key("pooling_type")); ok {
		i.Pooling = PoolingName(md.Uint(key("pooling_type")))
	}
	if v, ok := md.Lookup("tokenizer.ggml.tokens"); ok && v.Type() == TypeArray {
		i.VocabSize = uint64(v.Len())
	} else {
		i.VocabSize = md.Uint(key("vocab_size"))
	}
	if i.HeadCountKV == 0 {
		i.HeadCountKV = i.HeadCount
	}
	if i.HeadCount > 0 {
		if i.KeyLength == 0 {
			i.KeyLength = i.EmbeddingLength / i.HeadCount
		}
		if i.ValueLength == 0 {
			i.ValueLength = i.EmbeddingLength / i.HeadCount
		}
	}
	for _, t := range f.Tensors {
		i.ParameterCount += t.Elements
		i.WeightsBytes += t.Size
	}
	return i
}

// PoolingNames are llama.cpp's pooling types (enum llama_pooling_type)
// by their number.
var PoolingNames = []string{"none", "mean", "cls", "last", "rank"}

// PoolingName names pooling type n as llama.cpp does ("pooling 7" for
// one it has no name for).
func PoolingName(n uint64) string {
	if n < uint64(len(PoolingNames)) {
		return PoolingNames[n]
	}
	return fmt.Sprintf("pooling %d", n)
}

// maxUint reads an integer, or the largest element of an integer array.
func maxUint(md Metadata, key string) uint64 {
	v, ok := md.Lookup(key)
	if !ok {
		return 0
	}
	if u, ok := v.AsUint(); ok {
		return u
	}
	us, _ := v.AsUints()
	var m uint64
	for _, u := range us {
		m = max(m, u)
	}
	return m
}

// Constants of the memory estimate.
const (
	// DefaultContext is the context EstimateMemory assumes when given none
	// (and the model's trained context is larger).
	DefaultContext = 4096
	// ComputeBatch is the micro-batch (llama.cpp's n_ubatch) the compute
	// buffer allowance is sized for.
	ComputeBatch = 512
	// ComputeOverhead is the fixed part of the compute allowance: graph
	// metadata, backend scratch buffers and allocator slack.
	ComputeOverhead = 32 << 20
)

// Memory is an estimate of the memory a model needs once loaded.
type Memory struct {
	Context uint64 `json:"context"` // the context length it was computed for
	Weights uint64 `json:"weights_bytes"`
	KVCache uint64 `json:"kv_cache_bytes"`
	Compute uint64 `json:"compute_bytes"`
	Total   uint64 `json:"total_bytes"`
}

// EstimateMemory estimates the memory needed to serve the model with a
// context of ctx tokens (shared by all slots); ctx ≤ 0 means the trained
// context length capped at DefaultContext. All sizes are bytes:
//
//	Weights = the tensors' bytes as stored (llama.cpp maps them as they are)
//	KVCache = 2 (f16) × ctx × layers × head_count_kv × (key_length + value_length)
//	        = 2 × layers × ctx × (embd/heads × heads_kv) × 2 bytes when the
//	          head sizes are the default embd/heads
//	Compute = 4 (f32) × ComputeBatch × (vocab + 4×embd + 2×ff + heads×ctx)
//	          + ComputeOverhead
//	Total   = Weights + KVCache + Compute
//
// The compute term is an allowance for the activations of one micro-batch
// of ComputeBatch tokens: its logits (vocab), the hidden and feed-forward
// activations (embd, ff) and the attention scores against the whole context
// (heads×ctx), which llama.cpp materialises when flash attention is off. It
// errs on the high side; with flash attention the real buffer is smaller.
func (i Info) EstimateMemory(ctx int) Memory {
	n := uint64(ctx)
	if ctx <= 0 {
		n = DefaultContext
		if i.ContextLength > 0 {
			n = min(i.ContextLength, DefaultContext)
		}
	}
	m := Memory{Context: n, Weights: i.WeightsBytes}
	m.KVCache = mul(2, n, i.BlockCount, i.HeadCountKV, add(i.KeyLength, i.ValueLength))
	perToken := add(i.VocabSize, mul(4, i.EmbeddingLength), mul(2, i.FeedForwardLength), mul(i.HeadCount, n))
	m.Compute = add(mul(4, ComputeBatch, perToken), ComputeOverhead)
	m.Total = add(m.Weights, m.KVCache, m.Compute)
	return m
}

// mul and add saturate at math.MaxUint64, so that absurd hyperparameters
// in a file give an estimate that fits nowhere instead of wrapping around
// to one that fits everywhere.
func mul(xs ...uint64) uint64 {
	p := uint64(1)
	for _, x := range xs {
		hi, lo := bits.Mul64(p, x)
		if hi != 0 {
			return math.MaxUint64
		}
		p = lo
	}
	return p
}

func add(xs ...uint64) uint64 {
	var s uint64
	for _, x := range xs {
		var carry uint64
		if s, carry = bits.Add64(s, x, 0); carry != 0 {
			return math.MaxUint64
		}
	}
	return s
}

// EstimateMemory is f.Info().EstimateMemory(ctx).
func (f *File) EstimateMemory(ctx int) Memory {
	return f.Info().EstimateMemory(ctx)
}
