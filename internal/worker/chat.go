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
	f := chatFormat{id: openai.NewChatCompletionID(), created: time.Now().Unix(), model: w.cfg.ModelRef}
	return w.serveGeneration(rw, r, eng, j, req.Sampling, f, "chat/completions")
}

// chatFormat shapes /v1/chat/completions answers.
type chatFormat struct {
	id      string
	created int64
	model   string
}

func (f chatFormat) chunk(choices []openai.ChatChunkChoice, u *openai.Usage) openai.ChatCompletionChunk {
	return openai.ChatCompletionChunk{ID: f.id, Object: openai.ObjectChatCompletionChunk, Created: f.created,
		Model: f.model, Choices: choices, Usage: u}
}

func (f chatFormat) first() any {
	empty := ""
	return f.chunk([]openai.ChatChunkChoice{{Delta: openai.ChatDelta{Role: openai.RoleAssistant, Content: &empty}}}, nil)
}

func (f chatFormat) delta(text string) any {
	return f.chunk([]openai.ChatChunkChoice{{Delta: openai.ChatDelta{Content: &text}}}, nil)
}

func (f chatFormat) last(finish string) any {
	return f.chunk([]openai.ChatChunkChoice{{FinishReason: &finish}}, nil)
}

func (f chatFormat) usage(u *openai.Usage) any {
	return f.chunk([]openai.ChatChunkChoice{}, u)
}

func (f chatFormat) whole(text, finish string, u *openai.Usage) any {
	return openai.ChatCompletion{ID: f.id, Object: openai.ObjectChatCompletion, Created: f.created, Model: f.model,
		Choices: []openai.ChatChoice{{Message: openai.ChatMessage{Role: openai.RoleAssistant, Content: text},
			FinishReason: finish}}, Usage: u}
}
