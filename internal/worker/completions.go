package worker

import (
	"net/http"
	"time"

	"github.com/apiary-llm/apiary/internal/engine"
	"github.com/apiary-llm/apiary/internal/openai"
)

// handleCompletions serves POST /v1/completions.
func (w *Worker) handleCompletions(rw http.ResponseWriter, r *http.Request) error {
	eng, info, err := w.serving()
	if err != nil {
		return err
	}
	body, err := openai.ReadBody(rw, r, w.cfg.MaxBodyBytes)
	if err != nil {
		return err
	}
	req, err := openai.DecodeCompletionRequest(body, openai.Limits{})
	if err != nil {
		return err
	}
	if err := w.checkModel(req.Model); err != nil {
		return err
	}
	j, err := newJob(eng, info, req.Prompt, "prompt", req.Sampling, nil)
	if err != nil {
		return err
	}
	f := completionFormat{id: openai.NewCompletionID(), created: time.Now().Unix(), model: w.answerModel(r),
		logprobs: req.Logprobs, top: req.TopLogprobs}
	return w.serveGeneration(rw, r, eng, j, req.Sampling, f, "completions")
}

// completionFormat shapes /v1/completions answers.
type completionFormat struct {
	openAIStream
	id       string
	created  int64
	model    string
	logprobs bool
	top      int
}

func (f completionFormat) chunk(choices []openai.CompletionChoice, u *openai.Usage) openai.Completion {
	return openai.Completion{ID: f.id, Object: openai.ObjectTextCompletion, Created: f.created, Model: f.model,
		Choices: choices, Usage: u}
}

func (f completionFormat) first(int) any { return nil }

func (f completionFormat) delta(i int, text string, toks []engine.Token, offset int) any {
	return f.chunk([]openai.CompletionChoice{{Index: i, Text: text, Logprobs: f.logprobsOf(toks, offset)}}, nil)
}

func (f completionFormat) last(i int, o outcome) any {
	finish := o.FinishReason
	return f.chunk([]openai.CompletionChoice{{Index: i, FinishReason: &finish}}, nil)
}

func (f completionFormat) usage(u *openai.Usage) any {
	return f.chunk([]openai.CompletionChoice{}, u)
}

func (f completionFormat) whole(choices []choice, u *openai.Usage) any {
	out := make([]openai.CompletionChoice, len(choices))
	for i, c := range choices {
		out[i] = openai.CompletionChoice{Index: i, Text: c.text, Logprobs: f.logprobsOf(c.toks, 0), FinishReason: &c.finish}
	}
	return f.chunk(out, u)
}

// logprobsOf is the legacy logprobs of toks, whose bytes begin offset
// bytes into the choice's; nil unless asked for. text_offset counts the
// tokens' raw bytes, which is the text's offset unless bytes that are not
// UTF-8 were replaced by U+FFFD.
func (f completionFormat) logprobsOf(toks []engine.Token, offset int) *openai.CompletionLogprobs {
	if !f.logprobs {
		return nil
	}
	lp := &openai.CompletionLogprobs{Tokens: make([]string, len(toks)), TokenLogprobs: make([]float64, len(toks)),
		TopLogprobs: make([]map[string]float64, len(toks)), TextOffset: make([]int, len(toks))}
	for i, t := range toks {
		lp.Tokens[i], lp.TokenLogprobs[i], lp.TextOffset[i] = string(t.Piece), float64(t.Logprob), offset
		offset += len(t.Piece)
		if f.top == 0 {
			continue
		}
		top := make(map[string]float64, len(t.Top))
		for _, alt := range t.Top {
			if _, ok := top[string(alt.Piece)]; !ok { // best first: the first of a text is the likeliest
				top[string(alt.Piece)] = float64(alt.Logprob)
			}
		}
		lp.TopLogprobs[i] = top
	}
	return lp
}
