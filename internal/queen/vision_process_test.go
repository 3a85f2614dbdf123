//go:build !race

package queen

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"image"
	"image/color"
	"image/png"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/apiary-llm/apiary/internal/testmodel"
)

// testPicture is a small PNG, its pixels drawn from seed.
func testPicture(t *testing.T, seed int) []byte {
	t.Helper()
	img := image.NewRGBA(image.Rect(0, 0, 32, 32))
	for y := range 32 {
		for x := range 32 {
			img.Set(x, y, color.RGBA{uint8(seed*37 + 7*x), uint8(seed*91 + 5*y), uint8(seed * 53 * (x ^ y)), 255})
		}
	}
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// paddedPicture is pic (a PNG) made n bytes larger by a text chunk after
// its header, which decoders skip: the same pixels in a bigger file.
func paddedPicture(pic []byte, n int) []byte {
	const afterHeader = 8 + 4 + 4 + 13 + 4 // signature, IHDR's length, type, data, CRC
	chunk := append([]byte("tEXtComment\x00"), bytes.Repeat([]byte("x"), n-len("Comment\x00")-12)...)
	out := append([]byte(nil), pic[:afterHeader]...)
	out = binary.BigEndian.AppendUint32(out, uint32(len(chunk)-4))
	out = append(out, chunk...)
	out = binary.BigEndian.AppendUint32(out, crc32.ChecksumIEEE(chunk))
	return append(out, pic[afterHeader:]...)
}

// post sends body to the queen's path and returns the status and body.
func (c *cluster) post(path, body string) (int, []byte) {
	c.t.Helper()
	res, err := http.Post(c.url+path, "application/json", strings.NewReader(body))
	if err != nil {
		c.t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, b
}

// get reads the queen's path and returns the status and body.
func (c *cluster) get(path string) (int, []byte) {
	c.t.Helper()
	res, err := http.Get(c.url + path)
	if err != nil {
		c.t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, b
}

// A vision model (tiny, with mmproj-tiny.gguf beside it on the hive)
// through the queen: /v1/models says it sees and b (no projector) does
// not; a chat with an image is answered, two pictures give two greedy
// answers; the same picture and text through Ollama's /api/chat,
// Anthropic's /v1/messages and the Responses API give the OpenAI path's
// answer; an image to b is 400 saying it has no projector. A chat whose
// picture makes its body larger than --max-body-bytes (1 MiB) is
// answered for tiny (a model that sees takes up to 32 MiB) and 413 for b.
func TestProcessVisionThroughTheQueen(t *testing.T) {
	// seer is c with a projector the config names (a file named as the
	// Hub names them, mmproj-model-f16.gguf, which pairs with no model).
	config := filepath.Join(t.TempDir(), "models.yaml")
	if err := os.WriteFile(config, []byte("models:\n  seer: {file: c, mmproj: mmproj-model-f16}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c := startClusterWith(t, clusterOptions{more: map[string]testmodel.Options{"b": {Seed: 2}, "c": {Seed: 3}},
		projectors: map[string]testmodel.ProjectorOptions{"tiny": {TextDim: 64}, "model-f16": {TextDim: 64, Seed: 5}}},
		[]string{"--config", config, "--image-fetch-private", "--max-body-bytes", "1048576"}, "--worker-ctx-size", "512")

	code, body := c.get("/v1/models")
	var list struct {
		Data []struct {
			ID           string   `json:"id"`
			Capabilities []string `json:"capabilities"`
		} `json:"data"`
	}
	if code != http.StatusOK || json.Unmarshal(body, &list) != nil {
		t.Fatalf("/v1/models: %d %s", code, body)
	}
	for _, m := range list.Data {
		if strings.HasPrefix(m.ID, "mmproj-") || (m.ID == "tiny" || m.ID == "seer") && !slices.Contains(m.Capabilities, "vision") ||
			m.ID == "b" && len(m.Capabilities) > 0 {
			t.Errorf("/v1/models lists %s with %v; want tiny and seer seeing, b not, the projectors no models", m.ID, m.Capabilities)
		}
	}

	const question = "What is in the picture?"
	pics := [][]byte{testPicture(t, 1), testPicture(t, 2)}
	openaiChat := func(model string, pic []byte) (int, string) {
		b, _ := json.Marshal(map[string]any{"model": model, "max_tokens": 12, "temperature": 0, "messages": []any{
			map[string]any{"role": "user", "content": []any{map[string]any{"type": "text", "text": question},
				map[string]any{"type": "image_url", "image_url": map[string]any{"url": "data:image/png;base64," + base64.StdEncoding.EncodeToString(pic)}}}}}})
		code, body := c.post("/v1/chat/completions", string(b))
		var out struct {
			Choices []struct {
				Message struct{ Content string } `json:"message"`
			} `json:"choices"`
			Usage struct {
				PromptTokens int `json:"prompt_tokens"`
			} `json:"usage"`
		}
		if code != http.StatusOK {
			return code, string(body)
		}
		if json.Unmarshal(body, &out) != nil || len(out.Choices) != 1 {
			t.Fatalf("chat answer %s", body)
		}
		return code, out.Choices[0].Message.Content
	}
	code, first := openaiChat("tiny", pics[0])
	if code != http.StatusOK {
		t.Fatalf("a chat with an image: %d %s", code, first)
	}
	if code, second := openaiChat("tiny", pics[1]); code != http.StatusOK || second == first {
		t.Errorf("another picture: %d %q; want another answer than the first's %q", code, second, first)
	}

	b64 := base64.StdEncoding.EncodeToString(pics[0])
	for _, api := range []struct {
		name, path, body string
		text             func([]byte) string
	}{
		{"ollama /api/chat", "/api/chat",
			`{"model":"tiny","stream":false,"options":{"temperature":0,"num_predict":12},"messages":[{"role":"user","content":"` + question + `","images":["` + b64 + `"]}]}`,
			func(b []byte) string {
				var out struct{ Message struct{ Content string } }
				_ = json.Unmarshal(b, &out)
				return out.Message.Content
			}},
		{"anthropic /v1/messages", "/v1/messages",
			`{"model":"tiny","max_tokens":12,"temperature":0,"messages":[{"role":"user","content":[{"type":"text","text":"` + question + `"},` +
				`{"type":"image","source":{"type":"base64","media_type":"image/png","data":"` + b64 + `"}}]}]}`,
			func(b []byte) string {
				var out struct{ Content []struct{ Text string } }
				_ = json.Unmarshal(b, &out)
				if len(out.Content) == 0 {
					return ""
				}
				return out.Content[0].Text
			}},
		{"responses", "/v1/responses",
			`{"model":"tiny","max_output_tokens":12,"temperature":0,"input":[{"role":"user","content":[{"type":"input_text","text":"` + question + `"},` +
				`{"type":"input_image","image_url":"data:image/png;base64,` + b64 + `"}]}]}`,
			func(b []byte) string {
				var out struct {
					Output []struct {
						Content []struct{ Text string }
					}
				}
				_ = json.Unmarshal(b, &out)
				if len(out.Output) == 0 || len(out.Output[0].Content) == 0 {
					return ""
				}
				return out.Output[0].Content[0].Text
			}},
	} {
		code, body := c.post(api.path, api.body)
		if got := api.text(body); code != http.StatusOK || got != first {
			t.Errorf("%s: %d %q (%s); want the OpenAI path's answer %q", api.name, code, got, body, first)
		}
	}

	// The same picture by URL (a host on loopback: the queen runs with
	// --image-fetch-private): the queen fetches it, the answer is the
	// inline one's, through OpenAI's image_url and Anthropic's url source.
	pictures := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write(pics[0]) }))
	defer pictures.Close()
	byURL := func(path, body string) string {
		code, b := c.post(path, body)
		if code != http.StatusOK {
			return fmt.Sprintf("%d %s", code, b)
		}
		var out struct {
			Choices []struct {
				Message struct{ Content string } `json:"message"`
			} `json:"choices"`
			Content []struct{ Text string } `json:"content"`
		}
		_ = json.Unmarshal(b, &out)
		if len(out.Choices) > 0 {
			return out.Choices[0].Message.Content
		}
		if len(out.Content) > 0 {
			return out.Content[0].Text
		}
		return string(b)
	}
	if got := byURL("/v1/chat/completions", `{"model":"tiny","max_tokens":12,"temperature":0,"messages":[{"role":"user","content":[`+
		`{"type":"text","text":"`+question+`"},{"type":"image_url","image_url":{"url":"`+pictures.URL+`/a.png"}}]}]}`); got != first {
		t.Errorf("the picture by URL: %q; want the inline one's answer %q", got, first)
	}
	if got := byURL("/v1/messages", `{"model":"tiny","max_tokens":12,"temperature":0,"messages":[{"role":"user","content":[`+
		`{"type":"text","text":"`+question+`"},{"type":"image","source":{"type":"url","url":"`+pictures.URL+`/a.png"}}]}]}`); got != first {
		t.Errorf("the picture by URL through /v1/messages: %q; want %q", got, first)
	}

	if code, answer := openaiChat("seer", pics[0]); code != http.StatusOK {
		t.Errorf("a picture to seer, whose projector the config names: %d %s", code, answer)
	}
	code, msg := openaiChat("b", pics[0])
	if code != http.StatusBadRequest || !strings.Contains(msg, "projector") {
		t.Errorf("an image to b, which has no projector: %d %s; want 400 saying so", code, msg)
	}

	// The first picture in a 1.5 MiB file: a body of 2 MiB, over the
	// queen's --max-body-bytes.
	big := paddedPicture(pics[0], 3<<19)
	if code, answer := openaiChat("tiny", big); code != http.StatusOK || answer != first {
		t.Errorf("a chat of 2 MiB (a picture of %d KiB) to tiny: %d %q; want 200 and the small picture's answer %q", len(big)>>10, code, answer, first)
	}
	code, msg = openaiChat("b", big)
	if code != http.StatusRequestEntityTooLarge || !strings.Contains(msg, "larger than 1 MiB, the limit of a model that takes no images") {
		t.Errorf("a chat of 2 MiB to b, which takes no images: %d %s; want 413 saying why", code, msg)
	}
}

// A queen without --image-fetch-private refuses a picture on its own
// network (loopback here) with 400 saying so, before any worker is
// asked: a request must not make the queen reach the hives or a cloud's
// metadata service.
func TestProcessImageURLOnAPrivateAddressRefused(t *testing.T) {
	c := startClusterWith(t, clusterOptions{projectors: map[string]testmodel.ProjectorOptions{"tiny": {TextDim: 64}}}, nil, "--worker-ctx-size", "512")
	reached := false
	pictures := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { reached = true; w.Write(testPicture(t, 1)) }))
	defer pictures.Close()
	code, body := c.post("/v1/chat/completions", `{"model":"tiny","max_tokens":4,"messages":[{"role":"user","content":[`+
		`{"type":"image_url","image_url":{"url":"`+pictures.URL+`/a.png"}}]}]}`)
	if code != http.StatusBadRequest || !strings.Contains(string(body), "not at a public address") || reached {
		t.Errorf("a picture on loopback: %d %s (the server reached: %v); want 400 naming the address, nothing fetched", code, body, reached)
	}
	if rows := c.rows(); len(rows) > 0 {
		t.Errorf("a worker was started for a refused request: %+v", rows)
	}
}
