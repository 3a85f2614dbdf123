package llamacpp

/*
#cgo LDFLAGS: -lmtmd
#include <stdlib.h>
#include "llama.h"
#include "mtmd.h"
#include "mtmd-helper.h"

extern void apiaryLlamaLog(int level, char *text);

static void forward_mtmd_log(enum ggml_log_level level, const char *text, void *user_data) {
	(void)user_data;
	apiaryLlamaLog((int)level, (char *)text);
}

static void route_mtmd_logs(void) { mtmd_log_set(forward_mtmd_log, NULL); mtmd_helper_log_set(forward_mtmd_log, NULL); }

static mtmd_context *vision_init(const char *path, struct llama_model *model, bool gpu, int threads) {
	struct mtmd_context_params p = mtmd_context_params_default();
	p.use_gpu = gpu;
	p.n_threads = threads;
	p.print_timings = false;
	p.warmup = true;
	return mtmd_init_from_file(path, model, p);
}

// image_from_buf decodes an encoded picture; NULL for anything else
// (audio, which mtmd would detect, included).
static mtmd_bitmap *image_from_buf(mtmd_context *ctx, const unsigned char *buf, size_t len) {
	struct mtmd_helper_bitmap_wrapper w = mtmd_helper_bitmap_init_from_buf(ctx, buf, len, false, mtmd_helper_init_opt_default());
	if (w.video_ctx) mtmd_helper_video_free(w.video_ctx);
	if (w.bitmap && mtmd_bitmap_is_audio(w.bitmap)) {
		mtmd_bitmap_free(w.bitmap);
		return NULL;
	}
	return w.bitmap;
}

static int32_t vision_tokenize(mtmd_context *ctx, mtmd_input_chunks *out, const char *text, size_t len,
		const mtmd_bitmap **bitmaps, size_t n) {
	mtmd_input_text t = {text, len, true, true};
	return mtmd_tokenize(ctx, out, &t, bitmaps, n);
}
*/
import "C"

import (
	"errors"
	"fmt"
	"hash/fnv"
	"strings"
	"sync/atomic"
	"unsafe"

	"github.com/apiary-llm/apiary/internal/engine"
	"github.com/apiary-llm/apiary/internal/imagefetch"
)

var _ engine.Vision = (*Engine)(nil)

// vision is an engine's projector: nil ctx when it has none. The decode
// loop uses it, and TokenizeImages (mtmd's tokenizer reads the context
// only).
type vision struct {
	ctx *C.mtmd_context
}

func (v *vision) free() {
	if v.ctx != nil {
		C.mtmd_free(v.ctx)
		v.ctx = nil
	}
}

// ErrImage means an image could not be read: not a picture the engine
// decodes (PNG, JPEG, GIF, BMP, …), or a prompt whose image markers do
// not match its images.
var ErrImage = errors.New("unreadable image")

// loadProjector loads the vision projector at path for e's model. A
// projector whose positions are not one a token (M-RoPE, Qwen-VL's) is
// refused: the decode loop keeps prompt positions and tokens in step.
func (e *Engine) loadProjector(path string, gpu bool) error {
	C.route_mtmd_logs()
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	ctx := C.vision_init(cpath, e.model, C.bool(gpu), C.int(e.threads))
	if ctx == nil {
		return fmt.Errorf("llama.cpp could not load the projector %s for this model (see the log above for its reason)", path)
	}
	switch {
	case !bool(C.mtmd_support_vision(ctx)):
		C.mtmd_free(ctx)
		return fmt.Errorf("the projector %s reads no images (an audio projector?)", path)
	case bool(C.mtmd_decode_use_mrope(ctx)):
		C.mtmd_free(ctx)
		return fmt.Errorf("the projector %s places images with M-RoPE positions, which apiary does not support yet", path)
	}
	e.vis.ctx = ctx
	e.info.Vision = true
	return nil
}

// TokenizeImages implements engine.Vision.
func (e *Engine) TokenizeImages(text string, images [][]byte) ([]int, []engine.Image, func(), error) {
	if e.vis.ctx == nil {
		return nil, nil, nil, errors.New("the model has no vision projector")
	}
	if n := strings.Count(text, engine.ImageMarker); n != len(images) {
		return nil, nil, nil, fmt.Errorf("%w: the prompt has %d image markers (%s) for %d images", ErrImage, n, engine.ImageMarker, len(images))
	}
	bitmaps := make([]*C.mtmd_bitmap, len(images))
	defer func() {
		for _, b := range bitmaps {
			if b != nil {
				C.mtmd_bitmap_free(b)
			}
		}
	}()
	for i, img := range images {
		if !IsPicture(img) {
			return nil, nil, nil, fmt.Errorf("%w: image %d is not a PNG, JPEG, GIF or BMP picture", ErrImage, i+1)
		}
		buf := C.CBytes(img)
		b := C.image_from_buf(e.vis.ctx, (*C.uchar)(buf), C.size_t(len(img)))
		C.free(buf)
		if b == nil {
			return nil, nil, nil, fmt.Errorf("%w: image %d could not be decoded", ErrImage, i+1)
		}
		bitmaps[i] = b
	}
	ctext := C.CString(text)
	defer C.free(unsafe.Pointer(ctext))
	chunks := C.mtmd_input_chunks_init()
	defer C.mtmd_input_chunks_free(chunks)
	var bp **C.mtmd_bitmap
	if len(bitmaps) > 0 {
		arr := C.malloc(C.size_t(len(bitmaps)) * C.size_t(unsafe.Sizeof(uintptr(0))))
		defer C.free(arr)
		s := unsafe.Slice((**C.mtmd_bitmap)(arr), len(bitmaps))
		copy(s, bitmaps)
		bp = (**C.mtmd_bitmap)(arr)
	}
	if rc := C.vision_tokenize(e.vis.ctx, chunks, ctext, C.size_t(len(text)), bp, C.size_t(len(bitmaps))); rc != 0 {
		return nil, nil, nil, fmt.Errorf("%w: llama.cpp could not tokenize the prompt's images (code %d)", ErrImage, int(rc))
	}
	var (
		prompt []int
		imgs   []engine.Image
	)
	free := func() {
		for _, im := range imgs {
			C.mtmd_input_chunk_free(im.Chunk.(*C.mtmd_input_chunk))
		}
		imgs = nil
	}
	k := 0
	for i := range int(C.mtmd_input_chunks_size(chunks)) {
		chunk := C.mtmd_input_chunks_get(chunks, C.size_t(i))
		switch C.mtmd_input_chunk_get_type(chunk) {
		case C.MTMD_INPUT_CHUNK_TYPE_TEXT:
			var n C.size_t
			toks := C.mtmd_input_chunk_get_tokens_text(chunk, &n)
			for _, t := range unsafe.Slice(toks, int(n)) {
				prompt = append(prompt, int(t))
			}
		case C.MTMD_INPUT_CHUNK_TYPE_IMAGE:
			n := int(C.mtmd_input_chunk_get_n_tokens(chunk))
			if int(C.mtmd_input_chunk_get_n_pos(chunk)) != n {
				free()
				return nil, nil, nil, fmt.Errorf("%w: the projector gives image %d %d tokens in %d positions, which apiary does not support",
					ErrImage, k+1, n, int(C.mtmd_input_chunk_get_n_pos(chunk)))
			}
			imgs = append(imgs, engine.Image{Start: len(prompt), Tokens: n, Chunk: C.mtmd_input_chunk_copy(chunk)})
			prompt = append(prompt, placeholders(images[k], n)...)
			k++
		default:
			free()
			return nil, nil, nil, fmt.Errorf("%w: the prompt holds media other than images", ErrImage)
		}
	}
	if len(imgs) > 0 && imgs[len(imgs)-1].Start+imgs[len(imgs)-1].Tokens == len(prompt) {
		free()
		return nil, nil, nil, fmt.Errorf("%w: the prompt ends with an image; text must follow it", ErrImage)
	}
	return dropDoubleBOS(prompt, C.llama_vocab_bos(e.vocab)), shiftImages(imgs, prompt), free, nil
}

// IsPicture reports whether b is what the engine hands to llama.cpp's
// decoder (imagefetch.PictureType): other bytes never reach it.
func IsPicture(b []byte) bool { return imagefetch.PictureType(b) != "" }

// placeholders are the ids an image's n positions take in a prompt:
// negative (no token of the vocabulary), and derived from its bytes, so
// that the same image gives the same ids (a conversation's next turn
// reuses the slot's memory of it) and another one different ids.
func placeholders(img []byte, n int) []int {
	h := fnv.New64a()
	h.Write(img)
	base := h.Sum64()
	ids := make([]int, n)
	for i := range ids {
		ids[i] = -1 - int((base+uint64(i)*0x9e3779b97f4a7c15)>>34) // in -2^30 … -1
	}
	return ids
}

// dropDoubleBOS removes a BOS that both the chat template and the
// tokenizer wrote, as Tokenize does.
func dropDoubleBOS(prompt []int, bos C.llama_token) []int {
	if len(prompt) >= 2 && prompt[0] == prompt[1] && prompt[0] == int(bos) {
		return prompt[1:]
	}
	return prompt
}

// shiftImages moves the images' starts back by what dropDoubleBOS took
// off the front of prompt.
func shiftImages(imgs []engine.Image, full []int) []engine.Image {
	if len(full) >= 2 && full[0] == full[1] && len(imgs) > 0 && full[0] >= 0 {
		for i := range imgs {
			imgs[i].Start--
		}
	}
	return imgs
}

// imageAt returns the image of s's prompt that starts at its promptPos,
// nil when none does.
func imageAt(s *sequence) *engine.Image {
	for i := range s.req.Images {
		if s.req.Images[i].Start == s.promptPos {
			return &s.req.Images[i]
		}
	}
	return nil
}

// textEnd is where the text from s's promptPos on ends: the next
// image's start, or the prompt's end.
func textEnd(s *sequence) int {
	end := len(s.req.Prompt)
	for _, im := range s.req.Images {
		if im.Start >= s.promptPos && im.Start < end {
			end = im.Start
		}
	}
	return end
}

// outsideImages returns n, or the start of the image n falls inside of:
// a slot's memory is reused up to a whole image, never into one.
func outsideImages(imgs []engine.Image, n int) int {
	for _, im := range imgs {
		if n > im.Start && n < im.Start+im.Tokens {
			return im.Start
		}
	}
	return n
}

// evalImage decodes image im of s into s's slot, at s.nPast: the
// projector encodes it, and its embeddings go through the model as a
// batch of their own. It runs on the decode loop, between steps.
func (e *Engine) evalImage(s *sequence, im *engine.Image) error {
	if e.abortFlag != nil {
		atomic.StoreInt32((*int32)(unsafe.Pointer(e.abortFlag)), 0)
	}
	var newPast C.llama_pos
	rc := C.mtmd_helper_eval_chunk_single(e.vis.ctx, e.lctx, im.Chunk.(*C.mtmd_input_chunk), C.llama_pos(s.nPast),
		C.llama_seq_id(s.seq), C.int32_t(e.batchSize), false, &newPast)
	if rc != 0 {
		return fmt.Errorf("decoding an image failed (code %d)", int(rc))
	}
	s.promptPos += im.Tokens
	s.nPast = int(newPast)
	e.promptDecoded.Add(int64(im.Tokens))
	return nil
}
