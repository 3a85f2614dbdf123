package openai

import (
	"encoding/json"
	"fmt"
)

// ObjectEmbedding is the "object" of one embedding.
const ObjectEmbedding = "embedding"

// MaxEmbeddingInputs bounds the strings of one embeddings request, as
// OpenAI's API does.
const MaxEmbeddingInputs = 2048

// MaxEmbeddingBodyBytes bounds an embeddings request's body where the
// other endpoints' bound is lower: MaxEmbeddingInputs texts of a few
// thousand characters (clients send hundreds at once: LangChain 512, the
// AI SDK up to 2048).
const MaxEmbeddingBodyBytes = 16 << 20

// EmbeddingRequest is a decoded, validated POST /v1/embeddings body.
type EmbeddingRequest struct {
	Model string   `json:"model"`
	Input []string `json:"input"` // from a string or an array of strings
	// EncodingFormat is "float" (the default) or "base64" (little-endian
	// float32s).
	EncodingFormat string `json:"encoding_format,omitempty"`
	// Dimensions, when not 0, is the size the client asked for; only the
	// model's own can be given (the worker checks it).
	Dimensions int `json:"dimensions,omitempty"`
}

// Embedding is one vector of an EmbeddingList. Embedding holds []float32,
// or the base64 text of its little-endian bytes.
type Embedding struct {
	Object    string `json:"object"`
	Index     int    `json:"index"`
	Embedding any    `json:"embedding"`
}

// EmbeddingList is the POST /v1/embeddings answer.
type EmbeddingList struct {
	Object string          `json:"object"` // "list"
	Data   []Embedding     `json:"data"`
	Model  string          `json:"model"`
	Usage  EmbeddingsUsage `json:"usage"`
}

// EmbeddingsUsage counts the input tokens.
type EmbeddingsUsage struct {
	PromptTokens int `json:"prompt_tokens"`
	TotalTokens  int `json:"total_tokens"`
}

// DecodeEmbeddingRequest decodes and validates a POST /v1/embeddings body:
// input is a non-empty string or an array of 1..MaxEmbeddingInputs
// non-empty strings (token arrays are refused), dimensions is a positive
// integer (the worker gives only the model's own size), encoding_format is
// float or base64.
func DecodeEmbeddingRequest(body []byte) (EmbeddingRequest, error) {
	var req EmbeddingRequest
	o, err := parseBody(body)
	if err != nil {
		return req, err
	}
	if req.Model, _, err = o.text("model"); err != nil {
		return req, err
	}
	r, ok := o.raw("input")
	if !ok {
		return req, missing("input", "a string or an array of strings to embed")
	}
	if jsonKind(r) == "a string" {
		s, _, err := o.text("input")
		if err != nil {
			return req, err
		}
		req.Input = []string{s}
	} else {
		items, _, err := o.list("input")
		if err != nil {
			return req, typeError("input", "a string or an array of strings", r)
		}
		if len(items) == 0 || len(items) > MaxEmbeddingInputs {
			return req, Invalid("input", "input must hold 1 to %d strings, got %d", MaxEmbeddingInputs, len(items))
		}
		for i, item := range items {
			if k := jsonKind(item); k == "a number" || k == "an array" {
				return req, Unsupported("input", "token arrays as input are not supported; send strings")
			}
			var s string
			if err := json.Unmarshal(item, &s); err != nil {
				return req, typeError(fmt.Sprintf("input[%d]", i), "a string", item)
			}
			req.Input = append(req.Input, s)
		}
	}
	for i, s := range req.Input {
		if s == "" {
			return req, Invalid(fmt.Sprintf("input[%d]", i), "input strings must not be empty")
		}
	}
	if req.EncodingFormat, _, err = o.text("encoding_format"); err != nil {
		return req, err
	}
	switch req.EncodingFormat {
	case "", "float", "base64":
	default:
		return req, Invalid("encoding_format", `encoding_format must be "float" or "base64", got %q`, req.EncodingFormat)
	}
	d, err := o.integer("dimensions")
	if err != nil {
		return req, err
	}
	if d != nil {
		if *d < 1 || *d > 1<<20 {
			return req, Invalid("dimensions", "dimensions must be a positive number of dimensions, got %d", *d)
		}
		req.Dimensions = int(*d)
	}
	return req, nil
}
