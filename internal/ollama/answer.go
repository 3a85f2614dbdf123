package ollama

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/apiary-llm/apiary/internal/openai"
	"github.com/apiary-llm/apiary/internal/translate"
)

// Kind is the Ollama endpoint an answer is for.
type Kind int

const (
	KindChat       Kind = iota // /api/chat: message
	KindGenerate               // /api/generate: response
	KindEmbed                  // /api/embed: embeddings
	KindEmbeddings             // /api/embeddings: embedding
)

// chunk is what the translation reads of an OpenAI answer or stream
// chunk (chat completions and completions alike).
type chunk struct {
	Choices []struct {
		Message *struct {
			Content   *string    `json:"content"`
			ToolCalls []callPart `json:"tool_calls"`
		} `json:"message"`
		Delta struct {
			Content   string     `json:"content"`
			ToolCalls []callPart `json:"tool_calls"`
		} `json:"delta"`
		Text         string  `json:"text"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		PromptTokensDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
	Error *struct {
		Message string `json:"message"`
	} `json:"error"`
	Timings *openai.Timings `json:"timings"` // the worker's, when it sends them
}

type callPart struct {
	Index    int `json:"index"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

// Answer builds Ollama's answers to one request from the worker's OpenAI
// answer: Whole for a whole body, Event for each event of a stream.
type Answer struct {
	kind        Kind
	model       string
	start       time.Time
	firstToken  time.Time
	calls       []call
	done        string // done_reason once a choice finished
	prompt, gen int
	load        time.Duration   // waiting for a worker (SetLoad)
	timings     *openai.Timings // the worker's, from a whole answer
}

// SetLoad records how long the request waited for a worker of its model
// (a cold start, a swap, a free slot): Ollama's load_duration.
func (a *Answer) SetLoad(d time.Duration) { a.load = d }

type call struct {
	name string
	args strings.Builder
}

// NewAnswer starts the answer for model (the name the client asked for)
// to a request that arrived at start.
func NewAnswer(kind Kind, model string, start time.Time) *Answer {
	return &Answer{kind: kind, model: model, start: start}
}

// doneReason is Ollama's done_reason for an OpenAI finish_reason.
func doneReason(finish string) string {
	if finish == "length" {
		return "length"
	}
	return "stop"
}

// head is the fields every chat or generate line starts with.
func (a *Answer) head(now time.Time) map[string]any {
	return map[string]any{"model": a.model, "created_at": Timestamp(now)}
}

// text puts s where the endpoint carries text, with calls for chat.
func (a *Answer) text(m map[string]any, s string, calls []map[string]any) {
	if a.kind == KindGenerate {
		m["response"] = s
		return
	}
	msg := map[string]any{"role": "assistant", "content": s}
	if len(calls) > 0 {
		msg["tool_calls"] = calls
	}
	m["message"] = msg
}

// stats adds done, done_reason and the counts and durations: total from
// the request's arrival, prompt evaluation until the first token, and
// generation after it, as the queen saw them.
func (a *Answer) stats(m map[string]any, now time.Time) {
	m["done"] = true
	m["done_reason"] = a.done
	if a.done == "" {
		m["done_reason"] = "stop"
	}
	first := a.firstToken
	if first.IsZero() {
		first = now
	}
	m["total_duration"] = now.Sub(a.start).Nanoseconds()
	m["load_duration"] = a.load.Nanoseconds()
	m["prompt_eval_count"] = a.prompt
	m["eval_count"] = a.gen
	if t := a.timings; t != nil {
		// The worker's own: a whole answer's first token is not seen here.
		m["prompt_eval_duration"] = int64(t.PromptMS * 1e6)
		m["eval_duration"] = int64(t.PredictedMS * 1e6)
		return
	}
	m["prompt_eval_duration"] = max(first.Sub(a.start)-a.load, 0).Nanoseconds()
	m["eval_duration"] = now.Sub(first).Nanoseconds()
}

// toolCalls turns the calls gathered so far into Ollama's, arguments as
// objects.
func (a *Answer) toolCalls() ([]map[string]any, error) {
	var out []map[string]any
	for i, c := range a.calls {
		var args map[string]any
		if s := strings.TrimSpace(c.args.String()); s != "" {
			if err := json.Unmarshal([]byte(s), &args); err != nil {
				return nil, fmt.Errorf("the worker's call %d of %s has arguments that are no JSON object: %w", i, c.name, err)
			}
		}
		if args == nil {
			args = map[string]any{}
		}
		out = append(out, map[string]any{"function": map[string]any{"index": i, "name": c.name, "arguments": args}})
	}
	return out, nil
}

func (a *Answer) addCalls(parts []callPart) {
	for _, p := range parts {
		for len(a.calls) <= p.Index {
			a.calls = append(a.calls, call{})
		}
		if p.Function.Name != "" {
			a.calls[p.Index].name = p.Function.Name
		}
		a.calls[p.Index].args.WriteString(p.Function.Arguments)
	}
}

// Whole is the answer to a request that was not streamed, from the
// worker's whole OpenAI answer.
func (a *Answer) Whole(data []byte, now time.Time) ([]byte, error) {
	switch a.kind {
	case KindEmbed, KindEmbeddings:
		return a.embeddings(data, now)
	}
	var c chunk
	if err := json.Unmarshal(data, &c); err != nil || len(c.Choices) == 0 {
		return nil, fmt.Errorf("the worker's answer is no OpenAI completion")
	}
	ch := c.Choices[0]
	text := ch.Text
	if ch.Message != nil {
		if ch.Message.Content != nil {
			text = *ch.Message.Content
		}
		a.addCalls(ch.Message.ToolCalls)
	}
	if ch.FinishReason != nil {
		a.done = doneReason(*ch.FinishReason)
	}
	if c.Usage != nil {
		// prompt_eval_count counts the tokens evaluated: not those
		// the worker found in its cache.
		a.prompt, a.gen = c.Usage.PromptTokens, c.Usage.CompletionTokens
		if d := c.Usage.PromptTokensDetails; d != nil {
			a.prompt -= d.CachedTokens
		}
	}
	a.timings = c.Timings
	calls, err := a.toolCalls()
	if err != nil {
		return nil, err
	}
	m := a.head(now)
	a.text(m, text, calls)
	a.stats(m, now)
	return json.Marshal(m)
}

func (a *Answer) embeddings(data []byte, now time.Time) ([]byte, error) {
	var e struct {
		Data []struct {
			Index     int       `json:"index"`
			Embedding []float64 `json:"embedding"`
		} `json:"data"`
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(data, &e); err != nil {
		return nil, fmt.Errorf("the worker's answer is no OpenAI embedding list")
	}
	slices.SortFunc(e.Data, func(x, y struct {
		Index     int       `json:"index"`
		Embedding []float64 `json:"embedding"`
	}) int {
		return x.Index - y.Index
	})
	if a.kind == KindEmbeddings {
		if len(e.Data) != 1 {
			return nil, fmt.Errorf("the worker answered %d embeddings for one prompt", len(e.Data))
		}
		return json.Marshal(map[string]any{"embedding": e.Data[0].Embedding})
	}
	vecs := make([][]float64, len(e.Data))
	for i, d := range e.Data {
		vecs[i] = d.Embedding
	}
	return json.Marshal(map[string]any{"model": a.model, "embeddings": vecs, "total_duration": now.Sub(a.start).Nanoseconds(),
		"load_duration": 0, "prompt_eval_count": e.Usage.PromptTokens})
}

// Event turns one SSE event of the worker's stream into the NDJSON
// lines (each without its newline) it makes; last is true for the line
// that ends the stream (the done line, or an error).
func (a *Answer) Event(data []byte, now time.Time) (lines [][]byte, last bool, err error) {
	if len(data) == 0 {
		return nil, false, nil
	}
	if string(data) == "[DONE]" {
		m := a.head(now)
		calls, err := a.toolCalls()
		if err != nil {
			return nil, true, err
		}
		if len(calls) > 0 {
			// Ollama sends the calls in a line of their own before the end.
			cm := a.head(now)
			a.text(cm, "", calls)
			cm["done"] = false
			b, _ := json.Marshal(cm)
			lines = append(lines, b)
		}
		a.text(m, "", nil)
		a.stats(m, now)
		b, err := json.Marshal(m)
		return append(lines, b), true, err
	}
	var c chunk
	if err := json.Unmarshal(data, &c); err != nil {
		return nil, true, fmt.Errorf("the worker's stream sent an event that is no JSON: %w", err)
	}
	if c.Error != nil {
		b, _ := json.Marshal(Error{Error: c.Error.Message})
		return [][]byte{b}, true, nil
	}
	if c.Usage != nil {
		// prompt_eval_count counts the tokens evaluated: not those
		// the worker found in its cache.
		a.prompt, a.gen = c.Usage.PromptTokens, c.Usage.CompletionTokens
		if d := c.Usage.PromptTokensDetails; d != nil {
			a.prompt -= d.CachedTokens
		}
	}
	if len(c.Choices) == 0 {
		return nil, false, nil
	}
	ch := c.Choices[0]
	a.addCalls(ch.Delta.ToolCalls)
	if ch.FinishReason != nil {
		a.done = doneReason(*ch.FinishReason)
	}
	text := ch.Delta.Content + ch.Text
	if text == "" {
		return nil, false, nil
	}
	if a.firstToken.IsZero() {
		a.firstToken = now
	}
	m := a.head(now)
	a.text(m, text, nil)
	m["done"] = false
	b, err := json.Marshal(m)
	return [][]byte{b}, false, err
}

// Dialect frames the translation for the client: NDJSON lines, errors
// as {"error": "…"}.
var Dialect = translate.Dialect{
	ContentType: "application/x-ndjson",
	Frame:       func(line []byte) []byte { return append(line, '\n') },
	ErrorEvent: func(msg string) []byte {
		b, _ := json.Marshal(Error{Error: msg})
		return append(b, '\n')
	},
	HeldError: func(w http.ResponseWriter, status int, held []byte) {
		var e openai.ErrorResponse
		msg := strings.TrimSpace(string(held))
		if json.Unmarshal(held, &e) == nil && e.Error.Message != "" {
			msg = e.Error.Message
		}
		openai.WriteJSON(w, status, Error{Error: msg})
	},
}

// Done is the answer to a load or an unload (reason "load" or "unload")
// of model, for /api/chat or /api/generate: done at once, with nothing
// generated.
func Done(kind Kind, model, reason string, now time.Time) ([]byte, error) {
	a := &Answer{kind: kind, model: model}
	m := a.head(now)
	a.text(m, "", nil)
	m["done"], m["done_reason"] = true, reason
	return json.Marshal(m)
}
