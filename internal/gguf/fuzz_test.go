package gguf_test

import (
	"bytes"
	"errors"
	"io"
	"testing"

	"github.com/apiary-llm/apiary/internal/gguf"
)

// FuzzRead feeds arbitrary bytes to the reader. It must never panic and
// never fail with an error outside the package's kinds; what it accepts
// must survive a rewrite: writing the parsed file and reading it again
// gives back the same bytes when written once more.
func FuzzRead(f *testing.F) {
	valid := func(md gguf.Metadata, tensors []gguf.Tensor) []byte {
		var buf bytes.Buffer
		if err := gguf.Write(&buf, md, tensors); err != nil {
			f.Fatal(err)
		}
		return buf.Bytes()
	}
	full := valid(sampleMetadata(), sampleTensors())
	small := valid(gguf.Metadata{{"general.architecture", gguf.String("llama")}}, []gguf.Tensor{
		{Name: "w", Shape: []uint64{2}, Type: gguf.TypeF32, Data: make([]byte, 8)},
	})
	f.Add(full)
	f.Add(small)
	f.Add(valid(llamaMetadata()[:9], nil))
	f.Add(valid(nil, nil))
	for _, n := range []int{0, 3, 4, 8, 16, 24, 40, len(small) / 2, len(small) - 1, len(full) / 3, len(full) - 1} {
		f.Add(full[:min(n, len(full))])
	}
	f.Add([]byte("PK\x03\x04"))

	f.Fuzz(func(t *testing.T, b []byte) {
		gf, err := gguf.Read(bytes.NewReader(b), int64(len(b)))
		if err != nil {
			if !errors.Is(err, gguf.ErrNotGGUF) && !errors.Is(err, gguf.ErrVersion) &&
				!errors.Is(err, gguf.ErrTruncated) && !errors.Is(err, gguf.ErrInvalid) {
				t.Fatalf("error of no known kind: %v", err)
			}
			return
		}
		_ = gf.Info().EstimateMemory(0)

		tensors := make([]gguf.Tensor, len(gf.Tensors))
		for i, ti := range gf.Tensors {
			data, err := io.ReadAll(gf.TensorData(bytes.NewReader(b), ti))
			if err != nil {
				t.Fatalf("reading tensor %q of an accepted file: %v", ti.Name, err)
			}
			tensors[i] = gguf.Tensor{Name: ti.Name, Shape: ti.Shape, Type: ti.Type, Data: data}
		}
		var once, twice bytes.Buffer
		if err := gguf.Write(&once, gf.Metadata, tensors); err != nil {
			t.Fatalf("writing an accepted file: %v", err)
		}
		again, err := gguf.Read(bytes.NewReader(once.Bytes()), int64(once.Len()))
		if err != nil {
			t.Fatalf("reading a rewritten file: %v", err)
		}
		if err := gguf.Write(&twice, again.Metadata, tensors); err != nil {
			t.Fatalf("writing a rewritten file: %v", err)
		}
		if !bytes.Equal(once.Bytes(), twice.Bytes()) {
			t.Fatalf("rewriting is not stable")
		}
	})
}
