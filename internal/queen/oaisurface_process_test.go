//go:build !race

package queen

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	oai "github.com/openai/openai-go"
	"github.com/openai/openai-go/option"
	"github.com/openai/openai-go/shared"

	"github.com/apiary-llm/apiary/internal/openai"
)

// Structured outputs, logprobs and several choices reach a worker through
// the queen as the client sent them, and the queen refuses what the worker
// would refuse without starting one.
func TestProcessStructuredOutputsLogprobsAndChoices(t *testing.T) {
	c := startCluster(t, nil)
	ctx := t.Context()

	var schema map[string]any
	if err := json.Unmarshal([]byte(`{"type":"object","properties":{"name":{"type":"string","maxLength":6},
		"n":{"type":"integer","minimum":1,"maximum":9},"kind":{"enum":["bee","wasp"]}},
		"required":["name","n","kind"],"additionalProperties":false}`), &schema); err != nil {
		t.Fatal(err)
	}
	chat := oai.ChatCompletionNewParams{Model: "tiny", Messages: []oai.ChatCompletionMessageParamUnion{oai.UserMessage("A bee as JSON.")},
		MaxCompletionTokens: oai.Int(200), Temperature: oai.Float(0),
		ResponseFormat: oai.ChatCompletionNewParamsResponseFormatUnion{OfJSONSchema: &shared.ResponseFormatJSONSchemaParam{
			JSONSchema: shared.ResponseFormatJSONSchemaJSONSchemaParam{Name: "bee", Strict: oai.Bool(true), Schema: schema}}}}
	res, err := c.client.Chat.Completions.New(ctx, chat)
	if err != nil {
		t.Fatalf("json_schema through the queen: %v", err)
	}
	var bee struct {
		Name *string `json:"name"`
		N    *int    `json:"n"`
		Kind *string `json:"kind"`
	}
	dec := json.NewDecoder(strings.NewReader(res.Choices[0].Message.Content))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&bee); err != nil || bee.Name == nil || len([]rune(*bee.Name)) > 6 || bee.N == nil || *bee.N < 1 || *bee.N > 9 ||
		bee.Kind == nil || (*bee.Kind != "bee" && *bee.Kind != "wasp") {
		t.Errorf("json_schema answer %q breaks the schema (%v)", res.Choices[0].Message.Content, err)
	}

	lp := oai.ChatCompletionNewParams{Model: "tiny", Messages: []oai.ChatCompletionMessageParamUnion{oai.UserMessage("Hi")},
		MaxCompletionTokens: oai.Int(5), Temperature: oai.Float(1), Seed: oai.Int(3), N: oai.Int(2),
		Logprobs: oai.Bool(true), TopLogprobs: oai.Int(4),
		StreamOptions: oai.ChatCompletionStreamOptionsParam{IncludeUsage: oai.Bool(true)}}
	s := c.client.Chat.Completions.NewStreaming(ctx, lp, ignoreEOS)
	tokens := map[int64]int{}
	var usage oai.CompletionUsage
	for s.Next() {
		ev := s.Current()
		for _, ch := range ev.Choices {
			for _, l := range ch.Logprobs.Content {
				tokens[ch.Index]++
				if l.Logprob > 0 || len(l.TopLogprobs) != 4 {
					t.Errorf("choice %d: logprob %v with %d top, want ≤ 0 and 4", ch.Index, l.Logprob, len(l.TopLogprobs))
				}
			}
		}
		if ev.Usage.TotalTokens > 0 {
			usage = ev.Usage
		}
	}
	if err := s.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	if tokens[0] != 5 || tokens[1] != 5 || usage.CompletionTokens != 10 {
		t.Errorf("tokens with logprobs per choice %v, usage %+v; want 5 each and 10 in all", tokens, usage)
	}

	chat.ResponseFormat.OfJSONSchema.JSONSchema.Schema = map[string]any{"type": "string", "not": map[string]any{"const": "x"}}
	_, err = c.client.Chat.Completions.New(ctx, chat)
	var apiErr *oai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || apiErr.Param != "response_format.json_schema.schema.not" {
		t.Errorf("a schema with not: %v, want a 400 naming response_format.json_schema.schema.not", err)
	}
	_, err = c.client.Chat.Completions.New(ctx, oai.ChatCompletionNewParams{Model: "tiny",
		Messages: []oai.ChatCompletionMessageParamUnion{oai.UserMessage("x")}}, option.WithJSONSet("tools", []any{map[string]any{"type": "function"}}))
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || apiErr.Param != "tools[0].function" {
		t.Errorf("a tool without its function: %v, want a 400 naming tools[0].function", err)
	}
}

// POST /v1/embeddings is routed like chat: a worker of the model starts
// and answers.
func TestProcessEmbeddingsThroughTheQueen(t *testing.T) {
	c := startCluster(t, nil)
	res, err := c.client.Embeddings.New(t.Context(), oai.EmbeddingNewParams{Model: "tiny",
		Input: oai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: []string{"The bees", "A queen"}}})
	if err != nil {
		t.Fatalf("embeddings through the queen: %v", err)
	}
	if len(res.Data) != 2 || len(res.Data[0].Embedding) == 0 || res.Data[1].Index != 1 {
		t.Fatalf("answer %+v", res)
	}
	_, err = c.client.Embeddings.New(t.Context(), oai.EmbeddingNewParams{Model: "tiny", Dimensions: oai.Int(4),
		Input: oai.EmbeddingNewParamsInputUnion{OfString: oai.String("x")}})
	var apiErr *oai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || apiErr.Param != "dimensions" {
		t.Errorf("dimensions: %v, want a 400 naming dimensions", err)
	}
	// As many inputs as OpenAI takes, in a body over the queen's 1 MiB
	// limit for other requests (issue #31's item 4: 256 inputs at most,
	// and 413 below that); JSON's spaces make it big without making the
	// test model embed long texts.
	many := make([]string, openai.MaxEmbeddingInputs)
	for i := range many {
		many[i] = fmt.Sprintf("bee %d", i)
	}
	in, _ := json.Marshal(many)
	body := `{"model":"tiny","input":` + string(in) + strings.Repeat(" ", 3<<19) + `}`
	var big struct {
		Data []struct{ Index int }
	}
	resp, err := http.Post(c.url+"/v1/embeddings", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&big); err != nil || resp.StatusCode != http.StatusOK || len(big.Data) != len(many) || big.Data[len(many)-1].Index != len(many)-1 {
		t.Errorf("%d inputs in a body of %d KiB: %d, %d embeddings, %v", len(many), len(body)/1024, resp.StatusCode, len(big.Data), err)
	}
}
