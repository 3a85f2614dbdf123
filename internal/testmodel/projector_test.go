package testmodel

import (
	"bytes"
	"errors"
	"testing"

	"github.com/apiary-llm/apiary/internal/gguf"
)

func TestWriteProjectorHasWhatClipReads(t *testing.T) {
	p := ProjectorOptions{TextDim: 64}
	var a, b bytes.Buffer
	if err := WriteProjector(&a, p); err != nil {
		t.Fatal(err)
	}
	if err := WriteProjector(&b, p); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Error("the same options gave different bytes")
	}
	f, err := gguf.Read(bytes.NewReader(a.Bytes()), int64(a.Len()))
	if err != nil {
		t.Fatal(err)
	}
	if got := f.Architecture(); got != "clip" {
		t.Errorf("architecture %q, want clip", got)
	}
	// The projector's output width is the text model's embedding length:
	// libmtmd refuses a projector whose mm.2 does not match.
	mm2, ok := f.Tensor("mm.2.weight")
	if !ok || mm2.Shape[1] != 64 {
		t.Errorf("mm.2.weight %v (found %v), want output width 64", mm2.Shape, ok)
	}
	pos, ok := f.Tensor("v.position_embd.weight")
	if !ok || int(pos.Shape[1]) != p.ImageTokens() || p.ImageTokens() != 16 {
		t.Errorf("position_embd %v, image tokens %d; want 16 positions", pos.Shape, p.ImageTokens())
	}
}

func TestProjectorOptionsValidate(t *testing.T) {
	for _, p := range []ProjectorOptions{
		{}, // no TextDim
		{TextDim: 64, ImageSize: 30, PatchSize: 8}, // not a multiple
		{TextDim: 64, Layers: 1},
		{TextDim: 64, Dim: 30},
	} {
		if err := p.Validate(); !errors.Is(err, ErrOptions) {
			t.Errorf("%+v: %v, want ErrOptions", p, err)
		}
	}
}
