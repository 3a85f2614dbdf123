package gguf_test

import (
	"math"
	"testing"

	"github.com/apiary-llm/apiary/internal/gguf"
	"github.com/google/go-cmp/cmp"
)

func llamaMetadata() gguf.Metadata {
	return gguf.Metadata{
		{"general.architecture", gguf.String("llama")},
		{"general.name", gguf.String("tiny")},
		{"general.file_type", gguf.Uint32(15)},
		{"llama.context_length", gguf.Uint32(8192)},
		{"llama.block_count", gguf.Uint32(32)},
		{"llama.embedding_length", gguf.Uint32(4096)},
		{"llama.feed_forward_length", gguf.Uint32(14336)},
		{"llama.attention.head_count", gguf.Uint32(32)},
		{"llama.attention.head_count_kv", gguf.Uint32(8)},
		{"tokenizer.ggml.tokens", gguf.Array(make([]string, 128256))},
		{"tokenizer.chat_template", gguf.String("{{ messages }}")},
	}
}

func TestInfo(t *testing.T) {
	f := read(t, writeFile(t, llamaMetadata(), []gguf.Tensor{
		{Name: "a", Shape: []uint64{32, 2}, Type: gguf.TypeQ8_0, Data: make([]byte, 68)},
		{Name: "b", Shape: []uint64{3}, Type: gguf.TypeF32, Data: make([]byte, 12)},
	}))
	want := gguf.Info{
		Architecture:      "llama",
		Name:              "tiny",
		FileType:          15,
		ContextLength:     8192,
		BlockCount:        32,
		EmbeddingLength:   4096,
		FeedForwardLength: 14336,
		HeadCount:         32,
		HeadCountKV:       8,
		KeyLength:         128,
		ValueLength:       128,
		VocabSize:         128256,
		ChatTemplate:      "{{ messages }}",
		ParameterCount:    67,
		WeightsBytes:      80,
	}
	if diff := cmp.Diff(want, f.Info()); diff != "" {
		t.Errorf("Info (-want +got):\n%s", diff)
	}
	if got := f.Info().FileType.String(); got != "Q4_K_M" {
		t.Errorf("file type %q, want Q4_K_M", got)
	}
}

func TestInfoDefaultsAndArrays(t *testing.T) {
	f := read(t, writeFile(t, gguf.Metadata{
		{"general.architecture", gguf.String("openelm")},
		{"openelm.embedding_length", gguf.Uint32(1280)},
		{"openelm.attention.head_count", gguf.Array([]uint32{12, 16, 20})},
		{"openelm.feed_forward_length", gguf.Array([]int32{768, 2560})},
		{"openelm.attention.key_length", gguf.Uint32(64)},
		{"openelm.vocab_size", gguf.Uint64(32000)},
	}, nil))
	i := f.Info()
	got := []uint64{i.HeadCount, i.HeadCountKV, i.FeedForwardLength, i.KeyLength, i.ValueLength, i.VocabSize}
	want := []uint64{20, 20, 2560, 64, 64, 32000} // value length defaults to 1280/20
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("heads, heads_kv, ff, key, value, vocab (-want +got):\n%s", diff)
	}
}

func TestEstimateMemory(t *testing.T) {
	info := gguf.Info{
		ContextLength: 8192, BlockCount: 32, EmbeddingLength: 4096, FeedForwardLength: 14336,
		HeadCount: 32, HeadCountKV: 8, KeyLength: 128, ValueLength: 128, VocabSize: 128256,
		WeightsBytes: 4_900_000_000,
	}
	tests := []struct {
		name string
		info gguf.Info
		ctx  int
		want gguf.Memory
	}{
		{
			// KV: 2 × 32 layers × 4096 ctx × (128 × 8) × 2 bytes = 512 MiB.
			// Compute: 4 × 512 × (128256 + 4×4096 + 2×14336 + 32×4096) + 32 MiB.
			name: "llama 3 8B at 4096", info: info, ctx: 4096,
			want: gguf.Memory{
				Context: 4096, Weights: 4_900_000_000, KVCache: 512 << 20,
				Compute: 4*512*(128256+4*4096+2*14336+32*4096) + 32<<20,
			},
		},
		{
			name: "no context means the trained one, capped", info: info, ctx: 0,
			want: gguf.Memory{
				Context: 4096, Weights: 4_900_000_000, KVCache: 512 << 20,
				Compute: 4*512*(128256+4*4096+2*14336+32*4096) + 32<<20,
			},
		},
		{
			name: "short trained context", info: gguf.Info{ContextLength: 2048, BlockCount: 2, HeadCount: 4, HeadCountKV: 4, KeyLength: 16, ValueLength: 16, VocabSize: 100},
			ctx: -1,
			want: gguf.Memory{
				Context: 2048, KVCache: 2 * 2048 * 2 * 4 * 32, Compute: 4*512*(100+4*2048) + 32<<20,
			},
		},
		{
			name: "absurd hyperparameters saturate", info: gguf.Info{BlockCount: math.MaxUint64, HeadCountKV: 2, KeyLength: 1, ValueLength: 1, HeadCount: 1 << 62},
			ctx:  10,
			want: gguf.Memory{Context: 10, KVCache: math.MaxUint64, Compute: math.MaxUint64, Total: math.MaxUint64},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.want.Total == 0 {
				tt.want.Total = tt.want.Weights + tt.want.KVCache + tt.want.Compute
			}
			if diff := cmp.Diff(tt.want, tt.info.EstimateMemory(tt.ctx)); diff != "" {
				t.Errorf("EstimateMemory(%d) (-want +got):\n%s", tt.ctx, diff)
			}
		})
	}
}

func TestValueAccessors(t *testing.T) {
	type result struct {
		U       uint64
		UOK     bool
		I       int64
		IOK     bool
		F       float64
		FOK     bool
		S       string
		SOK     bool
		Len     int
		Display string
	}
	get := func(v gguf.Value) result {
		var r result
		r.U, r.UOK = v.AsUint()
		r.I, r.IOK = v.AsInt()
		r.F, r.FOK = v.AsFloat()
		r.S, r.SOK = v.AsString()
		r.Len = v.Len()
		r.Display = v.String()
		return r
	}
	tests := []struct {
		v    gguf.Value
		want result
	}{
		{gguf.Uint32(7), result{U: 7, UOK: true, I: 7, IOK: true, Display: "7"}},
		{gguf.Int8(-3), result{I: -3, IOK: true, Display: "-3"}},
		{gguf.Int64(5), result{U: 5, UOK: true, I: 5, IOK: true, Display: "5"}},
		{gguf.Uint64(math.MaxUint64), result{U: math.MaxUint64, UOK: true, Display: "18446744073709551615"}},
		{gguf.Float32(0.5), result{F: 0.5, FOK: true, Display: "0.5"}},
		{gguf.String("hi"), result{S: "hi", SOK: true, Display: `"hi"`}},
		{gguf.Bool(true), result{Display: "true"}},
		{gguf.Array([]string{"a", "b"}), result{Len: 2, Display: "[2]string"}},
		{gguf.Value{}, result{Display: "<invalid>"}},
	}
	for _, tt := range tests {
		if diff := cmp.Diff(tt.want, get(tt.v)); diff != "" {
			t.Errorf("%s %s (-want +got):\n%s", tt.v.Type(), tt.v, diff)
		}
	}

	us, ok := gguf.Array([]int16{1, 2}).AsUints()
	if diff := cmp.Diff([]uint64{1, 2}, us); !ok || diff != "" {
		t.Errorf("AsUints = %v, %v", us, ok)
	}
	if _, ok := gguf.Array([]int16{1, -2}).AsUints(); ok {
		t.Error("AsUints accepted a negative element")
	}
	if got := gguf.Array([]float32{1, 2}).Index(1); got.Type() != gguf.TypeFloat32 || got.Interface() != float32(2) {
		t.Errorf("Index(1) = %s %v", got.Type(), got)
	}
}

// Info names the pooling {arch}.pooling_type names as llama.cpp does;
// none when the key is absent.
func TestInfoPooling(t *testing.T) {
	for _, tt := range []struct {
		pooling gguf.Value
		want    string
	}{{gguf.Uint32(4), "rank"}, {gguf.Int32(1), "mean"}, {gguf.Uint32(9), "pooling 9"}} {
		f := read(t, writeFile(t, append(llamaMetadata(), gguf.KV{Key: "llama.pooling_type", Value: tt.pooling}), nil))
		if got := f.Info().Pooling; got != tt.want {
			t.Errorf("pooling_type %v: Pooling %q, want %q", tt.pooling, got, tt.want)
		}
	}
	if got := read(t, writeFile(t, llamaMetadata(), nil)).Info().Pooling; got != "" {
		t.Errorf("no pooling_type: Pooling %q, want none", got)
	}
}
