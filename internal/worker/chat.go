package worker

import (
	"net/http"
	"time"

	"github.com/apiary-llm/apiary/internal/engine"
	"github.com/apiary-llm/apiary/internal/openai"
)

// handleChatCompletions serves POST /v1/chat/completions.
func (w *Worker) handleChatCompletions(rw http.ResponseWriter, r *http.Request) error {
	eng, info, err := w.serving()
	if err != nil {
		return err
	}
	body, err := openai.ReadBody(rw, r, w.cfg.MaxBodyBytes)
	if err != nil {
		return err
	}
	req, err := openai.DecodeChatCompletionRequest(body, openai.Limits{})
	if err != nil {
		return err
	}
	if err := w.checkModel(req.Model); err != nil {
		return err
	}
	msgs := make([]engine.Message, len(req.Messages))
	for i, m := range req.Messages {
		msgs[i] = engine.Message{Role: m.Role, Content: m.Content}
	}
	prompt, err := eng.ChatPrompt(msgs)
	if err != nil {
		return err
	}
	j, err := newJob(eng, info, prompt, "messages", req.Sampling)
	if err != nil {
		return err
	}
	f := chatFormat{id: openai.NewChatCompletionID(), created: time.Now().Unix(), model: w.cfg.ModelRef, logprobs: req.Logprobs}
	return w.serveGeneration(rw, r, eng, j, req.Sampling, f, "chat/completions")
}

// chatFormat shapes /v1/chat/completions answers.
type chatFormat struct {
	id       string
	created  int64
	model    string
	logprobs bool
}

func (f chatFormat) chunk(choices []openai.ChatChunkChoice, u *openai.Usage) openai.ChatCompletionChunk {
	return openai.ChatCompletionChunk{ID: f.id, Object: openai.ObjectChatCompletionChunk, Created: f.created,
		Model: f.model, Choices: choices, Usage: u}
}

func (f chatFormat) first(i int) any {
	empty := ""
	return f.chunk([]openai.ChatChunkChoice{{Index: i, Delta: openai.ChatDelta{Role: openai.RoleAssistant, Content: &empty}}}, nil)
}

func (f chatFormat) delta(i int, text string, toks []engine.Token, _ int) any {
	return f.chunk([]openai.ChatChunkChoice{{Index: i, Delta: openai.ChatDelta{Content: &text}, Logprobs: f.logprobsOf(toks)}}, nil)
}

func (f chatFormat) last(i int, finish string) any {
	return f.chunk([]openai.ChatChunkChoice{{Index: i, FinishReason: &finish}}, nil)
}

func (f chatFormat) usage(u *openai.Usage) any {
	return f.chunk([]openai.ChatChunkChoice{}, u)
}

func (f chatFormat) whole(choices []choice, u *openai.Usage) any {
	out := make([]openai.ChatChoice, len(choices))
	for i, c := range choices {
		out[i] = openai.ChatChoice{Index: i, Message: openai.ChatMessage{Role: openai.RoleAssistant, Content: c.text},
			Logprobs: f.logprobsOf(c.toks), FinishReason: c.finish}
	}
	return openai.ChatCompletion{ID: f.id, Object: openai.ObjectChatCompletion, Created: f.created, Model: f.model,
		Choices: out, Usage: u}
}

// logprobsOf is the chat logprobs of toks, nil unless asked for.
func (f chatFormat) logprobsOf(toks []engine.Token) *openai.ChatLogprobs {
	if !f.logprobs {
		return nil
	}
	lp := &openai.ChatLogprobs{Content: make([]openai.TokenLogprob, len(toks)), Refusal: []openai.TokenLogprob{}}
	for i, t := range toks {
		top := make([]openai.TopLogprob, len(t.Top))
		for k, alt := range t.Top {
			top[k] = openai.TopLogprob{Token: string(alt.Piece), Logprob: float64(alt.Logprob), Bytes: byteList(alt.Piece)}
		}
		lp.Content[i] = openai.TokenLogprob{Token: string(t.Piece), Logprob: float64(t.Logprob), Bytes: byteList(t.Piece), TopLogprobs: top}
	}
	return lp
}

// byteList is b as OpenAI's "bytes": a list of integers.
func byteList(b []byte) []int {
	out := make([]int, len(b))
	for i, c := range b {
		out[i] = int(c)
	}
	return out
}
