package testmodel

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/apiary-llm/apiary/internal/gguf"
)

// Arch is a model architecture, named as llama.cpp names it in
// general.architecture (src/llama-arch.cpp).
type Arch string

// The architectures Write knows. Each model has what llama.cpp's loader of
// that architecture requires at the pinned llama.cpp, and the features
// that set the real models of the family apart, at a tiny size:
const (
	// Llama: grouped-query attention optional, SwiGLU feed-forward.
	Llama Arch = "llama"
	// Qwen2: biases on Q, K and V.
	Qwen2 Arch = "qwen2"
	// Qwen3: RMS norms on Q and K (per head).
	Qwen3 Arch = "qwen3"
	// Qwen3MoE: Qwen3 attention, a mixture of experts in every layer
	// (router ffn_gate_inp, stacked ffn_{gate,up,down}_exps).
	Qwen3MoE Arch = "qwen3moe"
	// Qwen35: hybrid; layers alternate between linear attention (a gated
	// delta net: fused attn_qkv, attn_gate, ssm_* tensors, a recurrent
	// state) and full attention with a gated Q (attn_q twice as wide),
	// Q/K norms and interleaved multi-section RoPE over a quarter of each
	// head; the last layer has full attention.
	Qwen35 Arch = "qwen35"
	// Gemma3: embeddings scaled by √dim, tied output, Q/K norms, post-
	// attention and post-feed-forward norms, GELU feed-forward, and
	// sliding-window attention on every other layer (the last is global).
	Gemma3 Arch = "gemma3"
	// Gemma4: Gemma3's layout with Gemma 4 31B's specifics: global layers
	// with heads twice as large, fewer KV heads and V = K (no attn_v),
	// proportional RoPE through rope_freqs, a per-layer output scale and
	// final logit soft-capping.
	Gemma4 Arch = "gemma4"
	// Phi3: fused Q/K/V (attn_qkv) and fused gate/up (ffn_up twice as
	// wide), no ffn_gate.
	Phi3 Arch = "phi3"
	// Mistral3: Ministral 3's YaRN RoPE scaling and attention temperature
	// scaling.
	Mistral3 Arch = "mistral3"
)

// Archs returns the architectures Write knows, Llama first.
func Archs() []Arch {
	return []Arch{Llama, Qwen2, Qwen3, Qwen3MoE, Qwen35, Gemma3, Gemma4, Phi3, Mistral3}
}

// ArchNames is Archs as one comma-separated string, for messages and help.
func ArchNames() string {
	archs := Archs()
	names := make([]string, 0, len(archs))
	for _, a := range archs {
		names = append(names, string(a))
	}
	return strings.Join(names, ", ")
}

func (a Arch) known() bool { return slices.Contains(Archs(), a) }

// moe reports whether the architecture's layers are mixtures of experts.
func (a Arch) moe() bool { return a == Qwen3MoE }

// hybrid reports whether the architecture's layers alternate between two
// kinds: sliding-window and global attention (Gemma), linear and full
// attention (Qwen 3.5). llama.cpp needs both kinds present.
func (a Arch) hybrid() bool { return a == Gemma3 || a == Gemma4 || a == Qwen35 }

// tied reports whether the architecture's models have no output.weight
// (but a text model, which needs one): llama.cpp then uses token_embd as
// the output, as the real models of the family do.
func (a Arch) tied() bool { return a == Gemma3 || a == Gemma4 }

// Hyperparameters of the architectures other than llama.
const (
	// SlidingWindow is the attention window of Gemma's sliding-window
	// layers, in tokens: small, so that short prompts cross it.
	SlidingWindow = 64
	// ConvKernel is the convolution length of Qwen 3.5's linear attention.
	ConvKernel = 4
	// DefaultExperts and DefaultExpertsUsed are the MoE defaults of
	// Options; MaxExperts bounds Options.Experts.
	DefaultExperts     = 4
	DefaultExpertsUsed = 2
	MaxExperts         = 64
	// yarnFactor is how much Mistral3's YaRN scaling stretches its
	// original context to ContextLength.
	yarnFactor = 4
)

// ropeFreqBase is the RoPE base of the global-attention layers.
func (a Arch) ropeFreqBase() float32 {
	switch a {
	case Qwen2, Qwen3, Qwen3MoE, Gemma3, Gemma4, Mistral3:
		return 1e6
	case Qwen35:
		return 1e7
	}
	return RopeFreqBase
}

func (a Arch) rmsEpsilon() float32 {
	switch a {
	case Qwen2, Qwen3, Qwen3MoE, Qwen35, Gemma3, Gemma4:
		return 1e-6
	}
	return RMSEpsilon
}

// shape is what a model's tensors and metadata derive from its Options.
type shape struct {
	Options
	headDim  int // of Q, K and V; of Gemma4's sliding-window layers
	expertFF int // feed-forward length of each expert
}

func shapeOf(o Options) shape {
	s := shape{Options: o, headDim: o.Dim / o.Heads}
	if o.Arch.moe() {
		s.expertFF = max(1, o.FF/o.ExpertsUsed)
	}
	return s
}

// swa reports whether Gemma's layer l has sliding-window attention: every
// other layer, the last one never.
func (s shape) swa(l int) bool { return l%2 == 0 && l != s.Layers-1 }

// recurrent reports whether Qwen 3.5's layer l has linear attention: the
// same pattern as swa.
func (s shape) recurrent(l int) bool { return s.swa(l) }

// globalHeadDim and globalKVHeads are Gemma4's global-attention layers'.
func (s shape) globalHeadDim() int { return 2 * s.headDim }

func (s shape) globalKVHeads() int {
	if s.KVHeads%2 == 0 {
		return s.KVHeads / 2
	}
	return s.KVHeads
}

// ropeDims is the rope.dimension_count: how much of each head RoPE rotates.
func (s shape) ropeDims() int {
	switch s.Arch {
	case Qwen35:
		// A quarter of the head (partial_rotary_factor 0.25), even.
		return max(2, s.headDim/4/2*2)
	case Gemma4:
		return s.globalHeadDim()
	}
	return s.headDim
}

// ropeSections splits Qwen 3.5's rotated pairs in thirds for its
// multi-section RoPE, as Qwen 3.5's [11, 11, 10] splits 32.
func (s shape) ropeSections() []int32 {
	n := int32(s.ropeDims() / 2)
	a := (n + 2) / 3
	b := (n - a + 1) / 2
	return []int32{a, b, n - a - b, 0}
}

// archMetadata adds the architecture's hyperparameters beyond those every
// model has.
func archMetadata(s shape, add func(string, gguf.Value)) {
	key := func(k string) string { return string(s.Arch) + "." + k }
	u32 := func(n int) gguf.Value { return gguf.Uint32(uint32(n)) }
	f32 := gguf.Float32
	headLength := func(n int) {
		add(key("attention.key_length"), u32(n))
		add(key("attention.value_length"), u32(n))
	}
	layers := func(f func(l int) bool) []bool {
		bs := make([]bool, s.Layers)
		for l := range bs {
			bs[l] = f(l)
		}
		return bs
	}
	switch s.Arch {
	case Qwen3:
		headLength(s.headDim)
	case Qwen3MoE:
		headLength(s.headDim)
		add(key("expert_count"), u32(s.Experts))
		add(key("expert_used_count"), u32(s.ExpertsUsed))
		add(key("expert_feed_forward_length"), u32(s.expertFF))
	case Qwen35:
		headLength(s.headDim)
		add(key("rope.dimension_sections"), gguf.Array(s.ropeSections()))
		// Linear attention: K heads as many as the KV heads, V heads as
		// many as the heads, each of the head size.
		add(key("ssm.conv_kernel"), u32(ConvKernel))
		add(key("ssm.state_size"), u32(s.headDim))
		add(key("ssm.group_count"), u32(s.KVHeads))
		add(key("ssm.time_step_rank"), u32(s.Heads))
		add(key("ssm.inner_size"), u32(s.headDim*s.Heads))
		add(key("attention.recurrent_layers"), gguf.Array(layers(s.recurrent)))
	case Gemma3:
		headLength(s.headDim)
		add(key("attention.sliding_window"), u32(SlidingWindow))
		add(key("attention.sliding_window_pattern"), gguf.Array(layers(s.swa)))
		add(key("rope.freq_base_swa"), f32(RopeFreqBase))
	case Gemma4:
		headLength(s.globalHeadDim())
		add(key("attention.key_length_swa"), u32(s.headDim))
		add(key("attention.value_length_swa"), u32(s.headDim))
		add(key("rope.dimension_count_swa"), u32(s.headDim))
		add(key("rope.freq_base_swa"), f32(RopeFreqBase))
		add(key("attention.sliding_window"), u32(SlidingWindow))
		add(key("attention.sliding_window_pattern"), gguf.Array(layers(s.swa)))
		add(key("attention.shared_kv_layers"), u32(0))
		add(key("embedding_length_per_layer_input"), u32(0))
		add(key("final_logit_softcapping"), f32(30))
	case Mistral3:
		add(key("rope.scaling.type"), gguf.String("yarn"))
		add(key("rope.scaling.factor"), f32(yarnFactor))
		add(key("rope.scaling.original_context_length"), u32(ContextLength/yarnFactor))
		add(key("rope.scaling.yarn_beta_fast"), f32(32))
		add(key("rope.scaling.yarn_beta_slow"), f32(1))
		add(key("rope.scaling.yarn_log_multiplier"), f32(1))
		add(key("attention.temperature_scale"), f32(0.1))
	}
}

// headCountKV is the attention.head_count_kv value: per layer for Gemma4.
func (s shape) headCountKV() gguf.Value {
	if s.Arch != Gemma4 {
		return gguf.Uint32(uint32(s.KVHeads))
	}
	kv := make([]uint32, s.Layers)
	for l := range kv {
		kv[l] = uint32(s.kvHeadsOf(l))
	}
	return gguf.Array(kv)
}

func (s shape) kvHeadsOf(l int) int {
	if s.Arch == Gemma4 && !s.swa(l) {
		return s.globalKVHeads()
	}
	return s.KVHeads
}

// stdDev is the standard deviation of a random tensor of the shape.
// Llama's is WeightStdDev, which keeps its models' bytes what they have
// always been, but leaves its layers little weight: its next token
// depends mostly on the last one. The other architectures' matrices have
// 1/√inputs, so that every layer moves the result and greedy decoding
// has clear winners; their vectors (biases) have WeightStdDev, and so has
// a tied token_embd, whose echo of the last token would otherwise
// outweigh the layers.
func (s shape) stdDev(name string, dims []uint64) float64 {
	if s.Arch == Llama || len(dims) < 2 || s.Arch.tied() && name == "token_embd.weight" {
		return WeightStdDev
	}
	return 1 / math.Sqrt(float64(dims[0]))
}

// fills of tensors that are not random weights.
var (
	ones     = func(int) float32 { return 1 }
	minusOne = func(int) float32 { return -1 }
)

// tensors lists the model's tensors in file order. Shapes are in ggml
// order, [columns, rows]: a weight that maps n inputs to m outputs is
// [n, m].
func tensors(s shape) []tensor {
	dim, ff, vocab := uint64(s.Dim), uint64(s.FF), uint64(s.Vocab)
	var ts []tensor
	mk := func(name string, fill func(int) float32, dims ...uint64) {
		ts = append(ts, tensor{Tensor: gguf.Tensor{Name: name, Shape: dims, Type: gguf.TypeF32}, fill: fill, std: s.stdDev(name, dims)})
	}
	mk("token_embd.weight", nil, dim, vocab)
	mk("output_norm.weight", ones, dim)
	if !s.Arch.tied() || s.Text {
		mk("output.weight", nil, dim, vocab)
	}
	if s.Rerank {
		mk("cls.output.weight", nil, dim, uint64(len(RerankLabels)))
	}
	if s.Arch == Gemma4 {
		// Proportional RoPE of the global layers: a quarter of each
		// head's pairs rotate (factor 1), the rest never (1e30), as
		// llama.cpp's converter writes it.
		n := s.globalHeadDim() / 2
		rotated := max(1, n/4)
		mk("rope_freqs.weight", func(i int) float32 {
			if i < rotated {
				return 1
			}
			return 1e30
		}, uint64(n))
	}
	for l := range s.Layers {
		blk := func(name string) string { return fmt.Sprintf("blk.%d.%s", l, name) }
		w := func(name string, dims ...uint64) { mk(blk(name+".weight"), nil, dims...) }
		norm := func(name string, n uint64) { mk(blk(name+".weight"), ones, n) }
		hd, heads, kv := uint64(s.headDim), uint64(s.Heads), uint64(s.kvHeadsOf(l))
		if s.Arch == Gemma4 && !s.swa(l) {
			hd = uint64(s.globalHeadDim())
		}
		q, kvDim := hd*heads, hd*kv

		norm("attn_norm", dim)
		switch {
		case s.Arch == Phi3:
			w("attn_qkv", dim, q+2*kvDim)
		case s.Arch == Qwen35 && s.recurrent(l):
			// Gated delta net: K heads of KV-head count, V heads of
			// head count, each headDim wide.
			keys, values, vHeads := hd*kv, hd*heads, heads
			norm("post_attention_norm", dim)
			w("attn_qkv", dim, 2*keys+values)
			w("attn_gate", dim, values)
			w("ssm_conv1d", ConvKernel, 2*keys+values)
			mk(blk("ssm_dt.bias"), nil, vHeads)
			mk(blk("ssm_a"), minusOne, vHeads) // -exp(A_log): decay
			w("ssm_beta", dim, vHeads)
			w("ssm_alpha", dim, vHeads)
			norm("ssm_norm", hd)
			w("ssm_out", values, dim)
		case s.Arch == Qwen35:
			norm("post_attention_norm", dim)
			w("attn_q", dim, 2*q) // query and its gate
			w("attn_k", dim, kvDim)
			w("attn_v", dim, kvDim)
		default:
			w("attn_q", dim, q)
			w("attn_k", dim, kvDim)
			if s.Arch != Gemma4 || s.swa(l) { // Gemma4's global layers: V = K
				w("attn_v", dim, kvDim)
			}
		}
		if s.Arch == Qwen2 {
			mk(blk("attn_q.bias"), nil, q)
			mk(blk("attn_k.bias"), nil, kvDim)
			mk(blk("attn_v.bias"), nil, kvDim)
		}
		if !(s.Arch == Qwen35 && s.recurrent(l)) {
			w("attn_output", q, dim)
		}
		switch s.Arch {
		case Qwen3, Qwen3MoE, Qwen35, Gemma3, Gemma4:
			if !(s.Arch == Qwen35 && s.recurrent(l)) {
				norm("attn_q_norm", hd)
				norm("attn_k_norm", hd)
			}
		}
		if s.Arch == Gemma3 || s.Arch == Gemma4 {
			norm("post_attention_norm", dim)
		}
		if s.Arch == Gemma4 {
			norm("layer_output_scale", 1)
		}
		if s.Arch != Qwen35 {
			norm("ffn_norm", dim)
		}
		switch s.Arch {
		case Phi3:
			w("ffn_up", dim, 2*ff) // gate and up
			w("ffn_down", ff, dim)
		case Qwen3MoE:
			experts, eff := uint64(s.Experts), uint64(s.expertFF)
			w("ffn_gate_inp", dim, experts)
			w("ffn_gate_exps", dim, eff, experts)
			w("ffn_up_exps", dim, eff, experts)
			w("ffn_down_exps", eff, dim, experts)
		default:
			w("ffn_gate", dim, ff)
			w("ffn_up", dim, ff)
			w("ffn_down", ff, dim)
		}
		if s.Arch == Gemma3 || s.Arch == Gemma4 {
			norm("post_ffw_norm", dim)
		}
	}
	if s.Text {
		tokens, _, _ := vocabulary(s.Vocab, true)
		for i := range ts {
			ts[i].adjust = textAdjust(s, ts[i], tokens)
		}
	}
	return ts
}
