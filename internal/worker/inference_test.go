package worker

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/apiary-llm/apiary/internal/engine"
	"github.com/apiary-llm/apiary/internal/openai"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

func TestCompletionNotStreamed(t *testing.T) {
	eng := newFakeEngine("Hel", "lo", " world")
	r := startWorker(t, testConfig(t), eng)

	var got openai.Completion
	status, _ := r.postJSON(t, "/v1/completions", `{"model":"tiny","prompt":"hi","max_tokens":10}`, &got)
	if status != http.StatusOK {
		t.Fatalf("status %d", status)
	}
	stop := "stop"
	want := openai.Completion{Object: "text_completion", Model: "tiny",
		Choices: []openai.CompletionChoice{{Text: "Hello world", FinishReason: &stop}},
		Usage:   openai.NewCachedUsage(3, 0, 3)}
	if diff := cmp.Diff(want, got, cmpopts.IgnoreFields(openai.Completion{}, "ID", "Created", "Timings")); diff != "" {
		t.Errorf("response mismatch (-want +got):\n%s", diff)
	}
	if got.Timings == nil || got.Timings.PredictedN != 3 || got.Timings.PromptN != 3 {
		t.Errorf("timings %+v, want 3 prompt and 3 predicted tokens", got.Timings)
	}
	if !strings.HasPrefix(got.ID, "cmpl-") || got.Created == 0 {
		t.Errorf("id %q created %d", got.ID, got.Created)
	}
}

func TestCompletionMaxTokensGivesLength(t *testing.T) {
	eng := newFakeEngine("a", "b", "c", "d")
	r := startWorker(t, testConfig(t), eng)
	var got openai.Completion
	r.postJSON(t, "/v1/completions", `{"prompt":"x","max_tokens":2}`, &got)
	if got.Choices[0].Text != "ab" || *got.Choices[0].FinishReason != "length" || got.Usage.CompletionTokens != 2 {
		t.Errorf("got %+v %q usage %+v", got.Choices[0], *got.Choices[0].FinishReason, got.Usage)
	}
}

// TestCompletionStreamsEachToken checks every token is its own SSE event,
// sent before the engine samples the next one.
func TestCompletionStreamsEachToken(t *testing.T) {
	eng := newFakeEngine("Hel", "lo", "!")
	eng.gate = make(chan struct{})
	r := startWorker(t, testConfig(t), eng)

	res := r.post(t, t.Context(), "/v1/completions",
		`{"prompt":"hi","stream":true,"stream_options":{"include_usage":true}}`)
	defer res.Body.Close()
	if ct := res.Header.Get("Content-Type"); res.StatusCode != http.StatusOK || ct != "text/event-stream" {
		t.Fatalf("status %d content type %q", res.StatusCode, ct)
	}
	s := newSSEReader(t, res.Body)
	var id string
	for _, want := range []string{"Hel", "lo", "!"} {
		eng.gate <- struct{}{} // let the engine sample one token
		var c openai.Completion
		s.nextJSON(&c)
		if len(c.Choices) != 1 || c.Choices[0].Text != want || c.Choices[0].FinishReason != nil {
			t.Fatalf("chunk %+v, want text %q and no finish reason", c, want)
		}
		if c.Object != "text_completion" || c.Model != "tiny" || c.Usage != nil {
			t.Errorf("chunk %+v", c)
		}
		if id == "" {
			id = c.ID
		} else if c.ID != id {
			t.Errorf("chunk id %q, first was %q", c.ID, id)
		}
	}
	var last openai.Completion
	s.nextJSON(&last)
	if len(last.Choices) != 1 || last.Choices[0].FinishReason == nil || *last.Choices[0].FinishReason != "stop" {
		t.Errorf("last chunk %+v, want finish_reason stop", last)
	}
	var usage openai.Completion
	s.nextJSON(&usage)
	if diff := cmp.Diff(openai.NewCachedUsage(3, 0, 3), usage.Usage); diff != "" || len(usage.Choices) != 0 {
		t.Errorf("usage chunk %+v (-want +got):\n%s", usage, diff)
	}
	if got := s.next(); got != "[DONE]" {
		t.Errorf("final event %q, want [DONE]", got)
	}
	if got := s.next(); got != "" {
		t.Errorf("event after [DONE]: %q", got)
	}
}

func TestStreamWithoutUsage(t *testing.T) {
	r := startWorker(t, testConfig(t), newFakeEngine("a"))
	res := r.post(t, t.Context(), "/v1/completions", `{"prompt":"hi","stream":true}`)
	defer res.Body.Close()
	s := newSSEReader(t, res.Body)
	var events []string
	for ev := s.next(); ev != ""; ev = s.next() {
		events = append(events, ev)
	}
	if len(events) != 3 || events[2] != "[DONE]" || strings.Contains(events[1], "usage") {
		t.Errorf("events %q, want text, finish, [DONE] and no usage", events)
	}
}

func TestStreamHoldsSplitUTF8(t *testing.T) {
	eng := newFakeEngine("a", "\xe2\x82", "\xac", "\xf0\x9f", "\x90\x9d")
	r := startWorker(t, testConfig(t), eng)
	res := r.post(t, t.Context(), "/v1/completions", `{"prompt":"hi","stream":true}`)
	defer res.Body.Close()
	s := newSSEReader(t, res.Body)
	var texts []string
	for {
		var c openai.Completion
		s.nextJSON(&c)
		if c.Choices[0].FinishReason != nil {
			break
		}
		texts = append(texts, c.Choices[0].Text)
	}
	if diff := cmp.Diff([]string{"a", "€", "🐝"}, texts); diff != "" {
		t.Errorf("streamed texts mismatch (-want +got):\n%s", diff)
	}
}

func TestStopSequenceAcrossTokens(t *testing.T) {
	eng := newFakeEngine("Hello", " wor", "ld! ", "never")
	eng.ended = make(chan error, 2)
	r := startWorker(t, testConfig(t), eng)

	var got openai.Completion
	r.postJSON(t, "/v1/completions", `{"prompt":"hi","stop":["world","zzz"]}`, &got)
	if got.Choices[0].Text != "Hello " || *got.Choices[0].FinishReason != "stop" {
		t.Errorf("text %q finish %q, want %q stop", got.Choices[0].Text, *got.Choices[0].FinishReason, "Hello ")
	}
	if got.Usage.CompletionTokens != 3 {
		t.Errorf("completion tokens %d, want 3 (generation ends at the token completing the stop)", got.Usage.CompletionTokens)
	}
	if err := <-eng.ended; err != nil {
		t.Errorf("Generate returned %v", err)
	}

	res := r.post(t, t.Context(), "/v1/completions", `{"prompt":"hi","stop":"world","stream":true}`)
	defer res.Body.Close()
	s := newSSEReader(t, res.Body)
	var text strings.Builder
	for ev := s.next(); ev != "[DONE]"; ev = s.next() {
		var c openai.Completion
		if err := json.Unmarshal([]byte(ev), &c); err != nil {
			t.Fatal(err)
		}
		text.WriteString(c.Choices[0].Text)
		if strings.Contains(c.Choices[0].Text, "wor") {
			t.Errorf("a chunk carried part of the stop sequence: %q", ev)
		}
	}
	if text.String() != "Hello " {
		t.Errorf("streamed text %q, want %q", text.String(), "Hello ")
	}
}

func TestSamplingReachesEngine(t *testing.T) {
	eng := newFakeEngine("a")
	eng.started = make(chan engine.Request, 1)
	r := startWorker(t, testConfig(t), eng)
	r.postJSON(t, "/v1/completions", `{"prompt":"hi","max_tokens":7,"temperature":0,"top_p":0.5,"top_k":3,
		"min_p":0.1,"seed":42,"ignore_eos":true,"frequency_penalty":0.5,"presence_penalty":-1}`, nil)
	got := <-eng.started
	want := engine.Request{Prompt: []int{1, 'h', 'i'}, MaxTokens: 7, Temperature: 0, TopP: 0.5, TopK: 3, MinP: 0.1,
		Seed: 42, IgnoreEOS: true, FrequencyPenalty: 0.5, PresencePenalty: -1}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("engine request mismatch (-want +got):\n%s", diff)
	}
	// The queen took max_tokens up to 1048576 and the worker
	// only up to its context, with two messages. Now both take the same
	// range, and a max_tokens beyond the room left in the context ends
	// the generation there (finish_reason length), as llama.cpp's server.
	r.postJSON(t, "/v1/completions", `{"prompt":"hi","max_tokens":100000}`, nil)
	if got := <-eng.started; got.MaxTokens != 256-3 {
		t.Errorf("max_tokens 100000 on a 256-token context: engine got %d, want the room left (253)", got.MaxTokens)
	}
}

func TestNewJobDefaults(t *testing.T) {
	eng := newFakeEngine()
	info := engine.ModelInfo{CtxSize: 10}
	ptr := func(v int) *int { return &v }
	tests := []struct {
		name          string
		s             openai.Sampling
		wantMaxTokens int
	}{
		{"max tokens default to the room left", openai.Sampling{}, 7},
		{"max tokens capped at the room left", openai.Sampling{MaxTokens: ptr(100)}, 7},
		{"max tokens below the room", openai.Sampling{MaxTokens: ptr(2)}, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			j, err := newJob(eng, info, "hi", "prompt", tt.s, nil) // 3 tokens of 10
			if err != nil {
				t.Fatal(err)
			}
			want := engine.Request{Prompt: []int{1, 'h', 'i'}, MaxTokens: tt.wantMaxTokens,
				Temperature: defaultTemperature, TopP: defaultTopP, TopK: defaultTopK, MinP: defaultMinP}
			if diff := cmp.Diff(want, j.req, cmpopts.IgnoreFields(engine.Request{}, "Seed")); diff != "" {
				t.Errorf("request mismatch (-want +got):\n%s", diff)
			}
		})
	}
	_, err := newJob(eng, info, "123456789", "prompt", openai.Sampling{}, nil)
	var e *openai.Error
	if !errors.As(err, &e) || e.Code != openai.CodeContextLength || e.Param != "prompt" {
		t.Errorf("prompt filling the context: %v, want context_length_exceeded on prompt", err)
	}
}

func TestChatNotStreamed(t *testing.T) {
	eng := newFakeEngine("Hi", " there")
	eng.started = make(chan engine.Request, 1)
	r := startWorker(t, testConfig(t), eng)
	var got openai.ChatCompletion
	status, _ := r.postJSON(t, "/v1/chat/completions", `{"model":"tiny","messages":[{"role":"system","content":"s"},
		{"role":"user","content":[{"type":"text","text":"u"}]}]}`, &got)
	if status != http.StatusOK {
		t.Fatalf("status %d", status)
	}
	want := openai.ChatCompletion{Object: "chat.completion", Model: "tiny",
		Choices: []openai.ChatChoice{{Message: openai.ChatMessage{Role: "assistant", Content: "Hi there"}, FinishReason: "stop"}},
		Usage:   openai.NewCachedUsage(29, 0, 2)}
	if diff := cmp.Diff(want, got, cmpopts.IgnoreFields(openai.ChatCompletion{}, "ID", "Created", "Timings")); diff != "" {
		t.Errorf("response mismatch (-want +got):\n%s", diff)
	}
	if !strings.HasPrefix(got.ID, "chatcmpl-") {
		t.Errorf("id %q", got.ID)
	}
	prompt := <-eng.started
	if got, want := string(bytesOf(prompt.Prompt[1:])), "system: s\nuser: u\nassistant:"; got != want {
		t.Errorf("rendered prompt %q, want %q", got, want)
	}
}

func bytesOf(ids []int) []byte {
	b := make([]byte, len(ids))
	for i, id := range ids {
		b[i] = byte(id)
	}
	return b
}

func TestChatStreamed(t *testing.T) {
	r := startWorker(t, testConfig(t), newFakeEngine("Hi", "!"))
	res := r.post(t, t.Context(), "/v1/chat/completions",
		`{"messages":[{"role":"user","content":"u"}],"stream":true,"stream_options":{"include_usage":true}}`)
	defer res.Body.Close()
	s := newSSEReader(t, res.Body)
	var chunks []openai.ChatCompletionChunk
	for ev := s.next(); ev != "[DONE]"; ev = s.next() {
		var c openai.ChatCompletionChunk
		if err := json.Unmarshal([]byte(ev), &c); err != nil {
			t.Fatalf("event %q: %v", ev, err)
		}
		chunks = append(chunks, c)
	}
	str := func(s string) *string { return &s }
	want := []openai.ChatCompletionChunk{
		{Choices: []openai.ChatChunkChoice{{Delta: openai.ChatDelta{Role: "assistant", Content: str("")}}}},
		{Choices: []openai.ChatChunkChoice{{Delta: openai.ChatDelta{Content: str("Hi")}}}},
		{Choices: []openai.ChatChunkChoice{{Delta: openai.ChatDelta{Content: str("!")}}}},
		{Choices: []openai.ChatChunkChoice{{FinishReason: str("stop")}}},
		{Choices: []openai.ChatChunkChoice{}, Usage: openai.NewCachedUsage(19, 0, 2)},
	}
	for i := range chunks {
		if chunks[i].Object != "chat.completion.chunk" || chunks[i].Model != "tiny" || chunks[i].ID != chunks[0].ID {
			t.Errorf("chunk %d header %+v", i, chunks[i])
		}
	}
	if diff := cmp.Diff(want, chunks, cmpopts.IgnoreFields(openai.ChatCompletionChunk{}, "ID", "Object", "Created", "Model")); diff != "" {
		t.Errorf("chunks mismatch (-want +got):\n%s", diff)
	}
}

func TestModels(t *testing.T) {
	r := startWorker(t, testConfig(t), newFakeEngine())
	res, err := r.client.Get(r.url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var got openai.ModelList
	if err := json.NewDecoder(res.Body).Decode(&got); err != nil {
		t.Fatal(err)
	}
	want := openai.ModelList{Object: "list", Data: []openai.Model{{ID: "tiny", Object: "model", OwnedBy: "apiary"}}}
	if diff := cmp.Diff(want, got, cmpopts.IgnoreFields(openai.Model{}, "Created")); diff != "" {
		t.Errorf("models mismatch (-want +got):\n%s", diff)
	}
	for id, wantStatus := range map[string]int{"tiny": 200, "other": 404} {
		res, err := r.client.Get(r.url + "/v1/models/" + id)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != wantStatus {
			t.Errorf("GET /v1/models/%s: %d, want %d", id, res.StatusCode, wantStatus)
		}
	}
}

func TestBadRequests(t *testing.T) {
	cfg := testConfig(t)
	cfg.MaxBodyBytes = 1024
	eng := newFakeEngine("a")
	eng.info.CtxSize = 64
	r := startWorker(t, cfg, eng)
	tests := []struct {
		name, method, path, body string
		wantStatus               int
		wantCode, wantParam      string
	}{
		{"malformed JSON", "POST", "/v1/completions", `{"prompt":`, 400, "invalid_json", ""},
		{"empty body", "POST", "/v1/chat/completions", ``, 400, "invalid_json", ""},
		{"wrong type", "POST", "/v1/completions", `{"prompt":"a","max_tokens":"ten"}`, 400, "invalid_type", "max_tokens"},
		{"negative max_tokens", "POST", "/v1/completions", `{"prompt":"a","max_tokens":-1}`, 400, "invalid_value", "max_tokens"},
		{"max_tokens over the queen's limit", "POST", "/v1/completions", `{"prompt":"a","max_tokens":1048577}`, 400, "invalid_value", "max_tokens"},
		{"huge max_tokens", "POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":"a"}],"max_tokens":1e300}`, 400, "invalid_value", "max_tokens"},
		{"n over the limit", "POST", "/v1/completions", `{"prompt":"a","n":17}`, 400, "invalid_value", "n"},
		{"logit_bias past the vocabulary", "POST", "/v1/completions", `{"prompt":"a","logit_bias":{"256":1}}`, 400, "invalid_value", "logit_bias.256"},
		{"tool without its function", "POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":"a"}],"tools":[{"type":"function"}]}`, 400, "missing_required_parameter", "tools[0].function"},
		{"prompt too long", "POST", "/v1/completions", `{"prompt":"` + strings.Repeat("x", 70) + `"}`, 400, "context_length_exceeded", "prompt"},
		{"other model", "POST", "/v1/completions", `{"model":"huge","prompt":"a"}`, 404, "model_not_found", "model"},
		{"oversized body", "POST", "/v1/completions", `{"prompt":"` + strings.Repeat("x", 2000) + `"}`, 413, "body_too_large", ""},
		{"GET on a POST endpoint", "GET", "/v1/completions", ``, 405, "method_not_allowed", ""},
		{"POST on a GET endpoint", "POST", "/health", `{}`, 405, "method_not_allowed", ""},
		{"unknown path", "GET", "/v2/nothing", ``, 404, "not_found", ""},
		{"panic in a handler", "POST", "/v1/completions", `{"prompt":"panic"}`, 500, "internal_error", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := http.NewRequest(tt.method, r.url+tt.path, strings.NewReader(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			res, err := r.client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			var body openai.ErrorResponse
			if err := json.NewDecoder(res.Body).Decode(&body); err != nil {
				t.Fatalf("error body: %v", err)
			}
			param := ""
			if body.Error.Param != nil {
				param = *body.Error.Param
			}
			if res.StatusCode != tt.wantStatus || body.Error.Code != tt.wantCode || param != tt.wantParam || body.Error.Message == "" {
				t.Errorf("got %d %+v (param %q), want %d %s param %q", res.StatusCode, body.Error, param, tt.wantStatus, tt.wantCode, tt.wantParam)
			}
			if tt.wantStatus == 405 && res.Header.Get("Allow") == "" {
				t.Error("405 without Allow header")
			}
		})
	}
	// The worker still serves after all that.
	var got openai.Completion
	if status, _ := r.postJSON(t, "/v1/completions", `{"prompt":"ok"}`, &got); status != 200 || got.Choices[0].Text != "a" {
		t.Errorf("after bad requests: %d %+v", status, got)
	}
}

// TestClientDisconnectCancelsGeneration checks that a client going away
// ends its generation at the next token and frees the slot.
func TestClientDisconnectCancelsGeneration(t *testing.T) {
	eng := newFakeEngine("a", "b", "c")
	eng.gate = make(chan struct{})
	eng.ended = make(chan error, 1)
	r := startWorker(t, testConfig(t), eng)

	ctx, cancel := context.WithCancel(t.Context())
	res := r.post(t, ctx, "/v1/completions", `{"prompt":"hi","stream":true}`)
	s := newSSEReader(t, res.Body)
	eng.gate <- struct{}{}
	var c openai.Completion
	s.nextJSON(&c)
	cancel()
	res.Body.Close()

	if err := <-eng.ended; !errors.Is(err, context.Canceled) {
		t.Errorf("Generate returned %v, want context.Canceled", err)
	}
	waitFor(t, "the slot to be freed", func() bool { return r.w.Health().InFlight == 0 })
}
