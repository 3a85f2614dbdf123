package gguf_test

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/apiary-llm/apiary/internal/gguf"
)

// header starts a GGUF v3 file with the given counts.
func header(tensors, kvs uint64) *raw {
	r := &raw{}
	return r.bytes("GGUF").u32(3).u64(tensors).u64(kvs)
}

// withData pads r to 32 bytes and adds n bytes of tensor data.
func withData(r *raw, n int) []byte {
	if rem := len(r.b) % 32; rem != 0 {
		r.zeros(32 - rem)
	}
	return r.zeros(n).b
}

func TestReadErrors(t *testing.T) {
	big := uint64(1_000_000_000_000_000_000)
	tests := []struct {
		name string
		file []byte
		want error
		msg  string // the error text must contain it
	}{
		{"empty", nil, gguf.ErrNotGGUF, "not a GGUF file (empty)"},
		{"zip", []byte("PK\x03\x04rest"), gguf.ErrNotGGUF, `not a GGUF file (magic "PK\x03\x04")`},
		{"short", []byte("GG"), gguf.ErrNotGGUF, `not a GGUF file (magic "GG")`},
		{"text", []byte("hello world"), gguf.ErrNotGGUF, `(magic "hell")`},
		{"version 1", (&raw{}).bytes("GGUF").u32(1).u32(0).u32(0).b, gguf.ErrVersion, "GGUF version 1 is not supported"},
		{"version 4", (&raw{}).bytes("GGUF").u32(4).u64(0).u64(0).b, gguf.ErrVersion, "GGUF version 4 is not supported (versions 2 and 3 are)"},
		{"version 0", (&raw{}).bytes("GGUF").u32(0).u64(0).u64(0).b, gguf.ErrVersion, "GGUF version 0"},
		{"big-endian", (&raw{}).bytes("GGUF").u32(3 << 24).u64(0).u64(0).b, gguf.ErrVersion, "big-endian GGUF file (version 3)"},
		{"truncated header", (&raw{}).bytes("GGUF").u32(3).u32(0).b, gguf.ErrTruncated, "truncated in header"},
		{"tensor count", header(big, 0).b, gguf.ErrInvalid, "tensor count 1000000000000000000 exceeds the 8 bytes left"},
		{"metadata count", header(0, 1<<62).b, gguf.ErrInvalid, "metadata count 4611686018427387904 exceeds"},
		{"counts together", header(1, 2).zeros(30).b, gguf.ErrInvalid, "1 tensors and 2 metadata entries need more than the 30 bytes left"},
		{"key length", header(0, 1).u64(big).zeros(20).b, gguf.ErrInvalid,
			"metadata entry 0: string length 1000000000000000000 exceeds the 20 bytes left in the file"},
		{"string value length", header(0, 1).str("k").u32(8).u64(big).zeros(8).b, gguf.ErrInvalid,
			`metadata entry 0 ("k"): string length 1000000000000000000 exceeds the 8 bytes left`},
		{"array length", header(0, 1).str("k").u32(9).u32(6).u64(1 << 61).zeros(16).b, gguf.ErrInvalid,
			`metadata entry 0 ("k"): array length (of float32) 2305843009213693952 exceeds the 16 bytes left`},
		{"string array length", header(0, 1).str("k").u32(9).u32(8).u64(3).str("a").str("b").b, gguf.ErrInvalid,
			"array length (of string) 3 exceeds the 18 bytes left"},
		{"unknown value type", header(0, 1).str("k").u32(13).zeros(8).b, gguf.ErrInvalid, `metadata entry 0 ("k"): unknown value type 13`},
		{"unknown element type", header(0, 1).str("k").u32(9).u32(99).u64(0).b, gguf.ErrInvalid, "unknown array element type 99"},
		{"nested array", header(0, 1).str("k").u32(9).u32(9).u64(0).b, gguf.ErrInvalid, "arrays of arrays are not supported"},
		{"duplicate key", header(0, 2).str("k").u32(0).u8(1).str("k").u32(0).u8(2).b, gguf.ErrInvalid,
			`metadata entries 0 and 1 have the same key "k"`},
		{"truncated value", header(0, 2).str("k").u32(0).u8(1).str("j").u32(10).u32(0).b, gguf.ErrTruncated,
			`truncated in metadata entry 1 ("j")`},
		{"alignment type", header(0, 1).str("general.alignment").u32(10).u64(32).b, gguf.ErrInvalid,
			"general.alignment is a uint64, want uint32"},
		{"alignment value", header(0, 1).str("general.alignment").u32(4).u32(48).b, gguf.ErrInvalid,
			"general.alignment is 48, not a power of two"},
		{"alignment zero", header(0, 1).str("general.alignment").u32(4).u32(0).b, gguf.ErrInvalid,
			"general.alignment is 0, not a power of two"},
		{"missing padding", header(0, 1).str("general.alignment").u32(4).u32(1 << 31).b, gguf.ErrTruncated,
			"truncated in the padding before the tensor data, which starts at byte 2147483648 (file ends at byte 57)"},
		{"too many dims", header(1, 0).str("t").u32(5).zeros(60).b, gguf.ErrInvalid,
			`tensor info 0 ("t"): 5 dimensions, more than ggml's 4`},
		{"unknown ggml type", header(1, 0).str("t").u32(1).u64(4).u32(31).u64(0).b, gguf.ErrInvalid,
			`tensor info 0 ("t"): unknown ggml type 31`},
		{"partial block", header(1, 0).str("t").u32(1).u64(48).u32(uint32(gguf.TypeQ4_0)).u64(0).b, gguf.ErrInvalid,
			"type Q4_0 stores 32 elements a block, and the row length 48 is not a multiple of it"},
		{"element overflow", header(1, 0).str("t").u32(2).u64(1 << 32).u64(1 << 32).u32(0).u64(0).b, gguf.ErrInvalid,
			"more elements than an int64 holds"},
		{"byte overflow", header(1, 0).str("t").u32(1).u64(1 << 62).u32(0).u64(0).b, gguf.ErrInvalid,
			"needs more bytes than an int64 holds"},
		{"long name", header(1, 0).str(strings.Repeat("n", 64)).u32(0).u32(0).u64(0).b, gguf.ErrInvalid,
			"tensor info 0: name is 64 bytes, longer than ggml's limit of 63"},
		{"duplicate tensor", withData(header(2, 0).str("t").u32(0).u32(0).u64(0).str("t").u32(0).u32(0).u64(32), 64), gguf.ErrInvalid,
			`tensor infos 0 and 1 have the same name "t"`},
		{"truncated tensor info", header(2, 0).str("a").u32(1).u64(1).u32(0).u64(0).str("b").u32(1).u64(1).b, gguf.ErrTruncated,
			`truncated in tensor info 1 ("b")`},
		{"misplaced tensor", withData(header(2, 0).str("a").u32(0).u32(0).u64(0).str("b").u32(0).u32(0).u64(4), 64), gguf.ErrInvalid,
			`tensor 1 ("b") has data offset 4, want 32`},
		{"truncated data", withData(header(1, 0).str("a").u32(1).u64(16).u32(0).u64(0), 63), gguf.ErrTruncated,
			`truncated in the data of tensor 0 ("a"): it ends at byte 128, the file at byte 127`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := gguf.Read(bytes.NewReader(tt.file), int64(len(tt.file)))
			if err == nil {
				t.Fatalf("Read succeeded (%d tensors, %d keys), want an error", len(f.Tensors), len(f.Metadata))
			}
			if !errors.Is(err, tt.want) {
				t.Errorf("error %q does not wrap %q", err, tt.want)
			}
			if !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("error %q does not say %q", err, tt.msg)
			}
			if _, ok := errors.AsType[*gguf.Error](err); !ok {
				t.Errorf("error %q is a %T, not a *gguf.Error", err, err)
			}
		})
	}
}

// TestReadTruncatedEverywhere cuts a valid file at every length: each cut
// is an error of the package's kinds, never a panic or a success.
func TestReadTruncatedEverywhere(t *testing.T) {
	b := writeFile(t, sampleMetadata(), sampleTensors())
	for n := range len(b) {
		_, err := gguf.Read(bytes.NewReader(b[:n]), int64(n))
		if !errors.Is(err, gguf.ErrTruncated) && !errors.Is(err, gguf.ErrInvalid) && !errors.Is(err, gguf.ErrNotGGUF) {
			t.Fatalf("cut at %d of %d bytes: error %v, want ErrTruncated, ErrInvalid or ErrNotGGUF", n, len(b), err)
		}
	}
}

// failingReader fails every read past its first n bytes.
type failingReader struct {
	b []byte
	n int64
}

var errDisk = errors.New("disk on fire")

func (r failingReader) ReadAt(p []byte, off int64) (int, error) {
	if off+int64(len(p)) > r.n {
		return 0, errDisk
	}
	return copy(p, r.b[off:]), nil
}

func TestReadIOError(t *testing.T) {
	b := writeFile(t, sampleMetadata(), sampleTensors())
	_, err := gguf.Read(failingReader{b: b, n: 100}, int64(len(b)))
	if !errors.Is(err, errDisk) {
		t.Fatalf("Read = %v, want the reader's error", err)
	}
	if errors.Is(err, gguf.ErrTruncated) {
		t.Errorf("an I/O error reads as a truncation: %v", err)
	}
}

func TestWriteErrors(t *testing.T) {
	f32 := func(name string, shape []uint64, n int) gguf.Tensor {
		return gguf.Tensor{Name: name, Shape: shape, Type: gguf.TypeF32, Data: make([]byte, n)}
	}
	tests := []struct {
		name    string
		md      gguf.Metadata
		tensors []gguf.Tensor
		msg     string
	}{
		{"duplicate key", gguf.Metadata{{"k", gguf.Bool(true)}, {"k", gguf.Bool(false)}}, nil, `metadata key "k" appears twice`},
		{"zero value", gguf.Metadata{{"k", gguf.Value{}}}, nil, `metadata entry 0 ("k") has no value`},
		{"alignment type", gguf.Metadata{{gguf.KeyAlignment, gguf.Uint64(32)}}, nil, "general.alignment is a uint64, want uint32"},
		{"alignment value", gguf.Metadata{{gguf.KeyAlignment, gguf.Uint32(3)}}, nil, "general.alignment is 3, not a power of two"},
		{"data size", nil, []gguf.Tensor{f32("t", []uint64{4}, 15)}, `tensor 0 ("t"): 15 bytes of data, shape [4] of type F32 needs 16`},
		{"duplicate tensor", nil, []gguf.Tensor{f32("t", nil, 4), f32("t", nil, 4)}, `tensor name "t" appears twice`},
		{"long name", nil, []gguf.Tensor{f32(strings.Repeat("x", 64), nil, 4)}, "longer than ggml's limit of 63 bytes"},
		{"dims", nil, []gguf.Tensor{f32("t", []uint64{1, 1, 1, 1, 1}, 4)}, "5 dimensions, more than ggml's 4"},
		{"type", nil, []gguf.Tensor{{Name: "t", Type: 4}}, "unknown ggml type 4"},
		{"block", nil, []gguf.Tensor{{Name: "t", Shape: []uint64{16}, Type: gguf.TypeQ8_0}}, "row length 16 is not a multiple"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			err := gguf.Write(&buf, tt.md, tt.tensors)
			if !errors.Is(err, gguf.ErrInvalid) || !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("Write = %v, want ErrInvalid saying %q", err, tt.msg)
			}
			if buf.Len() != 0 {
				t.Errorf("Write wrote %d bytes before failing", buf.Len())
			}
		})
	}
}

type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, errDisk }

func TestWriteIOError(t *testing.T) {
	if err := gguf.Write(failingWriter{}, sampleMetadata(), sampleTensors()); !errors.Is(err, errDisk) {
		t.Errorf("Write = %v, want the writer's error", err)
	}
}

func TestWriterSequence(t *testing.T) {
	layouts := []gguf.Tensor{
		{Name: "a", Shape: []uint64{2}, Type: gguf.TypeF32},
		{Name: "b", Shape: []uint64{1}, Type: gguf.TypeF16},
	}
	var buf bytes.Buffer
	w, err := gguf.NewWriter(&buf, nil, layouts)
	if err != nil {
		t.Fatalf("NewWriter: %v", err)
	}
	if err := w.WriteTensor(make([]byte, 4)); !errors.Is(err, gguf.ErrInvalid) {
		t.Errorf("WriteTensor with 4 of 8 bytes = %v, want ErrInvalid", err)
	}
	if err := w.WriteTensor(make([]byte, 8)); err != nil {
		t.Fatalf("WriteTensor(a): %v", err)
	}
	if err := w.Close(); !errors.Is(err, gguf.ErrInvalid) || !strings.Contains(err.Error(), "1 of 2 tensors written") {
		t.Errorf("Close after 1 of 2 tensors = %v, want ErrInvalid", err)
	}
	if err := w.WriteTensor([]byte{1, 2}); err != nil {
		t.Fatalf("WriteTensor(b): %v", err)
	}
	if err := w.WriteTensor([]byte{1, 2}); !errors.Is(err, gguf.ErrInvalid) {
		t.Errorf("WriteTensor past the last tensor = %v, want ErrInvalid", err)
	}
	if err := w.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	f := read(t, buf.Bytes())
	if len(f.Tensors) != 2 || f.Tensors[1].Offset != 32 {
		t.Errorf("read back %+v", f.Tensors)
	}
}

// sparseFile is a large virtual file: head, then zeros up to size.
type sparseFile struct {
	head []byte
	size int64
}

func (s sparseFile) ReadAt(p []byte, off int64) (int, error) {
	if off >= s.size {
		return 0, io.EOF
	}
	n := int(min(int64(len(p)), s.size-off))
	clear(p[:n])
	if off < int64(len(s.head)) {
		copy(p[:n], s.head[off:])
	}
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// TestReadLargeFile reads the header of a 64 GiB file without touching its
// tensor data, and refuses a header length that fits in such a file but
// not in MaxHeaderSize.
func TestReadLargeFile(t *testing.T) {
	const tensorBytes = 64 << 30
	head := withData(header(1, 0).str("t").u32(2).u64(1<<20).u64(1<<14).u32(uint32(gguf.TypeF32)).u64(0), 0)
	f, err := gguf.Read(sparseFile{head: head, size: int64(len(head)) + tensorBytes}, int64(len(head))+tensorBytes)
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	if got := f.Info().WeightsBytes; got != tensorBytes {
		t.Errorf("weights %d bytes, want %d", got, tensorBytes)
	}

	lying := header(0, 1).u64(gguf.MaxHeaderSize).b
	_, err = gguf.Read(sparseFile{head: lying, size: 4 << 30}, 4<<30)
	if want := "metadata entry 0: string length 1073741824 would make the header larger than 1073741824 bytes"; !errors.Is(err, gguf.ErrInvalid) || !strings.Contains(err.Error(), want) {
		t.Errorf("Read = %v, want ErrInvalid saying %q", err, want)
	}
}
