package benchmark

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"strings"
	"time"
)

// ErrStream means a completion stream broke the protocol: no chunk, no
// usage, or a body that is not server-sent events of JSON.
var ErrStream = errors.New("bad completion stream")

// Request is one streamed completion request.
type Request struct {
	Prompt    string
	MaxTokens int
	// Extra fields merged into the body, for one server's extensions
	// (llama-server's "cache_prompt").
	Extra map[string]any
}

// body is the JSON body of r: greedy sampling, ignore_eos, streamed with
// usage.
func (r Request) body() ([]byte, error) {
	m := map[string]any{
		"prompt":         r.Prompt,
		"max_tokens":     r.MaxTokens,
		"temperature":    0,
		"ignore_eos":     true,
		"stream":         true,
		"stream_options": map[string]any{"include_usage": true},
	}
	maps.Copy(m, r.Extra)
	return json.Marshal(m)
}

// Timings are llama-server's own timings, sent with its last chunk.
type Timings struct {
	PromptN     int     `json:"prompt_n"`
	PromptMS    float64 `json:"prompt_ms"`
	PredictedN  int     `json:"predicted_n"`
	PredictedMS float64 `json:"predicted_ms"`
}

// PromptPerSecond is the server's prompt processing rate.
func (t Timings) PromptPerSecond() float64 { return rate(t.PromptN, t.PromptMS/1e3) }

// PredictedPerSecond is the server's generation rate.
func (t Timings) PredictedPerSecond() float64 { return rate(t.PredictedN, t.PredictedMS/1e3) }

// Sample is what one completion request measured.
type Sample struct {
	// FirstChunk is the time from sending the request to the first chunk
	// that carries text or a finish reason.
	FirstChunk time.Duration
	// Decode is the time from the first chunk with text to the last chunk.
	Decode time.Duration
	// Total is the time from sending the request to the end of the stream.
	Total            time.Duration
	PromptTokens     int
	CompletionTokens int
	Chunks           int    // chunks that carried text
	Text             string // the completion
	Server           *Timings
}

// GenerationRate is tokens per second after the first: the decode speed.
func (s Sample) GenerationRate() float64 { return rate(s.CompletionTokens-1, s.Decode.Seconds()) }

// PromptRate is prompt tokens per second up to the first chunk.
func (s Sample) PromptRate() float64 { return rate(s.PromptTokens, s.FirstChunk.Seconds()) }

func rate(n int, secs float64) float64 {
	if n <= 0 || secs <= 0 {
		return 0
	}
	return float64(n) / secs
}

// chunk is the part of a stream event that is read.
type chunk struct {
	Choices []struct {
		Text         string  `json:"text"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
	Timings *Timings `json:"timings"`
	Error   *struct {
		Message string `json:"message"`
	} `json:"error"`
}

// Complete sends r to baseURL's /v1/completions and measures the stream.
func Complete(ctx context.Context, client *http.Client, baseURL string, r Request) (Sample, error) {
	body, err := r.body()
	if err != nil {
		return Sample{}, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(baseURL, "/")+"/v1/completions", bytes.NewReader(body))
	if err != nil {
		return Sample{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		return Sample{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return Sample{}, fmt.Errorf("%s answered %s: %s", baseURL, resp.Status, bytes.TrimSpace(msg))
	}

	var (
		s                    Sample
		text                 strings.Builder
		firstText, lastChunk time.Time
		gotUsage             bool
	)
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data:")
		if !ok {
			continue // blank separators, comments, event names
		}
		data = strings.TrimSpace(data)
		if data == "[DONE]" {
			break
		}
		now := time.Now()
		var c chunk
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			return Sample{}, fmt.Errorf("%w: %v in %q", ErrStream, err, data)
		}
		if c.Error != nil {
			return Sample{}, fmt.Errorf("%s failed mid-stream: %s", baseURL, c.Error.Message)
		}
		for _, ch := range c.Choices {
			if ch.Text == "" && ch.FinishReason == nil {
				continue
			}
			if s.FirstChunk == 0 {
				s.FirstChunk = now.Sub(start)
			}
			if ch.Text != "" {
				if firstText.IsZero() {
					firstText = now
				}
				s.Chunks++
				text.WriteString(ch.Text)
			}
			lastChunk = now
		}
		if c.Usage != nil {
			gotUsage = true
			s.PromptTokens = c.Usage.PromptTokens
			s.CompletionTokens = c.Usage.CompletionTokens
		}
		if c.Timings != nil {
			t := *c.Timings
			s.Server = &t
		}
	}
	if err := sc.Err(); err != nil {
		return Sample{}, fmt.Errorf("reading the stream of %s: %w", baseURL, err)
	}
	s.Total = time.Since(start)
	if s.FirstChunk == 0 {
		return Sample{}, fmt.Errorf("%w: %s sent no chunk with text or a finish reason", ErrStream, baseURL)
	}
	if !gotUsage {
		return Sample{}, fmt.Errorf("%w: %s sent no usage (stream_options.include_usage)", ErrStream, baseURL)
	}
	if !firstText.IsZero() {
		s.Decode = lastChunk.Sub(firstText)
	}
	s.Text = text.String()
	return s, nil
}
