package routing

// Pictures by URL: a chat's image_url part (OpenAI, and the Responses
// API's input_image, which arrives here as one) or an Anthropic image
// block with a url source names a picture the worker is not to fetch
// (workers may have no network; a request must not make them reach
// theirs). The queen fetches it (Config.Images, internal/imagefetch:
// public addresses only, bounded) and hands it to the worker inline, as
// the client could have sent it.

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/apiary-llm/apiary/internal/imagefetch"
	"github.com/apiary-llm/apiary/internal/openai"
)

// maxFetchedImages bounds the pictures one request may name by URL.
const maxFetchedImages = 8

// inlineImages returns body with every picture it names by http(s) URL
// replaced by the picture itself (a data URI, or an Anthropic base64
// source), fetched; body itself when it names none or no fetcher is
// configured. path says whose shape the body has.
func (s *Service) inlineImages(ctx context.Context, path string, body []byte) ([]byte, error) {
	if s.cfg.Images == nil || !bytes.Contains(body, []byte(`"http`)) {
		return body, nil
	}
	var doc map[string]any
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber() // numbers pass as they came
	if dec.Decode(&doc) != nil {
		return body, nil // the decoder after this says what is wrong with it
	}
	msgs, _ := doc["messages"].([]any)
	anthropicAPI := strings.HasPrefix(path, "/v1/messages")
	fetched := 0
	fetch := func(param, url string) ([]byte, string, error) {
		if fetched++; fetched > maxFetchedImages {
			return nil, "", openai.Invalid(param, "a request names at most %d pictures by URL; send the others inline", maxFetchedImages)
		}
		b, mt, err := s.cfg.Images.Fetch(ctx, url)
		if errors.Is(err, imagefetch.ErrFetch) {
			return nil, "", openai.Invalid(param, "%v", err)
		}
		return b, mt, err
	}
	changed := false
	for i, m := range msgs {
		mm, _ := m.(map[string]any)
		parts, _ := mm["content"].([]any)
		for k, p := range parts {
			part, _ := p.(map[string]any)
			if part == nil {
				continue
			}
			var err error
			var did bool
			if anthropicAPI {
				did, err = inlineAnthropicImage(part, fmt.Sprintf("messages.%d.content.%d.source", i, k), fetch)
			} else {
				did, err = inlineImagePart(part, fmt.Sprintf("messages[%d].content[%d].image_url", i, k), fetch)
			}
			if err != nil {
				return nil, err
			}
			changed = changed || did
		}
	}
	if !changed {
		return body, nil
	}
	return json.Marshal(doc)
}

// isWebURL says whether v is an http(s) URL string.
func isWebURL(v any) (string, bool) {
	u, ok := v.(string)
	return u, ok && (strings.HasPrefix(u, "http://") || strings.HasPrefix(u, "https://"))
}

// inlineImagePart replaces an OpenAI image_url part's http(s) URL with
// the picture's data URI.
func inlineImagePart(part map[string]any, param string, fetch func(string, string) ([]byte, string, error)) (bool, error) {
	if part["type"] != "image_url" {
		return false, nil
	}
	iu := part["image_url"]
	obj, isObj := iu.(map[string]any)
	if isObj {
		iu = obj["url"]
	}
	u, ok := isWebURL(iu)
	if !ok {
		return false, nil
	}
	b, mt, err := fetch(param, u)
	if err != nil {
		return false, err
	}
	uri := "data:" + mt + ";base64," + base64.StdEncoding.EncodeToString(b)
	if isObj {
		obj["url"] = uri
	} else {
		part["image_url"] = map[string]any{"url": uri}
	}
	return true, nil
}

// inlineAnthropicImage replaces an Anthropic image block's url source
// with a base64 one.
func inlineAnthropicImage(block map[string]any, param string, fetch func(string, string) ([]byte, string, error)) (bool, error) {
	src, _ := block["source"].(map[string]any)
	if block["type"] != "image" || src == nil || src["type"] != "url" {
		return false, nil
	}
	u, ok := isWebURL(src["url"])
	if !ok {
		return false, nil
	}
	b, mt, err := fetch(param, u)
	if err != nil {
		return false, err
	}
	block["source"] = map[string]any{"type": "base64", "media_type": mt, "data": base64.StdEncoding.EncodeToString(b)}
	return true, nil
}
