package openai

import (
	"bytes"
	"encoding/base64"
	"strings"
	"testing"
)

func TestDecodeChatImagePartsKeepTheirPlace(t *testing.T) {
	png := []byte("\x89PNG\r\n\x1a\nfake")
	uri := "data:image/png;base64," + base64.StdEncoding.EncodeToString(png)
	body := `{"messages":[{"role":"user","content":[{"type":"text","text":"before"},` +
		`{"type":"image_url","image_url":{"url":"` + uri + `","detail":"low"}},` +
		`{"type":"text","text":"after"},{"type":"image_url","image_url":"` + uri + `"}]}]}`
	req, err := DecodeChatCompletionRequest([]byte(body), Limits{})
	if err != nil {
		t.Fatal(err)
	}
	m := req.Messages[0]
	// Joined as llama.cpp's server joins parts: "\n" between texts,
	// none around an image's marker.
	if want := "before" + ImageMarker + "after" + ImageMarker; m.Content != want {
		t.Errorf("content %q, want %q", m.Content, want)
	}
	if len(m.Images) != 2 || !bytes.Equal(m.Images[0], png) || ImageCount(req.Messages) != 2 {
		t.Errorf("images %q, want the PNG twice", m.Images)
	}
}

func TestDecodeDataURIBoundsTheImage(t *testing.T) {
	big := "data:image/png;base64," + strings.Repeat("A", (MaxImageBytes/3+2)*4)
	if _, err := DecodeDataURI("p", big); err == nil || !strings.Contains(err.Error(), "MiB") {
		t.Errorf("an image over MaxImageBytes: %v, want refused for its size", err)
	}
	if _, err := DecodeDataURI("p", "data:image/png;base64,"); err == nil {
		t.Error("an empty image was accepted")
	}
	if b, err := DecodeDataURI("p", "data:image/JPEG;base64,/9j/"); err != nil || len(b) != 3 {
		t.Errorf("a JPEG: %v %v", b, err)
	}
}
