package gguf_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/apiary-llm/apiary/internal/gguf"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// valueCmp compares metadata values by type and content.
var valueCmp = cmp.Comparer(func(a, b gguf.Value) bool {
	return a.Type() == b.Type() && a.ElemType() == b.ElemType() && cmp.Equal(a.Interface(), b.Interface())
})

// sampleMetadata has one value of every type, scalar and array.
func sampleMetadata() gguf.Metadata {
	return gguf.Metadata{
		{"general.architecture", gguf.String("llama")},
		{"u8", gguf.Uint8(200)},
		{"i8", gguf.Int8(-100)},
		{"u16", gguf.Uint16(60000)},
		{"i16", gguf.Int16(-30000)},
		{"u32", gguf.Uint32(4_000_000_000)},
		{"i32", gguf.Int32(-2_000_000_000)},
		{"f32", gguf.Float32(1.5)},
		{"bool", gguf.Bool(true)},
		{"string", gguf.String("héllo ▁ world")},
		{"u64", gguf.Uint64(math.MaxUint64)},
		{"i64", gguf.Int64(math.MinInt64)},
		{"f64", gguf.Float64(-2.25)},
		{"empty string", gguf.String("")},
		{"a.u8", gguf.Array([]uint8{1, 2, 3})},
		{"a.i8", gguf.Array([]int8{-1, 0, 1})},
		{"a.u16", gguf.Array([]uint16{1, 65535})},
		{"a.i16", gguf.Array([]int16{-32768, 32767})},
		{"a.u32", gguf.Array([]uint32{7})},
		{"a.i32", gguf.Array([]int32{-7, 7})},
		{"a.f32", gguf.Array([]float32{0.5, -0.25})},
		{"a.bool", gguf.Array([]bool{true, false, true})},
		{"a.string", gguf.Array([]string{"<unk>", "", "▁the"})},
		{"a.u64", gguf.Array([]uint64{1 << 40})},
		{"a.i64", gguf.Array([]int64{-1 << 40})},
		{"a.f64", gguf.Array([]float64{math.Pi})},
		{"a.empty", gguf.Array([]float32{})},
	}
}

// sampleTensors has tensors of several types, with patterned data.
func sampleTensors() []gguf.Tensor {
	mk := func(name string, typ gguf.GGMLType, shape ...uint64) gguf.Tensor {
		n := uint64(1)
		for _, d := range shape {
			n *= d
		}
		data := make([]byte, n/typ.BlockSize()*typ.BlockBytes())
		for i := range data {
			data[i] = byte(i*7 + len(name))
		}
		return gguf.Tensor{Name: name, Shape: shape, Type: typ, Data: data}
	}
	return []gguf.Tensor{
		mk("token_embd.weight", gguf.TypeF32, 8, 3),
		mk("scalar", gguf.TypeF32),
		mk("f16", gguf.TypeF16, 5),
		mk("q4_0", gguf.TypeQ4_0, 64, 2),
		mk("q8_0", gguf.TypeQ8_0, 32, 1, 3),
		mk("q4_k", gguf.TypeQ4_K, 256, 2),
		mk("iq4_xs", gguf.TypeIQ4_XS, 512),
		mk("bf16", gguf.TypeBF16, 3, 1, 1, 2),
		mk("empty", gguf.TypeF32, 0, 4),
	}
}

func writeFile(t *testing.T, md gguf.Metadata, tensors []gguf.Tensor) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := gguf.Write(&buf, md, tensors); err != nil {
		t.Fatalf("Write: %v", err)
	}
	return buf.Bytes()
}

func read(t *testing.T, b []byte) *gguf.File {
	t.Helper()
	f, err := gguf.Read(bytes.NewReader(b), int64(len(b)))
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	return f
}

func TestRoundTrip(t *testing.T) {
	tests := []struct {
		name      string
		md        gguf.Metadata
		alignment uint64
	}{
		{"default alignment", sampleMetadata(), 32},
		{"alignment 64", append(sampleMetadata(), gguf.KV{Key: gguf.KeyAlignment, Value: gguf.Uint32(64)}), 64},
		{"alignment 1", gguf.Metadata{{gguf.KeyAlignment, gguf.Uint32(1)}}, 1},
		{"no metadata", nil, 32},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tensors := sampleTensors()
			b := writeFile(t, tt.md, tensors)
			f := read(t, b)

			if f.Version != 3 || f.Alignment != tt.alignment || f.Size != int64(len(b)) {
				t.Errorf("version %d, alignment %d, size %d; want 3, %d, %d", f.Version, f.Alignment, f.Size, tt.alignment, len(b))
			}
			if f.DataOffset%int64(tt.alignment) != 0 {
				t.Errorf("data offset %d is not aligned to %d", f.DataOffset, tt.alignment)
			}
			if diff := cmp.Diff(tt.md, f.Metadata, valueCmp, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("metadata (-written +read):\n%s", diff)
			}
			if len(f.Tensors) != len(tensors) {
				t.Fatalf("read %d tensors, wrote %d", len(f.Tensors), len(tensors))
			}
			for i, want := range tensors {
				got := f.Tensors[i]
				if diff := cmp.Diff(want.Shape, got.Shape, cmpopts.EquateEmpty()); diff != "" || got.Name != want.Name || got.Type != want.Type {
					t.Errorf("tensor %d: got %q %s %v, want %q %s %v", i, got.Name, got.Type, got.Shape, want.Name, want.Type, want.Shape)
				}
				if got.Offset%tt.alignment != 0 {
					t.Errorf("tensor %q offset %d is not aligned to %d", got.Name, got.Offset, tt.alignment)
				}
				data, err := io.ReadAll(f.TensorData(bytes.NewReader(b), got))
				if err != nil {
					t.Fatalf("reading tensor %q: %v", got.Name, err)
				}
				if !bytes.Equal(data, want.Data) {
					t.Errorf("tensor %q: data differs after the round trip", got.Name)
				}
			}
			// Writing what was read gives the same bytes.
			again := make([]gguf.Tensor, len(f.Tensors))
			for i, ti := range f.Tensors {
				again[i] = gguf.Tensor{Name: ti.Name, Shape: ti.Shape, Type: ti.Type, Data: tensors[i].Data}
			}
			if b2 := writeFile(t, f.Metadata, again); !bytes.Equal(b, b2) {
				t.Errorf("rewriting the file changed its bytes")
			}
		})
	}
}

// TestWriteLayout pins the bytes the writer produces against the format
// spelled out by hand, so that the writer and the reader cannot agree on a
// mistake.
func TestWriteLayout(t *testing.T) {
	got := writeFile(t,
		gguf.Metadata{{"general.architecture", gguf.String("x")}, {"a", gguf.Array([]uint16{1, 2})}},
		[]gguf.Tensor{
			{Name: "w", Shape: []uint64{2}, Type: gguf.TypeF32, Data: []byte{1, 2, 3, 4, 5, 6, 7, 8}},
			{Name: "v", Shape: []uint64{1, 1}, Type: gguf.TypeF16, Data: []byte{9, 10}},
		})

	var r raw
	r.bytes("GGUF").u32(3).u64(2).u64(2)
	r.str("general.architecture").u32(8).str("x")
	r.str("a").u32(9).u32(2).u64(2).u16(1).u16(2)
	r.str("w").u32(1).u64(2).u32(0).u64(0)
	r.str("v").u32(2).u64(1).u64(1).u32(1).u64(32)
	r.zeros(32 - len(r.b)%32)
	r.bytes("\x01\x02\x03\x04\x05\x06\x07\x08").zeros(24)
	r.bytes("\x09\x0a").zeros(30)

	if diff := cmp.Diff(r.b, got); diff != "" {
		t.Errorf("bytes (-want +got):\n%s", diff)
	}
}

func TestReadVersion2(t *testing.T) {
	b := writeFile(t, sampleMetadata(), sampleTensors())
	b[4] = 2 // v2 has the v3 layout in little-endian files
	if f := read(t, b); f.Version != 2 {
		t.Errorf("version %d, want 2", f.Version)
	}
}

func TestOpen(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.gguf")
	if err := os.WriteFile(good, writeFile(t, sampleMetadata(), sampleTensors()), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Open(good)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	if got := f.Architecture(); got != "llama" {
		t.Errorf("architecture %q, want llama", got)
	}

	zip := filepath.Join(dir, "model.gguf")
	if err := os.WriteFile(zip, []byte("PK\x03\x04 and then a zip file"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = gguf.Open(zip)
	if !errors.Is(err, gguf.ErrNotGGUF) {
		t.Errorf("Open(zip) = %v, want ErrNotGGUF", err)
	}
	if want := zip + `: not a GGUF file (magic "PK\x03\x04")`; err == nil || err.Error() != want {
		t.Errorf("Open(zip) error:\n got %v\nwant %s", err, want)
	}

	if _, err := gguf.Open(filepath.Join(dir, "missing.gguf")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Open(missing) = %v, want ErrNotExist", err)
	}
	if _, err := gguf.Open(dir); !errors.Is(err, gguf.ErrNotGGUF) || !strings.HasPrefix(err.Error(), dir+": ") {
		t.Errorf("Open(dir) = %v, want ErrNotGGUF naming the directory", err)
	}
}

func TestTensorLookup(t *testing.T) {
	f := read(t, writeFile(t, nil, sampleTensors()))
	ti, ok := f.Tensor("q4_k")
	if !ok {
		t.Fatal("tensor q4_k not found")
	}
	if want := uint64(2 * 144); ti.Size != want || ti.Elements != 512 {
		t.Errorf("q4_k: size %d, elements %d; want %d, 512", ti.Size, ti.Elements, want)
	}
	if _, ok := f.Tensor("nope"); ok {
		t.Error("found a tensor that does not exist")
	}
}

func TestGGMLTypeSizes(t *testing.T) {
	// Bytes per block and elements per block, from ggml-common.h.
	tests := []struct {
		typ          gguf.GGMLType
		name         string
		block, bytes uint64
	}{
		{gguf.TypeF32, "F32", 1, 4},
		{gguf.TypeF16, "F16", 1, 2},
		{gguf.TypeBF16, "BF16", 1, 2},
		{gguf.TypeQ4_0, "Q4_0", 32, 18},
		{gguf.TypeQ4_1, "Q4_1", 32, 20},
		{gguf.TypeQ5_0, "Q5_0", 32, 22},
		{gguf.TypeQ5_1, "Q5_1", 32, 24},
		{gguf.TypeQ8_0, "Q8_0", 32, 34},
		{gguf.TypeQ8_1, "Q8_1", 32, 36},
		{gguf.TypeQ2_K, "Q2_K", 256, 84},
		{gguf.TypeQ3_K, "Q3_K", 256, 110},
		{gguf.TypeQ4_K, "Q4_K", 256, 144},
		{gguf.TypeQ5_K, "Q5_K", 256, 176},
		{gguf.TypeQ6_K, "Q6_K", 256, 210},
		{gguf.TypeQ8_K, "Q8_K", 256, 292},
		{gguf.TypeIQ2_XXS, "IQ2_XXS", 256, 66},
		{gguf.TypeIQ2_XS, "IQ2_XS", 256, 74},
		{gguf.TypeIQ2_S, "IQ2_S", 256, 82},
		{gguf.TypeIQ3_XXS, "IQ3_XXS", 256, 98},
		{gguf.TypeIQ3_S, "IQ3_S", 256, 110},
		{gguf.TypeIQ1_S, "IQ1_S", 256, 50},
		{gguf.TypeIQ1_M, "IQ1_M", 256, 56},
		{gguf.TypeIQ4_NL, "IQ4_NL", 32, 18},
		{gguf.TypeIQ4_XS, "IQ4_XS", 256, 136},
		{gguf.TypeTQ1_0, "TQ1_0", 256, 54},
		{gguf.TypeTQ2_0, "TQ2_0", 256, 66},
		{gguf.TypeMXFP4, "MXFP4", 32, 17},
		{gguf.TypeI8, "I8", 1, 1},
		{gguf.TypeI16, "I16", 1, 2},
		{gguf.TypeI32, "I32", 1, 4},
		{gguf.TypeI64, "I64", 1, 8},
		{gguf.TypeF64, "F64", 1, 8},
	}
	for _, tt := range tests {
		if got := tt.typ.String(); got != tt.name || tt.typ.BlockSize() != tt.block || tt.typ.BlockBytes() != tt.bytes {
			t.Errorf("type %d: %s %d/%d, want %s %d/%d", tt.typ, got, tt.typ.BlockSize(), tt.typ.BlockBytes(), tt.name, tt.block, tt.bytes)
		}
	}
	for _, removed := range []gguf.GGMLType{4, 5, 31, 32, 33, 36, 37, 38, 40} {
		if removed.Known() {
			t.Errorf("type %d is known, but ggml removed or never defined it", removed)
		}
	}
}

// raw builds GGUF bytes by hand, for files the writer refuses to produce.
type raw struct{ b []byte }

func (r *raw) bytes(s string) *raw { r.b = append(r.b, s...); return r }
func (r *raw) zeros(n int) *raw    { r.b = append(r.b, make([]byte, n)...); return r }
func (r *raw) u8(v uint8) *raw     { r.b = append(r.b, v); return r }
func (r *raw) u16(v uint16) *raw   { r.b = binary.LittleEndian.AppendUint16(r.b, v); return r }
func (r *raw) u32(v uint32) *raw   { r.b = binary.LittleEndian.AppendUint32(r.b, v); return r }
func (r *raw) u64(v uint64) *raw   { r.b = binary.LittleEndian.AppendUint64(r.b, v); return r }
func (r *raw) str(s string) *raw   { return r.u64(uint64(len(s))).bytes(s) }
