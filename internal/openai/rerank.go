package openai

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"
)

// RerankPaths are the paths of the rerank endpoint, as llama.cpp's server
// names them (Jina's and Cohere's APIs are POST /v1/rerank).
var RerankPaths = []string{"/v1/rerank", "/rerank", "/v1/reranking"}

// MaxRerankDocuments bounds the documents of one rerank request, as
// Cohere's API does.
const MaxRerankDocuments = 1000

// MaxRerankBodyBytes bounds a rerank request's body where the other
// endpoints' bound is lower: documents are long texts.
const MaxRerankBodyBytes = MaxEmbeddingBodyBytes

// RerankRequest is a decoded, validated POST /v1/rerank body, as Jina's
// and Cohere's rerank APIs (and llama.cpp's server) take it.
type RerankRequest struct {
	Model string `json:"model"`
	Query string `json:"query"`
	// Documents are strings, or objects whose "text" is the document
	// (Jina, Cohere v1).
	Documents []string `json:"documents"`
	// TopN, when not 0, is how many results to answer, the best first;
	// 0: all.
	TopN int `json:"top_n,omitempty"`
	// ReturnDocuments puts each result's document text in its answer.
	ReturnDocuments bool `json:"return_documents,omitempty"`
}

// RerankDocument is a result's document, when asked for.
type RerankDocument struct {
	Text string `json:"text"`
}

// RerankResult is one document's score; Index is its place in the
// request's documents.
type RerankResult struct {
	Index          int             `json:"index"`
	RelevanceScore float64         `json:"relevance_score"`
	Document       *RerankDocument `json:"document,omitempty"`
}

// RerankResponse is the POST /v1/rerank answer, as llama.cpp's server
// writes it: results sorted by relevance_score, the highest first.
type RerankResponse struct {
	Model   string          `json:"model"`
	Object  string          `json:"object"` // "list"
	Results []RerankResult  `json:"results"`
	Usage   EmbeddingsUsage `json:"usage"`
}

// Ranked sorts results by relevance_score, the highest first (ties keep
// the documents' order), and keeps the first topN (all when topN is 0 or
// more than there are).
func Ranked(results []RerankResult, topN int) []RerankResult {
	sort.SliceStable(results, func(i, j int) bool { return results[i].RelevanceScore > results[j].RelevanceScore })
	if topN > 0 && topN < len(results) {
		results = results[:topN]
	}
	return results
}

// DecodeRerankRequest decodes and validates a POST /v1/rerank body: query
// is a non-empty string; documents an array of 1..MaxRerankDocuments
// non-empty strings or {"text": string} objects; top_n a positive
// integer; return_documents a boolean.
func DecodeRerankRequest(body []byte) (RerankRequest, error) {
	var req RerankRequest
	o, err := parseBody(body)
	if err != nil {
		return req, err
	}
	if req.Model, _, err = o.text("model"); err != nil {
		return req, err
	}
	q, ok, err := o.text("query")
	switch {
	case err != nil:
		return req, err
	case !ok:
		return req, missing("query", "the text to rank the documents by")
	case q == "":
		return req, Invalid("query", "query must not be empty")
	}
	req.Query = q
	items, ok, err := o.list("documents")
	switch {
	case err != nil:
		return req, err
	case !ok:
		return req, missing("documents", "an array of the texts to rank")
	case len(items) == 0 || len(items) > MaxRerankDocuments:
		return req, Invalid("documents", "documents must hold 1 to %d texts, got %d", MaxRerankDocuments, len(items))
	}
	for i, item := range items {
		param := fmt.Sprintf("documents[%d]", i)
		var s string
		if jsonKind(item) == "an object" {
			var members map[string]json.RawMessage
			if err := json.Unmarshal(item, &members); err != nil {
				return req, typeError(param, "a string or an object with a text", item)
			}
			d := object{members: members, prefix: param + "."}
			t, ok, err := d.text("text")
			if err != nil {
				return req, err
			}
			if !ok {
				return req, missing(param+".text", "the document's text")
			}
			s = t
		} else if err := json.Unmarshal(item, &s); err != nil {
			return req, typeError(param, "a string or an object with a text", item)
		}
		if s == "" {
			return req, Invalid(param, "documents must not be empty")
		}
		req.Documents = append(req.Documents, s)
	}
	n, err := o.integer("top_n")
	if err != nil {
		return req, err
	}
	if n != nil {
		if *n < 1 {
			return req, Invalid("top_n", "top_n must be a positive number of results, got %d", *n)
		}
		req.TopN = int(min(*n, MaxRerankDocuments))
	}
	if req.ReturnDocuments, err = o.boolean("return_documents"); err != nil {
		return req, err
	}
	return req, nil
}

// CodeNotReranker is the code of a rerank asked of a model that is no
// reranker.
const CodeNotReranker = "model_not_reranker"

// NotReranker is the 400 of a rerank asked of model, which is no
// reranker (its GGUF names no rank pooling); err is the cause.
func NotReranker(model string, err error) *Error {
	return &Error{Status: http.StatusBadRequest, Code: CodeNotReranker, Param: "model",
		Message: fmt.Sprintf("model %q is not a reranker (its GGUF names no rank pooling, as a reranker's such as Qwen3-Reranker's or bge-reranker's does); send /v1/rerank to a reranker", model),
		Err:     errors.Join(ErrInvalidRequest, err)}
}
