package testmodel

import (
	"fmt"
	"io"
	"math"

	"github.com/apiary-llm/apiary/internal/gguf"
)

// Defaults and limits of ProjectorOptions.
const (
	ProjectorImageSize = 32
	ProjectorPatchSize = 8
	ProjectorDim       = 32
	ProjectorHeads     = 4
	ProjectorLayers    = 2
	MaxProjectorImage  = 1024
)

// ProjectorOptions choose a vision projector (an "mmproj" GGUF, what
// llama.cpp's libmtmd loads beside a text model): a small ViT with random
// weights followed by LLaVA's two-layer MLP projector (clip.cpp's projector
// type "mlp"), the simplest vision projector llama.cpp supports. An image
// is resized to ImageSize × ImageSize and becomes (ImageSize/PatchSize)²
// embeddings of width TextDim, each one position of the text model. A zero
// field takes its default.
type ProjectorOptions struct {
	// TextDim is the width of the projector's output, which must be the
	// text model's embedding length (Options.Dim). Required.
	TextDim   int
	Seed      int64 // of the random weights; default 1
	ImageSize int   // side of the square image the encoder sees, a multiple of PatchSize up to MaxProjectorImage; default ProjectorImageSize
	PatchSize int   // side of a patch; default ProjectorPatchSize
	Dim       int   // width of the ViT, a multiple of 2 × Heads; default ProjectorDim
	Heads     int   // attention heads of the ViT; default ProjectorHeads
	// Layers is the ViT's blocks, 2 … MaxLayers: LLaVA's projector reads
	// the second-to-last block's output, so the last one is loaded but not
	// run. Default ProjectorLayers.
	Layers int
}

func (p ProjectorOptions) withDefaults() ProjectorOptions {
	if p.Seed == 0 {
		p.Seed = 1
	}
	if p.ImageSize == 0 {
		p.ImageSize = ProjectorImageSize
	}
	if p.PatchSize == 0 {
		p.PatchSize = ProjectorPatchSize
	}
	if p.Dim == 0 {
		p.Dim = ProjectorDim
	}
	if p.Heads == 0 {
		p.Heads = ProjectorHeads
	}
	if p.Layers == 0 {
		p.Layers = ProjectorLayers
	}
	return p
}

// Validate reports options out of range, after defaults are applied.
func (p ProjectorOptions) Validate() error {
	p = p.withDefaults()
	switch {
	case p.TextDim < MinDim || p.TextDim > MaxDim:
		return fmt.Errorf("%w: projector output width %d is not in %d…%d (the text model's dim)", ErrOptions, p.TextDim, MinDim, MaxDim)
	case p.PatchSize < 1 || p.ImageSize < p.PatchSize || p.ImageSize > MaxProjectorImage || p.ImageSize%p.PatchSize != 0:
		return fmt.Errorf("%w: projector image size %d is not a multiple of patch size %d up to %d", ErrOptions, p.ImageSize, p.PatchSize, MaxProjectorImage)
	case p.Heads < 1 || p.Heads > MaxHeads:
		return fmt.Errorf("%w: projector heads %d is not in 1…%d", ErrOptions, p.Heads, MaxHeads)
	case p.Dim < MinDim || p.Dim > MaxDim || p.Dim%(2*p.Heads) != 0:
		return fmt.Errorf("%w: projector dim %d is not a multiple of %d (2 × heads) in %d…%d", ErrOptions, p.Dim, 2*p.Heads, MinDim, MaxDim)
	case p.Layers < 2 || p.Layers > MaxLayers:
		return fmt.Errorf("%w: projector layers %d is not in 2…%d", ErrOptions, p.Layers, MaxLayers)
	}
	return nil
}

// ImageTokens is the number of positions an image takes in the text
// model's context: one a patch.
func (p ProjectorOptions) ImageTokens() int {
	p = p.withDefaults()
	n := p.ImageSize / p.PatchSize
	return n * n
}

// projectorMetadata is the metadata clip.cpp reads (clip-impl.h's KEY_*).
func projectorMetadata(p ProjectorOptions) gguf.Metadata {
	var md gguf.Metadata
	add := func(key string, v gguf.Value) { md = append(md, gguf.KV{Key: key, Value: v}) }
	u32 := func(n int) gguf.Value { return gguf.Uint32(uint32(n)) }
	add("general.architecture", gguf.String("clip"))
	add("general.name", gguf.String(fmt.Sprintf("apiary test projector (seed %d, image %d, patch %d, dim %d, %d layers, out %d)",
		p.Seed, p.ImageSize, p.PatchSize, p.Dim, p.Layers, p.TextDim)))
	add("general.file_type", gguf.Uint32(0)) // all F32
	add("clip.projector_type", gguf.String("mlp"))
	add("clip.has_vision_encoder", gguf.Bool(true))
	add("clip.use_gelu", gguf.Bool(true))
	add("clip.vision.image_size", u32(p.ImageSize))
	add("clip.vision.patch_size", u32(p.PatchSize))
	add("clip.vision.embedding_length", u32(p.Dim))
	add("clip.vision.feed_forward_length", u32(FeedForwardFactor*p.Dim))
	add("clip.vision.projection_dim", u32(p.TextDim))
	add("clip.vision.block_count", u32(p.Layers))
	add("clip.vision.attention.head_count", u32(p.Heads))
	add("clip.vision.attention.layer_norm_epsilon", gguf.Float32(1e-5))
	add("clip.vision.image_mean", gguf.Array([]float32{0.5, 0.5, 0.5}))
	add("clip.vision.image_std", gguf.Array([]float32{0.5, 0.5, 0.5}))
	return md
}

// projectorTensors lists the projector's tensors in file order, shapes in
// ggml order (see tensors).
func projectorTensors(p ProjectorOptions) []tensor {
	dim, ff, out := uint64(p.Dim), uint64(FeedForwardFactor*p.Dim), uint64(p.TextDim)
	patch, patches := uint64(p.PatchSize), uint64(p.ImageTokens())
	zeros := func(int) float32 { return 0 }
	var ts []tensor
	mk := func(name string, fill func(int) float32, dims ...uint64) {
		std := WeightStdDev
		if len(dims) >= 2 {
			std = 1 / math.Sqrt(float64(dims[0]))
		}
		ts = append(ts, tensor{Tensor: gguf.Tensor{Name: name, Shape: dims, Type: gguf.TypeF32}, fill: fill, std: std})
	}
	// The patch embedding is a convolution of kernel patch × patch over
	// the 3 channels, one kernel an embedding.
	mk("v.patch_embd.weight", nil, patch, patch, 3, dim)
	mk("v.patch_embd.bias", zeros, dim)
	mk("v.position_embd.weight", nil, dim, patches)
	mk("v.pre_ln.weight", ones, dim)
	mk("v.pre_ln.bias", zeros, dim)
	for l := range p.Layers {
		blk := func(name string) string { return fmt.Sprintf("v.blk.%d.%s", l, name) }
		for _, w := range []string{"attn_q", "attn_k", "attn_v", "attn_out"} {
			mk(blk(w+".weight"), nil, dim, dim)
			mk(blk(w+".bias"), zeros, dim)
		}
		mk(blk("ln1.weight"), ones, dim)
		mk(blk("ln1.bias"), zeros, dim)
		mk(blk("ffn_up.weight"), nil, dim, ff)
		mk(blk("ffn_up.bias"), zeros, ff)
		mk(blk("ffn_down.weight"), nil, ff, dim)
		mk(blk("ffn_down.bias"), zeros, dim)
		mk(blk("ln2.weight"), ones, dim)
		mk(blk("ln2.bias"), zeros, dim)
	}
	mk("mm.0.weight", nil, dim, out)
	mk("mm.0.bias", zeros, out)
	mk("mm.2.weight", nil, out, out)
	mk("mm.2.bias", zeros, out)
	return ts
}

// WriteProjector writes the projector p describes to w. The same options
// always give the same bytes.
func WriteProjector(w io.Writer, p ProjectorOptions) error {
	if err := p.Validate(); err != nil {
		return err
	}
	p = p.withDefaults()
	return writeGGUF(w, projectorMetadata(p), projectorTensors(p), p.Seed)
}

// WriteProjectorFile writes the projector p describes to path, through a
// temporary file renamed into place.
func WriteProjectorFile(path string, p ProjectorOptions) error {
	if err := p.Validate(); err != nil {
		return err
	}
	return writeFileVia(path, func(w io.Writer) error { return WriteProjector(w, p) })
}
