package worker

// Tool calling through the real worker binary, with the official Go
// client, on the random-weight test model carrying a Hermes-style tool
// template: forced calls come out as valid calls because a grammar makes
// them so.

import (
	"encoding/json"
	"strings"
	"testing"

	oai "github.com/openai/openai-go"
	"github.com/openai/openai-go/shared"
)

// weatherParams bounds every value, so that even the random model
// finishes a call within the token budget.
const weatherParams = `{"type":"object","properties":{
	"city":{"type":"string","maxLength":12},
	"unit":{"enum":["celsius","fahrenheit"]},
	"days":{"type":"integer","minimum":1,"maximum":7}},
	"required":["city","unit","days"],"additionalProperties":false}`

func weatherTools(t *testing.T) ([]oai.ChatCompletionToolParam, map[string]any) {
	t.Helper()
	var schema map[string]any
	if err := json.Unmarshal([]byte(weatherParams), &schema); err != nil {
		t.Fatal(err)
	}
	return []oai.ChatCompletionToolParam{
		{Function: shared.FunctionDefinitionParam{Name: "get_weather", Description: oai.String("The weather in a city"), Parameters: schema}},
		{Function: shared.FunctionDefinitionParam{Name: "get_time", Parameters: shared.FunctionParameters{"type": "object",
			"properties": map[string]any{"zone": map[string]any{"type": "string", "maxLength": 8}}, "required": []string{"zone"}}}},
	}, schema
}

func TestBinaryToolCalls(t *testing.T) {
	_, url := startWorkerBinaryOn(t, toolModelPath(t), nil)
	checkToolCalls(t, newOpenAIClient(url))
}

// checkToolCalls forces calls (required, and a named function), streamed
// and not, checks their shape and that the arguments validate against the
// function's schema, then sends the call and its result back and gets an
// answer; the queen's tests run it through the queen.
func checkToolCalls(t *testing.T, client oai.Client) {
	ctx := t.Context()
	tools, schema := weatherTools(t)
	params := chatParams("What is the weather in Oslo this week?", 300)
	params.Tools = tools
	params.ParallelToolCalls = oai.Bool(false)
	params.Temperature = oai.Float(0.7)
	params.Seed = oai.Int(11)
	params.ToolChoice = oai.ChatCompletionToolChoiceOptionUnionParam{OfChatCompletionNamedToolChoice: &oai.ChatCompletionNamedToolChoiceParam{
		Function: oai.ChatCompletionNamedToolChoiceFunctionParam{Name: "get_weather"}}}
	c, err := client.Chat.Completions.New(ctx, params)
	if err != nil {
		t.Fatalf("named tool_choice: %v", err)
	}
	ch := c.Choices[0]
	if ch.FinishReason != "tool_calls" || len(ch.Message.ToolCalls) != 1 {
		t.Fatalf("named tool_choice: finish %q, calls %+v, content %q; want one call and tool_calls", ch.FinishReason, ch.Message.ToolCalls, ch.Message.Content)
	}
	call := ch.Message.ToolCalls[0]
	if !strings.HasPrefix(call.ID, "call_") || call.Type != "function" || call.Function.Name != "get_weather" {
		t.Errorf("call %+v, want id call_…, type function, name get_weather", call)
	}
	var args any
	if err := json.Unmarshal([]byte(call.Function.Arguments), &args); err != nil {
		t.Fatalf("arguments %q are not JSON: %v", call.Function.Arguments, err)
	}
	if err := validate(schema, schema, args); err != nil {
		t.Errorf("arguments %s break the schema: %v", call.Function.Arguments, err)
	}

	// "required", streamed: the call arrives as OpenAI streams one.
	params.ToolChoice = oai.ChatCompletionToolChoiceOptionUnionParam{OfAuto: oai.String("required")}
	s := client.Chat.Completions.NewStreaming(ctx, params)
	var acc oai.ChatCompletionAccumulator
	var deltas []oai.ChatCompletionChunkChoiceDeltaToolCall
	finish := ""
	for s.Next() {
		chunk := s.Current()
		acc.AddChunk(chunk)
		for _, c := range chunk.Choices {
			deltas = append(deltas, c.Delta.ToolCalls...)
			if c.FinishReason != "" {
				finish = c.FinishReason
			}
		}
	}
	if err := s.Err(); err != nil {
		t.Fatalf("required, streamed: %v", err)
	}
	if finish != "tool_calls" || len(deltas) < 2 {
		t.Fatalf("streamed: finish %q, tool call deltas %+v", finish, deltas)
	}
	if d := deltas[0]; !strings.HasPrefix(d.ID, "call_") || d.Type != "function" || d.Function.Name == "" || d.Function.Arguments != "" || d.Index != 0 {
		t.Errorf("first delta %+v, want index 0, id, type, name and no arguments yet", d)
	}
	for _, d := range deltas[1:] {
		if d.ID != "" || d.Function.Name != "" || d.Index != 0 {
			t.Errorf("later delta %+v, want argument fragments of call 0 only", d)
		}
	}
	calls := acc.Choices[0].Message.ToolCalls
	if len(calls) != 1 || (calls[0].Function.Name != "get_weather" && calls[0].Function.Name != "get_time") {
		t.Fatalf("streamed calls %+v", calls)
	}
	if err := json.Unmarshal([]byte(calls[0].Function.Arguments), &args); err != nil {
		t.Errorf("streamed arguments %q are not JSON: %v", calls[0].Function.Arguments, err)
	} else if calls[0].Function.Name == "get_weather" {
		if err := validate(schema, schema, args); err != nil {
			t.Errorf("streamed arguments %s break the schema: %v", calls[0].Function.Arguments, err)
		}
	}

	// The round trip: the call and its result go back, the model answers.
	result := `{"temp_c": 21, "sky": "clear"}`
	back := chatParams("What is the weather in Oslo this week?", 8)
	back.Tools = tools
	back.Messages = append(back.Messages, ch.Message.ToParam(), oai.ToolMessage(result, call.ID))
	a, err := client.Chat.Completions.New(ctx, back)
	if err != nil {
		t.Fatalf("answer after the tool result: %v", err)
	}
	if len(a.Choices) != 1 || a.Choices[0].FinishReason == "" {
		t.Errorf("answer %+v, want one choice", a.Choices)
	}
	// The template wrote the call and its result into the prompt (the
	// test model's tokens are single characters, so they count).
	if grew := a.Usage.PromptTokens - c.Usage.PromptTokens; grew < int64(len(result)+len(call.Function.Arguments)) {
		t.Errorf("prompt grew by %d tokens with the call and its result, want at least %d", grew, len(result)+len(call.Function.Arguments))
	}
}
