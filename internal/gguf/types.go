package gguf

import (
	"fmt"
	"math/bits"
)

// GGMLType is the storage type of a tensor (ggml's enum ggml_type).
type GGMLType uint32

// Tensor types. The gaps are types ggml removed (Q4_2, Q4_3, the
// Q4_0_4_4 family, the IQ4_NL_4_4 family); files using them are rejected.
const (
	TypeF32     GGMLType = 0
	TypeF16     GGMLType = 1
	TypeQ4_0    GGMLType = 2
	TypeQ4_1    GGMLType = 3
	TypeQ5_0    GGMLType = 6
	TypeQ5_1    GGMLType = 7
	TypeQ8_0    GGMLType = 8
	TypeQ8_1    GGMLType = 9
	TypeQ2_K    GGMLType = 10
	TypeQ3_K    GGMLType = 11
	TypeQ4_K    GGMLType = 12
	TypeQ5_K    GGMLType = 13
	TypeQ6_K    GGMLType = 14
	TypeQ8_K    GGMLType = 15
	TypeIQ2_XXS GGMLType = 16
	TypeIQ2_XS  GGMLType = 17
	TypeIQ3_XXS GGMLType = 18
	TypeIQ1_S   GGMLType = 19
	TypeIQ4_NL  GGMLType = 20
	TypeIQ3_S   GGMLType = 21
	TypeIQ2_S   GGMLType = 22
	TypeIQ4_XS  GGMLType = 23
	TypeI8      GGMLType = 24
	TypeI16     GGMLType = 25
	TypeI32     GGMLType = 26
	TypeI64     GGMLType = 27
	TypeF64     GGMLType = 28
	TypeIQ1_M   GGMLType = 29
	TypeBF16    GGMLType = 30
	TypeTQ1_0   GGMLType = 34
	TypeTQ2_0   GGMLType = 35
	TypeMXFP4   GGMLType = 39
)

// ggmlTypeInfo is the block layout of a tensor type: blockSize elements are
// stored in typeSize bytes.
type ggmlTypeInfo struct {
	name      string
	blockSize uint64
	typeSize  uint64
}

// ggmlTypes lists the layouts of ggml's block structs (ggml-common.h); a
// zero entry is a type ggml does not (or no longer) define.
var ggmlTypes = [...]ggmlTypeInfo{
	TypeF32:     {"F32", 1, 4},
	TypeF16:     {"F16", 1, 2},
	TypeQ4_0:    {"Q4_0", 32, 2 + 16},
	TypeQ4_1:    {"Q4_1", 32, 2 + 2 + 16},
	TypeQ5_0:    {"Q5_0", 32, 2 + 4 + 16},
	TypeQ5_1:    {"Q5_1", 32, 2 + 2 + 4 + 16},
	TypeQ8_0:    {"Q8_0", 32, 2 + 32},
	TypeQ8_1:    {"Q8_1", 32, 2 + 2 + 32},
	TypeQ2_K:    {"Q2_K", 256, 2 + 2 + 16 + 64},
	TypeQ3_K:    {"Q3_K", 256, 2 + 64 + 32 + 12},
	TypeQ4_K:    {"Q4_K", 256, 2 + 2 + 12 + 128},
	TypeQ5_K:    {"Q5_K", 256, 2 + 2 + 12 + 128 + 32},
	TypeQ6_K:    {"Q6_K", 256, 2 + 16 + 192},
	TypeQ8_K:    {"Q8_K", 256, 4 + 256 + 32},
	TypeIQ2_XXS: {"IQ2_XXS", 256, 2 + 64},
	TypeIQ2_XS:  {"IQ2_XS", 256, 2 + 64 + 8},
	TypeIQ3_XXS: {"IQ3_XXS", 256, 2 + 96},
	TypeIQ1_S:   {"IQ1_S", 256, 2 + 32 + 16},
	TypeIQ4_NL:  {"IQ4_NL", 32, 2 + 16},
	TypeIQ3_S:   {"IQ3_S", 256, 2 + 104 + 4},
	TypeIQ2_S:   {"IQ2_S", 256, 2 + 64 + 16},
	TypeIQ4_XS:  {"IQ4_XS", 256, 2 + 2 + 4 + 128},
	TypeI8:      {"I8", 1, 1},
	TypeI16:     {"I16", 1, 2},
	TypeI32:     {"I32", 1, 4},
	TypeI64:     {"I64", 1, 8},
	TypeF64:     {"F64", 1, 8},
	TypeIQ1_M:   {"IQ1_M", 256, 32 + 16 + 8},
	TypeBF16:    {"BF16", 1, 2},
	TypeTQ1_0:   {"TQ1_0", 256, 2 + 4 + 48},
	TypeTQ2_0:   {"TQ2_0", 256, 2 + 64},
	TypeMXFP4:   {"MXFP4", 32, 1 + 16},
}

func (t GGMLType) info() (ggmlTypeInfo, bool) {
	if int(t) < len(ggmlTypes) && ggmlTypes[t].blockSize != 0 {
		return ggmlTypes[t], true
	}
	return ggmlTypeInfo{}, false
}

// Known reports whether t is a tensor type this package can size.
func (t GGMLType) Known() bool {
	_, ok := t.info()
	return ok
}

// BlockSize is the number of elements stored together in one block; 0 for
// unknown types.
func (t GGMLType) BlockSize() uint64 {
	i, _ := t.info()
	return i.blockSize
}

// BlockBytes is the size in bytes of one block; 0 for unknown types.
func (t GGMLType) BlockBytes() uint64 {
	i, _ := t.info()
	return i.typeSize
}

func (t GGMLType) String() string {
	if i, ok := t.info(); ok {
		return i.name
	}
	return fmt.Sprintf("GGMLType(%d)", uint32(t))
}

// tensorLayout checks a tensor's shape against its type and returns its
// element count and size in bytes. It is shared by the reader and the
// writer so that they accept exactly the same tensors, the ones llama.cpp
// accepts: a known type, at most four dimensions, a first dimension that
// is a whole number of blocks, and an element count that fits in an int64.
func tensorLayout(shape []uint64, typ GGMLType) (elems, size uint64, err error) {
	info, ok := typ.info()
	if !ok {
		return 0, 0, fmt.Errorf("unknown ggml type %d", uint32(typ))
	}
	if len(shape) > maxDims {
		return 0, 0, fmt.Errorf("%d dimensions, more than ggml's %d", len(shape), maxDims)
	}
	elems = 1
	for _, d := range shape {
		hi, lo := bits.Mul64(elems, d)
		if hi != 0 || lo > 1<<63-1 {
			return 0, 0, fmt.Errorf("shape %v has more elements than an int64 holds", shape)
		}
		elems = lo
	}
	if len(shape) > 0 && shape[0]%info.blockSize != 0 {
		return 0, 0, fmt.Errorf("type %s stores %d elements a block, and the row length %d is not a multiple of it",
			typ, info.blockSize, shape[0])
	}
	hi, size := bits.Mul64(elems/info.blockSize, info.typeSize)
	if hi != 0 || size > 1<<63-1 {
		return 0, 0, fmt.Errorf("shape %v of type %s needs more bytes than an int64 holds", shape, typ)
	}
	return elems, size, nil
}

// FileType is the dominant tensor type of a model (general.file_type,
// llama.cpp's enum llama_ftype): what people call its quantization.
type FileType uint32

var fileTypeNames = map[FileType]string{
	0:  "F32",
	1:  "F16",
	2:  "Q4_0",
	3:  "Q4_1",
	7:  "Q8_0",
	8:  "Q5_0",
	9:  "Q5_1",
	10: "Q2_K",
	11: "Q3_K_S",
	12: "Q3_K_M",
	13: "Q3_K_L",
	14: "Q4_K_S",
	15: "Q4_K_M",
	16: "Q5_K_S",
	17: "Q5_K_M",
	18: "Q6_K",
	19: "IQ2_XXS",
	20: "IQ2_XS",
	21: "Q2_K_S",
	22: "IQ3_XS",
	23: "IQ3_XXS",
	24: "IQ1_S",
	25: "IQ4_NL",
	26: "IQ3_S",
	27: "IQ3_M",
	28: "IQ2_S",
	29: "IQ2_M",
	30: "IQ4_XS",
	31: "IQ1_M",
	32: "BF16",
	36: "TQ1_0",
	37: "TQ2_0",
	38: "MXFP4_MOE",
}

func (t FileType) String() string {
	if s, ok := fileTypeNames[t]; ok {
		return s
	}
	return fmt.Sprintf("FileType(%d)", uint32(t))
}
