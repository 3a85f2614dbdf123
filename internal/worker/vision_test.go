package worker

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"image"
	"image/color"
	"image/png"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/apiary-llm/apiary/internal/engine"
	"github.com/apiary-llm/apiary/internal/openai"
	"github.com/apiary-llm/apiary/internal/testmodel"
)

// The marker the OpenAI decoder writes is the one the engine reads.
func TestImageMarkersAgree(t *testing.T) {
	if openai.ImageMarker != engine.ImageMarker {
		t.Fatalf("openai.ImageMarker %q, engine.ImageMarker %q", openai.ImageMarker, engine.ImageMarker)
	}
}

// pngDataURI is a small PNG picture as a data URI.
func pngDataURI(t *testing.T) string {
	img := image.NewRGBA(image.Rect(0, 0, 24, 20))
	for y := range 20 {
		for x := range 24 {
			img.Set(x, y, color.RGBA{uint8(10 * x), uint8(12 * y), 80, 255})
		}
	}
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		t.Fatal(err)
	}
	return "data:image/png;base64," + base64.StdEncoding.EncodeToString(b.Bytes())
}

func imageChat(t *testing.T, url, uri string) (*http.Response, []byte) {
	t.Helper()
	body := `{"messages":[{"role":"user","content":[{"type":"text","text":"What is this?"},` +
		`{"type":"image_url","image_url":{"url":"` + uri + `"}}]}],"max_tokens":3,"temperature":0}`
	res, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var b bytes.Buffer
	b.ReadFrom(res.Body)
	return res, b.Bytes()
}

// A worker of a model with mmproj-M.gguf beside it loads the projector
// and answers a chat with an image; the usage counts the image's
// positions (16: image 32, patch 8) in the prompt.
func TestBinaryChatWithImage(t *testing.T) {
	model := testModelPath(t)
	proj := filepath.Join(filepath.Dir(model), "mmproj-"+filepath.Base(model))
	if err := testmodel.WriteProjectorFile(proj, testmodel.ProjectorOptions{TextDim: 64}); err != nil {
		t.Fatal(err)
	}
	_, url := startWorkerBinaryOn(t, model, nil, "--ctx-size", "512")
	uri := pngDataURI(t)
	res, body := imageChat(t, url, uri)
	if res.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", res.StatusCode, body)
	}
	var got openai.ChatCompletion
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatal(err)
	}
	// The same chat with the text alone, for the prompt's size without
	// the image.
	tb := `{"messages":[{"role":"user","content":"What is this?\n"}],"max_tokens":1}`
	tres, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(tb))
	if err != nil {
		t.Fatal(err)
	}
	var text openai.ChatCompletion
	json.NewDecoder(tres.Body).Decode(&text)
	tres.Body.Close()
	if got.Usage.CompletionTokens != 3 || got.Usage.PromptTokens < text.Usage.PromptTokens+16-2 {
		t.Errorf("usage %+v (text alone: %d prompt tokens); want 3 completion tokens and the image's 16 positions in the prompt",
			got.Usage, text.Usage.PromptTokens)
	}
	if len(got.Choices) != 1 || got.Choices[0].FinishReason == "" {
		t.Errorf("choices %+v", got.Choices)
	}
	// Not a picture: 400.
	res, body = imageChat(t, url, "data:image/png;base64,"+base64.StdEncoding.EncodeToString([]byte("not a png")))
	if res.StatusCode != http.StatusBadRequest {
		t.Errorf("a PNG that is none: %d %s, want 400", res.StatusCode, body)
	}
}

// A model without a projector refuses an image with 400, saying why.
func TestBinaryImageWithoutProjectorIs400(t *testing.T) {
	_, url := startWorkerBinary(t, nil, "--ctx-size", "256")
	res, body := imageChat(t, url, pngDataURI(t))
	var e openai.ErrorResponse
	json.Unmarshal(body, &e)
	if res.StatusCode != http.StatusBadRequest || e.Error.Code != openai.CodeInvalidValue || !strings.Contains(e.Error.Message, "vision projector") {
		t.Errorf("%d %+v, want 400 invalid_value about the missing vision projector", res.StatusCode, e.Error)
	}
}
