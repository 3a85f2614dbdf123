package llamacpp_test

import (
	"bytes"
	"context"
	"errors"
	"image"
	"image/color"
	"image/png"
	"path/filepath"
	"testing"

	"github.com/apiary-llm/apiary/internal/engine"
	"github.com/apiary-llm/apiary/internal/llamacpp"
	"github.com/apiary-llm/apiary/internal/testmodel"
)

// loadVision loads the test model with a random projector (image 32,
// patch 8: 16 positions an image).
func loadVision(t *testing.T, slots int) *llamacpp.Engine {
	t.Helper()
	dir := t.TempDir()
	proj := filepath.Join(dir, "mmproj-tiny.gguf")
	if err := testmodel.WriteProjectorFile(proj, testmodel.ProjectorOptions{TextDim: 64}); err != nil {
		t.Fatal(err)
	}
	e, err := llamacpp.Load(context.Background(), engine.Options{
		ModelPath: writeModel(t), Projector: proj, CtxSize: 256 * slots, Slots: slots, Threads: 1, GPUDevice: -1,
	}, nil)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// testPNG is a w×h PNG whose pixels depend on shade.
func testPNG(t testing.TB, w, h int, shade uint8) []byte {
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	for y := range h {
		for x := range w {
			img.Set(x, y, color.RGBA{uint8(x * 7), uint8(y * 5), shade, 255})
		}
	}
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func TestImagePromptDecodesTheImageAndReusesItNextTurn(t *testing.T) {
	e := loadVision(t, 1)
	if !e.Info().Vision {
		t.Fatal("Info().Vision is false with a projector loaded")
	}
	text := "User: what is in " + engine.ImageMarker + " this picture?\n\nAssistant:"
	ids, imgs, free, err := e.TokenizeImages(text, [][]byte{testPNG(t, 40, 30, 9)})
	if err != nil {
		t.Fatal(err)
	}
	defer free()
	placeholders := 0
	for _, id := range ids {
		if id < 0 {
			placeholders++
		}
	}
	if len(imgs) != 1 || imgs[0].Tokens != 16 || placeholders != 16 || ids[imgs[0].Start] >= 0 || ids[imgs[0].Start+15] >= 0 {
		t.Fatalf("images %+v, prompt %v; want one image of 16 placeholder positions", imgs, ids)
	}
	req := engine.Request{Prompt: ids, Images: imgs, MaxTokens: 4, Temperature: 0}
	out1, res := collect(t, e, req)
	if res.PromptTokens != len(ids) || res.CompletionTokens != 4 || len(out1) != 4 {
		t.Fatalf("result %+v, %d tokens; want %d prompt tokens (the image's counted) and 4 completion tokens", res, len(out1), len(ids))
	}
	// The same prompt again: the slot's memory holds it, image included.
	out2, res2 := collect(t, e, req)
	if res2.CachedTokens != len(ids)-1 {
		t.Errorf("second run cached %d tokens, want %d (all but the last)", res2.CachedTokens, len(ids)-1)
	}
	if !slicesEqual(out1, out2) {
		t.Errorf("greedy outputs differ: %v then %v", out1, out2)
	}
	// Another image in the same place is decoded afresh: only the text
	// before it is reused.
	ids3, imgs3, free3, err := e.TokenizeImages(text, [][]byte{testPNG(t, 40, 30, 200)})
	if err != nil {
		t.Fatal(err)
	}
	defer free3()
	_, res3 := collect(t, e, engine.Request{Prompt: ids3, Images: imgs3, MaxTokens: 2})
	if res3.CachedTokens != imgs3[0].Start {
		t.Errorf("another image: cached %d tokens, want %d (the text before the image)", res3.CachedTokens, imgs3[0].Start)
	}
}

func slicesEqual(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestTokenizeImagesRefusesWhatIsNoPicture(t *testing.T) {
	e := loadVision(t, 1)
	for name, c := range map[string]struct {
		text   string
		images [][]byte
	}{
		"not an image":     {"a " + engine.ImageMarker + " b", [][]byte{[]byte("hello, no picture")}},
		"a broken png":     {"a " + engine.ImageMarker + " b", [][]byte{testPNG(t, 8, 8, 0)[:40]}},
		"markers mismatch": {"a b", [][]byte{testPNG(t, 8, 8, 0)}},
		"image at the end": {"a " + engine.ImageMarker, [][]byte{testPNG(t, 8, 8, 0)}},
	} {
		if _, _, _, err := e.TokenizeImages(c.text, c.images); !errors.Is(err, llamacpp.ErrImage) {
			t.Errorf("%s: %v, want ErrImage", name, err)
		}
	}
}
