package worker

// Integration tests: the real `apiary worker` binary, the real llama.cpp
// engine, the tiny test model, real HTTP, and the official OpenAI Go client.

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"unicode"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/openai"
	oai "github.com/openai/openai-go"
	"github.com/openai/openai-go/option"
)

func newOpenAIClient(url string) oai.Client {
	return oai.NewClient(option.WithBaseURL(url+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
}

func TestBinaryWithOpenAIClient(t *testing.T) {
	_, url := startWorkerBinary(t, nil, "--slots", "2")
	client := newOpenAIClient(url)
	ctx := t.Context()
	ignoreEOS := option.WithJSONSet("ignore_eos", true)

	greedy := oai.CompletionNewParams{
		Model:       "tiny",
		Prompt:      oai.CompletionNewParamsPromptUnion{OfString: oai.String("Once upon a time")},
		MaxTokens:   oai.Int(24),
		Temperature: oai.Float(0),
	}
	whole, err := client.Completions.New(ctx, greedy, ignoreEOS)
	if err != nil {
		t.Fatalf("completion: %v", err)
	}
	if len(whole.Choices) != 1 || whole.Choices[0].FinishReason != "length" || whole.Usage.CompletionTokens != 24 ||
		whole.Usage.PromptTokens == 0 || whole.Usage.TotalTokens != whole.Usage.PromptTokens+24 || whole.Model != "tiny" ||
		!strings.HasPrefix(whole.ID, "cmpl-") || whole.Choices[0].Text == "" {
		t.Fatalf("completion %+v", whole)
	}
	text := whole.Choices[0].Text

	t.Run("completion stream matches the whole answer", func(t *testing.T) {
		params := greedy
		params.StreamOptions = oai.ChatCompletionStreamOptionsParam{IncludeUsage: oai.Bool(true)}
		stream := client.Completions.NewStreaming(ctx, params, ignoreEOS)
		var got strings.Builder
		var finish string
		var usage oai.CompletionUsage
		chunks := 0
		for stream.Next() {
			c := stream.Current()
			for _, ch := range c.Choices {
				got.WriteString(ch.Text)
				if ch.FinishReason != "" {
					finish = string(ch.FinishReason)
				}
			}
			if c.Usage.TotalTokens > 0 {
				usage = c.Usage
			}
			chunks++
		}
		if err := stream.Err(); err != nil {
			t.Fatalf("stream: %v", err)
		}
		if got.String() != text || finish != "length" || usage.CompletionTokens != 24 {
			t.Errorf("stream gave %q finish %q usage %+v, want %q length 24 tokens", got.String(), finish, usage, text)
		}
		if chunks < 4 {
			t.Errorf("%d chunks for 24 tokens: not streamed token by token", chunks)
		}
	})

	t.Run("stop sequence across tokens", func(t *testing.T) {
		stop := stopWithin(t, text)
		params := greedy
		params.Stop = oai.CompletionNewParamsStopUnion{OfStringArray: []string{stop}}
		c, err := client.Completions.New(ctx, params, ignoreEOS)
		if err != nil {
			t.Fatal(err)
		}
		want := text[:strings.Index(text, stop)]
		if c.Choices[0].Text != want || c.Choices[0].FinishReason != "stop" {
			t.Errorf("with stop %q: %q finish %q, want %q stop", stop, c.Choices[0].Text, c.Choices[0].FinishReason, want)
		}

		stream := client.Completions.NewStreaming(ctx, params, ignoreEOS)
		var got strings.Builder
		for stream.Next() {
			for _, ch := range stream.Current().Choices {
				got.WriteString(ch.Text)
			}
		}
		if err := stream.Err(); err != nil || got.String() != want {
			t.Errorf("streamed with stop %q: %q, %v; want %q", stop, got.String(), err, want)
		}
	})

	chatParams := oai.ChatCompletionNewParams{
		Model: "tiny",
		Messages: []oai.ChatCompletionMessageParamUnion{
			oai.SystemMessage("You are terse."),
			oai.UserMessage("Say hello."),
		},
		MaxCompletionTokens: oai.Int(16),
		Temperature:         oai.Float(0),
	}
	t.Run("chat", func(t *testing.T) {
		c, err := client.Chat.Completions.New(ctx, chatParams, ignoreEOS)
		if err != nil {
			t.Fatal(err)
		}
		if len(c.Choices) != 1 || c.Choices[0].Message.Role != "assistant" || c.Choices[0].FinishReason != "length" ||
			c.Usage.CompletionTokens != 16 || !strings.HasPrefix(c.ID, "chatcmpl-") {
			t.Fatalf("chat %+v", c)
		}

		params := chatParams
		params.StreamOptions = oai.ChatCompletionStreamOptionsParam{IncludeUsage: oai.Bool(true)}
		stream := client.Chat.Completions.NewStreaming(ctx, params, ignoreEOS)
		var acc oai.ChatCompletionAccumulator
		for stream.Next() {
			acc.AddChunk(stream.Current())
		}
		if err := stream.Err(); err != nil {
			t.Fatalf("chat stream: %v", err)
		}
		if len(acc.Choices) != 1 || acc.Choices[0].Message.Content != c.Choices[0].Message.Content ||
			acc.Choices[0].FinishReason != "length" || acc.Usage.CompletionTokens != 16 {
			t.Errorf("streamed chat %q finish %q usage %+v, want %q length 16",
				acc.Choices[0].Message.Content, acc.Choices[0].FinishReason, acc.Usage, c.Choices[0].Message.Content)
		}
	})

	t.Run("parallel requests on two slots", func(t *testing.T) {
		var wg sync.WaitGroup
		texts := make([]string, 4)
		for i := range texts {
			wg.Go(func() {
				c, err := client.Completions.New(ctx, greedy, ignoreEOS)
				if err != nil {
					t.Errorf("request %d: %v", i, err)
					return
				}
				texts[i] = c.Choices[0].Text
			})
		}
		wg.Wait()
		for i, got := range texts {
			if got != text {
				t.Errorf("request %d gave %q, want the greedy %q", i, got, text)
			}
		}
	})

	t.Run("unsupported features are 400 naming the field", func(t *testing.T) {
		params := greedy
		params.BestOf = oai.Int(2)
		_, err := client.Completions.New(ctx, params)
		var apiErr *oai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || apiErr.Param != "best_of" || apiErr.Code != "unsupported_parameter" ||
			apiErr.Type != "invalid_request_error" {
			t.Errorf("best_of=2: %v, want a 400 unsupported_parameter on best_of", err)
		}
		_, err = client.Chat.Completions.New(ctx, oai.ChatCompletionNewParams{Model: "tiny",
			Messages: []oai.ChatCompletionMessageParamUnion{oai.UserMessage("x")}, MaxTokens: oai.Int(-3)})
		if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || apiErr.Param != "max_tokens" {
			t.Errorf("max_tokens=-3: %v, want a 400 on max_tokens", err)
		}
		_, err = client.Completions.New(ctx, oai.CompletionNewParams{Model: "other",
			Prompt: oai.CompletionNewParamsPromptUnion{OfString: oai.String("x")}})
		if !errors.As(err, &apiErr) || apiErr.StatusCode != 404 || apiErr.Code != "model_not_found" {
			t.Errorf("model=other: %v, want a 404 model_not_found", err)
		}
	})

	t.Run("models", func(t *testing.T) {
		page, err := client.Models.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Data) != 1 || page.Data[0].ID != "tiny" {
			t.Errorf("models %+v", page.Data)
		}
		m, err := client.Models.Get(ctx, "tiny")
		if err != nil || m.ID != "tiny" {
			t.Errorf("model tiny: %+v, %v", m, err)
		}
		var apiErr *oai.Error
		if _, err := client.Models.Get(ctx, "gpt-4"); !errors.As(err, &apiErr) || apiErr.StatusCode != 404 {
			t.Errorf("model gpt-4: %v, want 404", err)
		}
	})
}

// stopWithin picks a stop sequence from text: two printable ASCII
// characters, first seen past the start, so the answer stops before them.
func stopWithin(t *testing.T, text string) string {
	t.Helper()
	for i := 1; i+2 <= len(text); i++ {
		s := text[i : i+2]
		if s[0] < 0x80 && s[1] < 0x80 && unicode.IsPrint(rune(s[0])) && unicode.IsPrint(rune(s[1])) &&
			!strings.Contains(text[:i+1], s) {
			return s
		}
	}
	t.Fatalf("no two printable ASCII characters in %q to use as a stop sequence; change the test model's seed", text)
	return ""
}

func TestBinaryBadRequests(t *testing.T) {
	_, url := startWorkerBinary(t, nil, "--ctx-size", "256") // llama.cpp's smallest
	tests := []struct {
		name, path, body string
		wantStatus       int
		wantCode         string
	}{
		{"not JSON", "/v1/completions", `prompt=hello`, 400, "invalid_json"},
		{"truncated JSON", "/v1/chat/completions", `{"messages":[{"role":"user"`, 400, "invalid_json"},
		{"wrong type", "/v1/completions", `{"prompt":"a","temperature":"warm"}`, 400, "invalid_type"},
		{"huge max_tokens", "/v1/completions", `{"prompt":"a","max_tokens":9999999999}`, 400, "invalid_value"},
		{"max_tokens over the queen's range", "/v1/completions", `{"prompt":"a","max_tokens":1048577}`, 400, "invalid_value"},
		{"prompt over the context", "/v1/completions", `{"prompt":"` + strings.Repeat("ab ", 1000) + `"}`, 400, "context_length_exceeded"},
		{"token prompt", "/v1/completions", `{"prompt":[1,2,3]}`, 400, "unsupported_parameter"},
		{"image not a data URI", "/v1/chat/completions", `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`, 400, "invalid_value"},
		{"image URL to fetch", "/v1/chat/completions", `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://example.com/a.png"}}]}]}`, 400, "unsupported_parameter"},
		{"oversized body", "/v1/completions", `{"prompt":"` + strings.Repeat("x", 5<<20) + `"}`, 413, "body_too_large"},
		{"unknown path", "/v1/nothing", `{}`, 404, "not_found"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := http.Post(url+tt.path, "application/json", strings.NewReader(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			var e openai.ErrorResponse
			if err := json.NewDecoder(res.Body).Decode(&e); err != nil {
				t.Fatalf("body: %v", err)
			}
			if res.StatusCode != tt.wantStatus || e.Error.Code != tt.wantCode || e.Error.Message == "" {
				t.Errorf("got %d %+v, want %d %s", res.StatusCode, e.Error, tt.wantStatus, tt.wantCode)
			}
		})
	}
	res, err := http.Get(url + "/v1/chat/completions")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET /v1/chat/completions: %d, want 405", res.StatusCode)
	}
	if h := binaryHealth(t, url); h.Status != StatusReady {
		t.Errorf("after bad requests the worker is %s", h.Status)
	}
}

func binaryHealth(t *testing.T, url string) Health {
	t.Helper()
	res, err := http.Get(url + "/health")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var h Health
	if err := json.NewDecoder(res.Body).Decode(&h); err != nil {
		t.Fatal(err)
	}
	return h
}

// streamUntilFirstToken starts a long streamed completion and returns the
// stream once its first text chunk arrived.
func streamUntilFirstToken(t *testing.T, url string, maxTokens int) (*sseReader, func()) {
	t.Helper()
	body := `{"prompt":"Once","ignore_eos":true,"stream":true`
	if maxTokens > 0 {
		body += `,"max_tokens":` + strconv.Itoa(maxTokens)
	}
	body += `}`
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url+"/v1/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if res.StatusCode != http.StatusOK {
		t.Fatalf("stream status %d", res.StatusCode)
	}
	s := newSSEReader(t, res.Body)
	var c openai.Completion
	s.nextJSON(&c)
	return s, func() { res.Body.Close() }
}

// heldModel makes a directory for the workers' test knob (TestHoldEnv)
// holding the test model's generations after their first token; it
// returns the worker's environment and what lets them go.
func heldModel(t *testing.T) (env []string, release func()) {
	t.Helper()
	dir := t.TempDir()
	file := filepath.Join(dir, strings.TrimSuffix(filepath.Base(testModelPath(t)), ".gguf"))
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	return []string{TestHoldEnv + "=" + dir}, func() {
		if err := os.Remove(file); err != nil {
			t.Error(err)
		}
	}
}

func TestBinarySIGTERMCancelsStreamAfterGrace(t *testing.T) {
	// The stream is held after its first token (the test knob) past the
	// grace, however fast the CPU: it is cancelled and ends with an
	// error event.
	env, _ := heldModel(t)
	p, url := startWorkerBinary(t, env, "--shutdown-grace", "100ms")
	s, closeBody := streamUntilFirstToken(t, url, 200)
	defer closeBody()

	p.signal(t, syscall.SIGTERM)
	var last string
	for ev := s.next(); ev != ""; ev = s.next() {
		last = ev
	}
	var e openai.ErrorResponse
	if err := json.Unmarshal([]byte(last), &e); err != nil || e.Error.Code != "shutting_down" {
		t.Errorf("last event %q, want an error event with code shutting_down", last)
	}
	if code := p.exitCode(t); code != 0 {
		t.Errorf("exit code %d, want 0; stderr:\n%s", code, p.output())
	}
	p.waitLog(t, "model unloaded", nil)
}

func TestBinarySIGTERMLetsStreamFinish(t *testing.T) {
	env, release := heldModel(t) // the stream is still under way at SIGTERM, however fast the CPU
	p, url := startWorkerBinary(t, env, "--shutdown-grace", "60s")
	s, closeBody := streamUntilFirstToken(t, url, 200)
	defer closeBody()

	p.signal(t, syscall.SIGTERM)
	rec := p.waitLog(t, "draining", nil)
	if rec["in_flight"] != float64(1) {
		t.Errorf("draining began with in_flight %v, want 1 (the stream)", rec["in_flight"])
	}
	release()
	var events []string
	for ev := s.next(); ev != ""; ev = s.next() {
		events = append(events, ev)
	}
	if n := len(events); n < 2 || events[n-1] != "[DONE]" || !strings.Contains(events[n-2], `"finish_reason":"length"`) {
		t.Errorf("stream ended with %q, want a length finish and [DONE]", events[max(0, len(events)-2):])
	}
	if code := p.exitCode(t); code != 0 {
		t.Errorf("exit code %d, want 0; stderr:\n%s", code, p.output())
	}
}

func TestBinaryAdminShutdown(t *testing.T) {
	p, url := startWorkerBinary(t, []string{TokenEnv + "=hunter2"})
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/admin/shutdown", nil)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusUnauthorized {
		t.Errorf("shutdown without the token: %d, want 401", res.StatusCode)
	}
	req, _ = http.NewRequest(http.MethodPost, url+"/v1/admin/shutdown", nil)
	req.Header.Set("Authorization", "Bearer hunter2")
	res, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusAccepted {
		t.Errorf("shutdown with the token: %d, want 202", res.StatusCode)
	}
	if code := p.exitCode(t); code != 0 {
		t.Errorf("exit code %d, want 0; stderr:\n%s", code, p.output())
	}
	p.waitLog(t, "model unloaded", nil)
}

func TestBinaryStartupErrors(t *testing.T) {
	dir := t.TempDir()
	notGGUF := filepath.Join(dir, "readme.gguf")
	if err := os.WriteFile(notGGUF, []byte("# not a model\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		args     []string
		env      []string
		wantCode int
		wantText string
	}{
		{"missing model file", []string{"--model", filepath.Join(dir, "absent.gguf"), "--port", "0"}, nil, 1, "absent.gguf does not exist"},
		{"not a GGUF file", []string{"--model", notGGUF, "--port", "0"}, nil, 1, "not a GGUF file"},
		{"no model flag", []string{"--port", "0"}, nil, 2, "--model is required"},
		{"public address without token", []string{"--model", notGGUF, "--host", "0.0.0.0"}, nil, 2, "loopback"},
		{"unknown flag", []string{"--model", notGGUF, "--frobnicate"}, nil, 2, "frobnicate"},
		{"listen fd not open", []string{"--model", notGGUF, "--listen-fd", "9"}, nil, 2, "--listen-fd 9 is not a listening socket"},
		{"listen fd is stdout", []string{"--model", notGGUF, "--listen-fd", "1"}, nil, 2, "descriptors 0-2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := startApiary(t, tt.env, append([]string{"worker"}, tt.args...)...)
			if code := p.exitCode(t); code != tt.wantCode {
				t.Errorf("exit code %d, want %d", code, tt.wantCode)
			}
			out := p.output()
			if !strings.Contains(out, tt.wantText) || strings.Count(strings.TrimSpace(out), "\n") > 0 {
				t.Errorf("stderr %q, want one line mentioning %q", out, tt.wantText)
			}
		})
	}
}

func TestBinaryReadyCallback(t *testing.T) {
	got := make(chan api.ReadyCallback, 1)
	auth := make(chan string, 1)
	hive := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		var cb api.ReadyCallback
		dec := json.NewDecoder(r.Body)
		dec.DisallowUnknownFields()
		if err := dec.Decode(&cb); err != nil {
			t.Errorf("callback body: %v", err)
		}
		got <- cb
		auth <- r.Header.Get("Authorization")
	}))
	defer hive.Close()

	p, url := startWorkerBinary(t, []string{TokenEnv + "=tok-1"}, "--worker-id", "wk-42", "--callback-url", hive.URL+"/v2/internal/workers/ready",
		"--lifecycle-id", "lc-7")
	cb := <-got
	if cb.WorkerID != "wk-42" || cb.URI != url || cb.VRAMBytes == 0 {
		t.Errorf("callback %+v, want worker wk-42 at %s with its memory", cb, url)
	}
	if a := <-auth; a != "Bearer tok-1" {
		t.Errorf("Authorization %q", a)
	}
	if h := binaryHealth(t, cb.URI); h.Status != StatusReady || h.VRAMBytes != cb.VRAMBytes {
		t.Errorf("health at the reported uri: %+v", h)
	}
	rec := p.waitLog(t, "ready callback accepted", nil)
	if rec["worker_id"] != "wk-42" || rec["lifecycle_id"] != "lc-7" {
		t.Errorf("log record %v lacks worker_id/lifecycle_id", rec)
	}
	p.signal(t, syscall.SIGTERM)
	if code := p.exitCode(t); code != 0 {
		t.Errorf("exit code %d", code)
	}
}

func TestBinaryReadyCallbackRefused(t *testing.T) {
	hive := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		rw.WriteHeader(http.StatusForbidden)
		json.NewEncoder(rw).Encode(api.Error{Error: api.ErrorDetail{Code: "bad_token", Message: "token does not match"}})
	}))
	defer hive.Close()
	p := startApiary(t, []string{TokenEnv + "=x"}, "worker", "--worker-id", "wk-1", "--model", testModelPath(t),
		"--port", "0", "--callback-url", hive.URL)
	if code := p.exitCode(t); code != 1 {
		t.Errorf("exit code %d, want 1", code)
	}
	if out := p.output(); !strings.Contains(out, "token does not match") {
		t.Errorf("stderr does not say why the callback was refused:\n%s", out)
	}
}
