package openai

import (
	"encoding/base64"
	"strings"
)

// ImageMarker stands for an image in a message's Content: the n-th
// marker of a request's messages is its n-th image (ChatMessage.Images).
// It is llama.cpp's libmtmd's default media marker, which the engine
// reads.
const ImageMarker = "<__media__>"

// MaxImageBytes bounds one image of a request, decoded; the body limit
// (the queen's and the worker's) bounds them all.
const MaxImageBytes = 20 << 20

// MaxImageBodyBytes is the least body limit of a chat with a model that
// reads images: a picture of MaxImageBytes, base64, and the rest.
const MaxImageBodyBytes = 32 << 20

// imageMediaTypes are the media types a data URI's image may have: the
// pictures llama.cpp decodes.
var imageMediaTypes = map[string]bool{"image/png": true, "image/jpeg": true, "image/jpg": true, "image/gif": true, "image/bmp": true}

// decodeImagePart reads an image_url content part's image: a base64
// data URI of a PNG, JPEG, GIF or BMP picture. URLs to fetch are not
// supported.
func decodeImagePart(po object) ([]byte, error) {
	param := po.param("image_url")
	r, ok := po.raw("image_url")
	if !ok {
		return nil, missing(param, `{"url": "data:image/png;base64,…"}`)
	}
	var url string
	if jsonKind(r) == "a string" { // lenient: the URL itself
		url, _, _ = po.text("image_url")
	} else {
		io, _, err := po.member("image_url")
		if err != nil {
			return nil, err
		}
		u, ok, err := io.text("url")
		switch {
		case err != nil:
			return nil, err
		case !ok:
			return nil, missing(io.param("url"), `a data URI: "data:image/png;base64,…"`)
		}
		url, param = u, io.param("url")
	}
	return DecodeDataURI(param, url)
}

// DecodeDataURI decodes url, a base64 data URI of a picture
// ("data:image/png;base64,…"), bounded by MaxImageBytes. param names the
// field for errors.
func DecodeDataURI(param, url string) ([]byte, error) {
	if strings.HasPrefix(url, "http://") || strings.HasPrefix(url, "https://") {
		return nil, Unsupported(param, "image URLs are not fetched; send the image inline as a data URI (data:image/png;base64,…)")
	}
	rest, ok := strings.CutPrefix(url, "data:")
	if !ok {
		return nil, Invalid(param, "an image must be a data URI (data:image/png;base64,…)")
	}
	meta, data, ok := strings.Cut(rest, ",")
	if !ok {
		return nil, Invalid(param, "the data URI has no comma before its data")
	}
	mediaType, enc, _ := strings.Cut(meta, ";")
	if !imageMediaTypes[strings.ToLower(mediaType)] {
		return nil, Invalid(param, "images of type %q are not supported; send PNG, JPEG, GIF or BMP", mediaType)
	}
	if enc != "base64" {
		return nil, Invalid(param, "the data URI must be base64 (data:%s;base64,…)", mediaType)
	}
	if base64.StdEncoding.DecodedLen(len(data)) > MaxImageBytes+3 {
		return nil, Invalid(param, "the image is over %d MiB", MaxImageBytes>>20)
	}
	b, err := base64.StdEncoding.DecodeString(data)
	if err != nil {
		return nil, Invalid(param, "the image's base64 data is malformed: %v", err)
	}
	if len(b) == 0 {
		return nil, Invalid(param, "the image is empty")
	}
	if len(b) > MaxImageBytes {
		return nil, Invalid(param, "the image is over %d MiB", MaxImageBytes>>20)
	}
	return b, nil
}

// Images are the images of msgs, in order (nil: none).
func Images(msgs []ChatMessage) [][]byte {
	var out [][]byte
	for _, m := range msgs {
		out = append(out, m.Images...)
	}
	return out
}

// ImageCount is the number of images of msgs.
func ImageCount(msgs []ChatMessage) int {
	n := 0
	for _, m := range msgs {
		n += len(m.Images)
	}
	return n
}

func imageMarkerError(param string) error {
	return Invalid(param, "the text holds %s, which stands for an image here; leave it out", ImageMarker)
}
