package benchmark

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
)

// Words returns n pseudo-random lowercase words separated by spaces; the
// same seed gives the same words, different seeds differ from the first
// word on, so prompts of different rounds share no prefix a cache could use.
func Words(seed uint64, n int) string {
	rng := rand.New(rand.NewPCG(seed, 0x62656e6368)) // "bench"
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(' ')
		}
		for range 2 + rng.IntN(7) {
			b.WriteByte(byte('a' + rng.IntN(26)))
		}
	}
	return b.String()
}

// Tokenizer counts the tokens of a text as a server's model does.
type Tokenizer func(ctx context.Context, text string) (int, error)

// LlamaServerTokenizer counts tokens with llama-server's POST /tokenize
// (without special tokens: the BOS a completion adds is not counted).
func LlamaServerTokenizer(client *http.Client, baseURL string) Tokenizer {
	return func(ctx context.Context, text string) (int, error) {
		body, err := json.Marshal(map[string]any{"content": text, "add_special": false})
		if err != nil {
			return 0, err
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, baseURL+"/tokenize", bytes.NewReader(body))
		if err != nil {
			return 0, err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			return 0, fmt.Errorf("tokenize: %w", err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			return 0, fmt.Errorf("tokenize: %s: %s", resp.Status, msg)
		}
		var out struct {
			Tokens []json.RawMessage `json:"tokens"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
			return 0, fmt.Errorf("tokenize: %w", err)
		}
		return len(out.Tokens), nil
	}
}

// PromptOfTokens returns a prompt of words from seed that tok counts as at
// most n tokens, and as close to n as trimming characters gets it.
func PromptOfTokens(ctx context.Context, tok Tokenizer, seed uint64, n int) (string, int, error) {
	if n <= 0 {
		return "", 0, nil
	}
	// Grow the word count until the text has at least n tokens.
	words := n/2 + 1
	var text string
	var count int
	for {
		text = Words(seed, words)
		var err error
		if count, err = tok(ctx, text); err != nil {
			return "", 0, err
		}
		if count >= n {
			break
		}
		words += max(1, (n-count)/2)
	}
	// Trim characters from the end until it has at most n. Token counts
	// fall by about one a character, so bisect on the length.
	lo, hi := 0, len(text) // text[:lo] fits (0 tokens); text[:hi] may not
	if count <= n {
		return text, count, nil
	}
	best := 0
	for lo < hi-1 {
		mid := (lo + hi) / 2
		c, err := tok(ctx, strings.TrimRight(text[:mid], " "))
		if err != nil {
			return "", 0, err
		}
		if c <= n {
			lo, best = mid, c
		} else {
			hi = mid
		}
	}
	return strings.TrimRight(text[:lo], " "), best, nil
}
