package routing

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/openai"
)

// A body's limit depends on the endpoint it goes to and, for a chat, on
// its model: a chat may carry pictures inline (base64 data URIs), and a
// worker of a model that sees takes chat bodies up to
// openai.MaxImageBodyBytes. So a body is read up to the most its
// endpoint takes of any model (readBody), and once it is decoded and its
// model is known, checked against what that model takes (checkBodySize,
// in serveBody): a model that takes no images keeps MaxBodyBytes.

// bodyLimit is the largest body a request to path (the worker's
// endpoint it is relayed to) may have, for a model that reads images
// (sees) or not, and the words that say why.
func (s *Service) bodyLimit(path string, sees bool) (int64, string) {
	own := s.cfg.MaxBodyBytes
	switch path {
	case "/v1/embeddings":
		return max(own, openai.MaxEmbeddingBodyBytes), "the limit of embeddings"
	case "/v1/rerank":
		return max(own, openai.MaxRerankBodyBytes), "the limit of a rerank"
	case "/v1/chat/completions", "/v1/messages", "/v1/messages/count_tokens":
		switch {
		case own >= openai.MaxImageBodyBytes:
			return own, "the limit"
		case sees:
			return openai.MaxImageBodyBytes, "the limit with images"
		}
		return own, "the limit of a model that takes no images"
	}
	return own, "the limit"
}

// readBody reads the body of a request to path up to the most any
// model takes there (bodyLimit of a model that sees); larger is 413
// saying that limit.
func (s *Service) readBody(w http.ResponseWriter, r *http.Request, path string) ([]byte, error) {
	limit, why := s.bodyLimit(path, true)
	body, err := openai.ReadBody(w, r, limit)
	if errors.Is(err, openai.ErrBodyTooLarge) {
		return nil, bodyTooLarge(limit, why, err)
	}
	return body, err
}

// checkBodySize refuses a body of sent bytes (as the client sent it) to
// path that is larger than model (a ref) takes there: 413 saying the
// limit and why.
func (s *Service) checkBodySize(path, model string, sent int64) error {
	if sent <= s.cfg.MaxBodyBytes {
		return nil // the least limit of every path
	}
	if limit, why := s.bodyLimit(path, s.seesImages(model)); sent > limit {
		return bodyTooLarge(limit, why, nil)
	}
	return nil
}

// seesImages says whether model (a ref) reads images: a pool lists it
// with a projector beside it, or the config gives it one (mmproj).
func (s *Service) seesImages(model string) bool {
	m, _ := s.catalog.lookup(s.servable(), model)
	m.Ref = model
	return s.hasProjector(m)
}

// hasProjector says whether m has a vision projector, as a hive lists it
// or the config gives it.
func (s *Service) hasProjector(m api.Model) bool {
	mc, ok := s.modelFile(m.Ref)
	return m.Vision || ok && mc.MMProj != ""
}

// bodyTooLarge is the 413 of a body over limit, with why.
func bodyTooLarge(limit int64, why string, err error) error {
	return &openai.Error{Status: http.StatusRequestEntityTooLarge, Code: openai.CodeBodyTooLarge,
		Message: fmt.Sprintf("request body is larger than %s, %s", sizeText(limit), why), Err: errors.Join(openai.ErrBodyTooLarge, err)}
}

// sizeText writes a limit as an operator sets it: whole MiB or KiB as
// such (32 MiB), else in bytes.
func sizeText(n int64) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d bytes", n)
}
