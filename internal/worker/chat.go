package worker

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/apiary-llm/apiary/internal/chat"
	"github.com/apiary-llm/apiary/internal/engine"
	"github.com/apiary-llm/apiary/internal/openai"
)

// chatBodyLimit bounds the body of a chat (chat completions, messages,
// responses): Config.MaxBodyBytes, and for a model that reads images at
// least openai.MaxImageBodyBytes (a picture, base64, in the body).
func (w *Worker) chatBodyLimit(info engine.ModelInfo) int64 {
	if info.Vision {
		return max(w.cfg.MaxBodyBytes, openai.MaxImageBodyBytes)
	}
	return w.cfg.MaxBodyBytes
}

// handleChatCompletions serves POST /v1/chat/completions.
func (w *Worker) handleChatCompletions(rw http.ResponseWriter, r *http.Request) error {
	eng, info, err := w.serving()
	if err != nil {
		return err
	}
	body, err := openai.ReadBody(rw, r, w.chatBodyLimit(info))
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
	prompt, syn, err := w.chatPrompt(eng, info, req)
	if err != nil {
		return err
	}
	j, err := newJob(eng, info, prompt, "messages", req.Sampling, openai.Images(req.Messages))
	if err != nil {
		return err
	}
	defer j.release()
	if err := forceToolCall(eng, &j, req, syn); err != nil {
		return err
	}
	f := chatFormat{id: openai.NewChatCompletionID(), created: time.Now().Unix(), model: w.answerModel(r), logprobs: req.Logprobs}
	if req.ToolChoice.Mode != "" && req.ToolChoice.Mode != openai.ToolChoiceNone {
		f.tools = &toolStream{syn: syn, split: map[int]*chat.Splitter{}}
	}
	return w.serveGeneration(rw, r, eng, j, req.Sampling, f, "chat/completions")
}

// forceToolCall constrains j to a call of the tools a forced tool_choice
// allows, in the model family's syntax, with a grammar made from their
// parameter schemas.
func forceToolCall(eng engine.Engine, j *job, req openai.ChatCompletionRequest, syn chat.Syntax) error {
	forced := req.ForcedTools()
	if forced == nil {
		return nil
	}
	schema, wrap := syn.Constraint(chatTools(forced), req.Parallel())
	j.req.JSONSchema = schema
	j.req.Wrap = &engine.GrammarWrap{Prefix: wrap.Prefix, Suffix: wrap.Suffix, Separator: wrap.Separator, Repeat: wrap.Repeat}
	if err := eng.Check(j.req); err != nil {
		if errors.Is(err, engine.ErrGrammar) {
			return &openai.Error{Status: http.StatusBadRequest, Code: openai.CodeInvalidValue, Param: "tools",
				Message: fmt.Sprintf("the tools' parameters cannot be enforced: %v", err), Err: errors.Join(openai.ErrInvalidRequest, err)}
		}
		return err
	}
	return nil
}

// chatFormat shapes /v1/chat/completions answers.
type chatFormat struct {
	openAIStream
	id       string
	created  int64
	model    string
	logprobs bool
	tools    *toolStream // nil unless the answer may call tools
}

// toolStream reads tool calls out of the choices being streamed, one
// splitter a choice (choices may stream at once).
type toolStream struct {
	syn   chat.Syntax
	split map[int]*chat.Splitter
}

func (f chatFormat) chunk(choices []openai.ChatChunkChoice, u *openai.Usage) openai.ChatCompletionChunk {
	return openai.ChatCompletionChunk{ID: f.id, Object: openai.ObjectChatCompletionChunk, Created: f.created,
		Model: f.model, Choices: choices, Usage: u}
}

func (f chatFormat) first(i int) any {
	if f.tools != nil {
		f.tools.split[i] = chat.NewSplitter(f.tools.syn)
	}
	empty := ""
	return f.chunk([]openai.ChatChunkChoice{{Index: i, Delta: openai.ChatDelta{Role: openai.RoleAssistant, Content: &empty}}}, nil)
}

func (f chatFormat) delta(i int, text string, toks []engine.Token, _ int) any {
	if f.tools == nil {
		return f.chunk([]openai.ChatChunkChoice{{Index: i, Delta: openai.ChatDelta{Content: &text}, Logprobs: f.logprobsOf(toks)}}, nil)
	}
	events := f.pieces(i, f.tools.split[i].Feed(text))
	if len(events) == 0 && f.logprobs {
		empty := ""
		events = append(events, f.chunk([]openai.ChatChunkChoice{{Index: i, Delta: openai.ChatDelta{Content: &empty}, Logprobs: f.logprobsOf(toks)}}, nil))
	} else if len(events) > 0 && f.logprobs {
		c := events[0].(openai.ChatCompletionChunk)
		c.Choices[0].Logprobs = f.logprobsOf(toks)
	}
	return events
}

// pieces turns what the splitter let through into chunks: content, and
// each call as OpenAI streams one — a chunk with its index, id, type and
// name (no arguments yet), then chunks with fragments of its arguments.
func (f chatFormat) pieces(i int, ps []chat.Piece) []any {
	events := make([]any, 0, len(ps))
	for _, p := range ps {
		var d openai.ChatDelta
		switch {
		case !p.Call:
			content := p.Content
			d.Content = &content
		case p.Name != "":
			k := p.Index
			d.ToolCalls = []openai.ToolCall{{Index: &k, ID: openai.NewToolCallID(), Type: "function", Function: openai.FunctionCall{Name: p.Name}}}
		default:
			k := p.Index
			d.ToolCalls = []openai.ToolCall{{Index: &k, Function: openai.FunctionCall{Arguments: p.Args}}}
		}
		events = append(events, f.chunk([]openai.ChatChunkChoice{{Index: i, Delta: d}}, nil))
	}
	return events
}

// last ends choice i: with tools, what was held back goes out first; the
// finish reason is tool_calls when the answer was calls, length when it
// was cut off, calls or not (a call cut off is sent as far as it went,
// its arguments unfinished: the client must not run it).
func (f chatFormat) last(i int, o outcome) any {
	finish := o.FinishReason
	var events []any
	if f.tools != nil {
		events = f.pieces(i, closeSplitter(f.tools.split[i], finish))
		if f.tools.split[i].Called() && finish != openai.FinishLength {
			finish = openai.FinishToolCalls
		}
	}
	return append(events, f.chunk([]openai.ChatChunkChoice{{Index: i, FinishReason: &finish}}, nil))
}

// closeSplitter ends an answer that finished for reason.
func closeSplitter(sp *chat.Splitter, reason string) []chat.Piece {
	if reason == openai.FinishLength {
		return sp.CloseCut()
	}
	return sp.Close()
}

func (f chatFormat) usage(u *openai.Usage) any {
	return f.chunk([]openai.ChatChunkChoice{}, u)
}

func (f chatFormat) whole(choices []choice, u *openai.Usage) any {
	out := make([]openai.ChatChoice, len(choices))
	for i, c := range choices {
		msg := openai.ChatMessage{Role: openai.RoleAssistant, Content: c.text}
		finish := c.finish
		if f.tools != nil {
			// The whole answer is what its stream would add up to.
			sp := chat.NewSplitter(f.tools.syn)
			ps := append(sp.Feed(c.text), closeSplitter(sp, finish)...)
			if sp.Called() {
				var content strings.Builder
				for _, p := range ps {
					switch {
					case !p.Call:
						content.WriteString(p.Content)
					case p.Name != "":
						msg.ToolCalls = append(msg.ToolCalls, openai.ToolCall{ID: openai.NewToolCallID(), Type: "function",
							Function: openai.FunctionCall{Name: p.Name}})
					default:
						msg.ToolCalls[len(msg.ToolCalls)-1].Function.Arguments += p.Args
					}
				}
				msg.Content = strings.TrimSpace(content.String())
				if finish != openai.FinishLength {
					finish = openai.FinishToolCalls
				}
			}
		}
		out[i] = openai.ChatChoice{Index: i, Message: msg, Logprobs: f.logprobsOf(c.toks), FinishReason: finish}
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
