//go:build !race

package queen

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	oai "github.com/openai/openai-go"
	"github.com/openai/openai-go/shared"

	"github.com/apiary-llm/apiary/internal/testmodel"
)

// Tool calls and Anthropic's /v1/messages go through the queen: the queen
// lets the tool fields through to a worker of a model with a tool
// template, and serves /v1/messages with its API token as a bearer token
// or in x-api-key, errors in Anthropic's shape.
func TestProcessToolsAndMessagesThroughTheQueen(t *testing.T) {
	const token = "api-0123456789abcdef"
	c := startClusterWith(t, clusterOptions{model: testmodel.Options{ToolTemplate: true}, apiToken: token}, nil)
	ctx := t.Context()

	params := oai.ChatCompletionNewParams{Model: "tiny", Messages: []oai.ChatCompletionMessageParamUnion{oai.UserMessage("Weather in Oslo?")},
		// Greedy: with sampling, the random-weight model may pick byte
		// tokens that the grammar lets through as invalid UTF-8, which
		// reaches the client as U+FFFD and can make the city longer than
		// its maxLength (docs/worker.md, structured output).
		MaxCompletionTokens: oai.Int(200), ParallelToolCalls: oai.Bool(false), Temperature: oai.Float(0),
		ToolChoice: oai.ChatCompletionToolChoiceOptionUnionParam{OfAuto: oai.String("required")},
		Tools: []oai.ChatCompletionToolParam{{Function: shared.FunctionDefinitionParam{Name: "get_weather",
			Parameters: shared.FunctionParameters{"type": "object", "properties": map[string]any{
				"city": map[string]any{"type": "string", "maxLength": 10}}, "required": []string{"city"}}}}}}
	res, err := c.client.Chat.Completions.New(ctx, params)
	if err != nil {
		t.Fatalf("a forced tool call through the queen: %v", err)
	}
	ch := res.Choices[0]
	var args struct {
		City *string `json:"city"`
	}
	if ch.FinishReason != "tool_calls" || len(ch.Message.ToolCalls) != 1 || ch.Message.ToolCalls[0].Function.Name != "get_weather" ||
		json.Unmarshal([]byte(ch.Message.ToolCalls[0].Function.Arguments), &args) != nil || args.City == nil || len([]rune(*args.City)) > 10 {
		t.Fatalf("answer %+v, want one get_weather call with a city", ch)
	}

	post := func(body string, header ...string) (int, []byte) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url+"/v1/messages", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, data
	}
	const body = `{"model":"tiny","max_tokens":6,"temperature":0,"system":"Be brief.","messages":[{"role":"user","content":"Hi"}]}`
	status, data := post(body, "x-api-key", token, "anthropic-version", "2023-06-01")
	var m struct {
		ID         string `json:"id"`
		Type       string `json:"type"`
		Role       string `json:"role"`
		StopReason string `json:"stop_reason"`
		Content    []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"content"`
		Usage struct {
			InputTokens  int `json:"input_tokens"`
			OutputTokens int `json:"output_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(data, &m); err != nil || status != 200 || !strings.HasPrefix(m.ID, "msg_") || m.Type != "message" ||
		m.Role != "assistant" || len(m.Content) != 1 || m.Content[0].Type != "text" || m.Usage.InputTokens == 0 ||
		(m.StopReason != "max_tokens" && m.StopReason != "end_turn") {
		t.Fatalf("messages through the queen: %d %s", status, data)
	}

	status, data = post(strings.Replace(body, "{", `{"stream":true,`, 1), "Authorization", "Bearer "+token)
	if status != 200 {
		t.Fatalf("streamed messages: %d %s", status, data)
	}
	var names []string
	var text strings.Builder
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		if name, ok := strings.CutPrefix(sc.Text(), "event: "); ok {
			names = append(names, name)
		}
		if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok && names[len(names)-1] == "content_block_delta" {
			var ev struct {
				Delta struct {
					Text string `json:"text"`
				} `json:"delta"`
			}
			if err := json.Unmarshal([]byte(d), &ev); err != nil {
				t.Fatal(err)
			}
			text.WriteString(ev.Delta.Text)
		}
	}
	deltas := slices.DeleteFunc(slices.Clone(names), func(n string) bool { return n != "content_block_delta" })
	want := append(append([]string{"message_start", "content_block_start", "ping"}, deltas...), "content_block_stop", "message_delta", "message_stop")
	if !slices.Equal(names, want) || text.String() != m.Content[0].Text {
		t.Errorf("streamed events %v (text %q), want %v (text %q)", names, text.String(), want, m.Content[0].Text)
	}

	for _, tt := range []struct {
		name    string
		body    string
		header  []string
		status  int
		errType string
	}{
		{"wrong x-api-key", body, []string{"x-api-key", "nope"}, 401, "authentication_error"},
		{"no max_tokens", `{"model":"tiny","messages":[{"role":"user","content":"Hi"}]}`, []string{"x-api-key", token}, 400, "invalid_request_error"},
		{"tools", `{"model":"tiny","max_tokens":5,"tools":[{"name":"f"}],"messages":[{"role":"user","content":"Hi"}]}`, []string{"x-api-key", token}, 400, "invalid_request_error"},
		{"unknown model", `{"model":"nope","max_tokens":5,"messages":[{"role":"user","content":"Hi"}]}`, []string{"x-api-key", token}, 404, "not_found_error"},
	} {
		status, data := post(tt.body, tt.header...)
		var e struct {
			Type  string `json:"type"`
			Error struct {
				Type    string `json:"type"`
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal(data, &e); err != nil || status != tt.status || e.Type != "error" || e.Error.Type != tt.errType || e.Error.Message == "" {
			t.Errorf("%s: %d %s, want %d with an Anthropic %s", tt.name, status, data, tt.status, tt.errType)
		}
	}
}
