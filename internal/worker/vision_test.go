package worker

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/apiary-llm/apiary/internal/engine"
	"github.com/apiary-llm/apiary/internal/openai"
	"github.com/apiary-llm/apiary/internal/testbin"
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

// A chat with an image gets llama-server's greedy answer, from a prompt of
// as many tokens (--mmproj --jinja, the same llama.cpp commit, the same
// model with a ChatML template, projector and picture): the parts joined
// as llama-server joins them, the image's positions the same.
func TestImageChatAsLlamaServerDoes(t *testing.T) {
	server := testbin.LlamaServer(t)
	// A model with its own chat template, which llama-server renders
	// with --jinja as the worker does.
	model := filepath.Join(t.TempDir(), "chatml.gguf")
	if err := testmodel.WriteFile(model, testmodel.Options{ToolTemplate: true}); err != nil {
		t.Fatal(err)
	}
	proj := filepath.Join(filepath.Dir(model), "mmproj-"+filepath.Base(model))
	if err := testmodel.WriteProjectorFile(proj, testmodel.ProjectorOptions{TextDim: 64}); err != nil {
		t.Fatal(err)
	}
	_, worker := startWorkerBinaryOn(t, model, nil, "--ctx-size", "512")
	ls := testbin.StartLlamaServer(t, server, "-m", model, "--mmproj", proj, "--jinja", "-c", "512", "-t", "1", "--no-warmup")
	answer := func(url string) string {
		body := `{"messages":[{"role":"user","content":[{"type":"text","text":"What is this?"},` +
			`{"type":"image_url","image_url":{"url":"` + pngDataURI(t) + `"}}]}],"max_tokens":16,"temperature":0,"ignore_eos":true}`
		res, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var out openai.ChatCompletion
		if err := json.NewDecoder(res.Body).Decode(&out); err != nil || res.StatusCode != http.StatusOK || len(out.Choices) != 1 {
			t.Fatalf("%s: %d %v", url, res.StatusCode, err)
		}
		return fmt.Sprintf("%d prompt tokens: %q", out.Usage.PromptTokens, out.Choices[0].Message.Content)
	}
	if got, want := answer(worker), answer(ls); got != want {
		t.Errorf("the worker answers %s, llama-server %s", got, want)
	}
}

// A worker that reads images takes chat bodies up to
// openai.MaxImageBodyBytes (a picture inline), one that does not only
// its --max-body limit (4 MiB): a 6 MiB body is served by the first and
// refused 413 by the second.
func TestVisionWorkerTakesBiggerBodies(t *testing.T) {
	model := testModelPath(t)
	proj := filepath.Join(filepath.Dir(model), "mmproj-"+filepath.Base(model))
	if err := testmodel.WriteProjectorFile(proj, testmodel.ProjectorOptions{TextDim: 64}); err != nil {
		t.Fatal(err)
	}
	_, seeing := startWorkerBinaryOn(t, model, nil, "--ctx-size", "256")
	_, blind := startWorkerBinary(t, nil, "--ctx-size", "256")
	body := `{"messages":[{"role":"user","content":"hi"}],"max_tokens":1,"padding":"` + strings.Repeat("x", 6<<20) + `"}`
	for _, c := range []struct {
		url  string
		want int
	}{{seeing, http.StatusOK}, {blind, http.StatusRequestEntityTooLarge}} {
		res, err := http.Post(c.url+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != c.want {
			t.Errorf("%s: a 6 MiB chat body: %d, want %d", c.url, res.StatusCode, c.want)
		}
	}
}
