package worker

import (
	"net/http"
	"time"

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
	j, err := newJob(eng, info, req.Prompt, "prompt", req.Sampling)
	if err != nil {
		return err
	}
	f := completionFormat{id: openai.NewCompletionID(), created: time.Now().Unix(), model: w.cfg.ModelRef}
	return w.serveGeneration(rw, r, eng, j, req.Sampling, f, "completions")
}

// completionFormat shapes /v1/completions answers.
type completionFormat struct {
	id      string
	created int64
	model   string
}

func (f completionFormat) chunk(choices []openai.CompletionChoice, u *openai.Usage) openai.Completion {
	return openai.Completion{ID: f.id, Object: openai.ObjectTextCompletion, Created: f.created, Model: f.model,
		Choices: choices, Usage: u}
}

func (f completionFormat) first() any { return nil }

func (f completionFormat) delta(text string) any {
	return f.chunk([]openai.CompletionChoice{{Text: text}}, nil)
}

func (f completionFormat) last(finish string) any {
	return f.chunk([]openai.CompletionChoice{{FinishReason: &finish}}, nil)
}

func (f completionFormat) usage(u *openai.Usage) any {
	return f.chunk([]openai.CompletionChoice{}, u)
}

func (f completionFormat) whole(text, finish string, u *openai.Usage) any {
	return f.chunk([]openai.CompletionChoice{{Text: text, FinishReason: &finish}}, u)
}
