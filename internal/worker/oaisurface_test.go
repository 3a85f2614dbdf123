package worker

// What real OpenAI clients send, through the real worker binary and the
// official Go client: structured outputs, logprobs, several choices,
// seeds, penalties and biases.

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	oai "github.com/openai/openai-go"
	"github.com/openai/openai-go/option"
	"github.com/openai/openai-go/shared"
)

// personSchema bounds every string and number, so that even the random
// test model finishes the JSON within the token budget.
const personSchema = `{
	"type": "object",
	"properties": {
		"name": {"type": "string", "maxLength": 10},
		"age": {"type": "integer", "minimum": 0, "maximum": 150},
		"member": {"type": "boolean"},
		"role": {"enum": ["queen", "worker", "drone"]},
		"tags": {"type": "array", "items": {"$ref": "#/$defs/tag"}, "maxItems": 3},
		"note": {"anyOf": [{"type": "null"}, {"const": "none"}]}
	},
	"required": ["name", "age", "member", "role", "tags", "note"],
	"additionalProperties": false,
	"$defs": {"tag": {"type": "string", "minLength": 1, "maxLength": 4}}
}`

func jsonSchemaFormat(t *testing.T, schema string) oai.ChatCompletionNewParamsResponseFormatUnion {
	t.Helper()
	var s map[string]any
	if err := json.Unmarshal([]byte(schema), &s); err != nil {
		t.Fatal(err)
	}
	return oai.ChatCompletionNewParamsResponseFormatUnion{OfJSONSchema: &shared.ResponseFormatJSONSchemaParam{
		JSONSchema: shared.ResponseFormatJSONSchemaJSONSchemaParam{Name: "person", Strict: oai.Bool(true), Schema: s}}}
}

func chatParams(text string, maxTokens int64) oai.ChatCompletionNewParams {
	return oai.ChatCompletionNewParams{Model: "tiny", Messages: []oai.ChatCompletionMessageParamUnion{oai.UserMessage(text)},
		MaxCompletionTokens: oai.Int(maxTokens)}
}

func TestBinaryStructuredOutputs(t *testing.T) {
	_, url := startWorkerBinary(t, nil)
	checkStructuredOutputs(t, newOpenAIClient(url))
}

// checkStructuredOutputs asks for JSON in every way a client can and
// checks what comes back; the queen's tests run it through the queen.
func checkStructuredOutputs(t *testing.T, client oai.Client) {
	ctx := t.Context()
	var schema map[string]any
	if err := json.Unmarshal([]byte(personSchema), &schema); err != nil {
		t.Fatal(err)
	}
	for _, temp := range []float64{0, 1} {
		params := chatParams("Describe a bee as JSON.", 400)
		params.Temperature = oai.Float(temp)
		params.Seed = oai.Int(5)
		params.ResponseFormat = jsonSchemaFormat(t, personSchema)
		c, err := client.Chat.Completions.New(ctx, params)
		if err != nil {
			t.Fatalf("json_schema at temperature %v: %v", temp, err)
		}
		out := c.Choices[0].Message.Content
		var v any
		if err := json.Unmarshal([]byte(out), &v); err != nil {
			t.Fatalf("temperature %v: %q is not JSON: %v", temp, out, err)
		}
		if err := validate(schema, schema, v); err != nil {
			t.Errorf("temperature %v: %q breaks the schema: %v", temp, out, err)
		}
		if c.Choices[0].FinishReason != "stop" {
			t.Errorf("temperature %v: finish %q, want stop (the grammar ends the answer)", temp, c.Choices[0].FinishReason)
		}

		// The same, streamed.
		stream := client.Chat.Completions.NewStreaming(ctx, params)
		var got strings.Builder
		for stream.Next() {
			for _, ch := range stream.Current().Choices {
				got.WriteString(ch.Delta.Content)
			}
		}
		if err := stream.Err(); err != nil {
			t.Fatalf("stream: %v", err)
		}
		if got.String() != out {
			t.Errorf("temperature %v: the stream gave %q, the whole answer %q", temp, got.String(), out)
		}
	}

	params := chatParams("JSON please", 300)
	params.Temperature = oai.Float(0)
	params.ResponseFormat = oai.ChatCompletionNewParamsResponseFormatUnion{OfJSONObject: &shared.ResponseFormatJSONObjectParam{}}
	c, err := client.Chat.Completions.New(ctx, params)
	if err != nil {
		t.Fatalf("json_object: %v", err)
	}
	var obj map[string]any
	if err := json.Unmarshal([]byte(c.Choices[0].Message.Content), &obj); err != nil || c.Choices[0].FinishReason != "stop" {
		t.Errorf("json_object: %q (finish %s) is not a JSON object: %v", c.Choices[0].Message.Content, c.Choices[0].FinishReason, err)
	}
	// json_object with a schema (llama-server's and vLLM's extension,
	// which instructor's JSON_SCHEMA mode sends): the schema is enforced
	// (issue #31's item 6: it was dropped).
	var withSchema struct {
		Choices []struct {
			Message struct{ Content string }
		}
	}
	if err := client.Post(ctx, "chat/completions", map[string]any{"model": "tiny", "temperature": 0, "max_tokens": 300,
		"messages":        []map[string]string{{"role": "user", "content": "JSON please"}},
		"response_format": map[string]any{"type": "json_object", "schema": map[string]any{"type": "object", "required": []string{"bees"}, "additionalProperties": false, "properties": map[string]any{"bees": map[string]any{"type": "integer"}}}},
	}, &withSchema); err != nil {
		t.Fatalf("json_object with a schema: %v", err)
	}
	var bees struct{ Bees *int64 }
	if err := json.Unmarshal([]byte(withSchema.Choices[0].Message.Content), &bees); err != nil || bees.Bees == nil {
		t.Errorf("json_object with a schema: %q does not follow it: %v", withSchema.Choices[0].Message.Content, err)
	}

	// llama.cpp's grammar field, on completions.
	cp := oai.CompletionNewParams{Model: "tiny", Prompt: oai.CompletionNewParamsPromptUnion{OfString: oai.String("Answer:")},
		MaxTokens: oai.Int(20), Temperature: oai.Float(1), Seed: oai.Int(9)}
	cc, err := client.Completions.New(ctx, cp, option.WithJSONSet("grammar", `root ::= ("yes" | "no") "."`))
	if err != nil {
		t.Fatalf("grammar: %v", err)
	}
	if got := cc.Choices[0].Text; got != "yes." && got != "no." {
		t.Errorf("grammar: %q, want yes. or no.", got)
	}

	// What cannot be enforced is refused, naming it.
	for _, tt := range []struct {
		name   string
		schema string
		param  string
	}{
		{"pattern not anchored", `{"type":"object","properties":{"a":{"type":"string","pattern":"^x"}},"required":["a"],"additionalProperties":false}`,
			"response_format.json_schema.schema.properties.a.pattern"},
		{"not", `{"type":"object","properties":{"a":{"type":"string","not":{"const":"x"}}},"required":["a"],"additionalProperties":false}`,
			"response_format.json_schema.schema.properties.a.not"},
		{"strict without additionalProperties", `{"type":"object","properties":{"a":{"type":"string"}},"required":["a"]}`,
			"response_format.json_schema.schema.additionalProperties"},
	} {
		params := chatParams("x", 10)
		params.ResponseFormat = jsonSchemaFormat(t, tt.schema)
		_, err := client.Chat.Completions.New(ctx, params)
		var apiErr *oai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || apiErr.Param != tt.param {
			t.Errorf("%s: %v, want a 400 on %s", tt.name, err, tt.param)
		}
	}
	_, err = client.Completions.New(ctx, cp, option.WithJSONSet("grammar", `root ::= (`))
	var apiErr *oai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || apiErr.Param != "grammar" {
		t.Errorf("a broken grammar: %v, want a 400 on grammar", err)
	}
}

// validate checks v against the schema subset the worker supports.
func validate(root, schema map[string]any, v any) error {
	if ref, ok := schema["$ref"].(string); ok {
		defs, _ := root["$defs"].(map[string]any)
		def, _ := defs[strings.TrimPrefix(ref, "#/$defs/")].(map[string]any)
		return validate(root, def, v)
	}
	if alts, ok := schema["anyOf"].([]any); ok {
		for _, alt := range alts {
			if validate(root, alt.(map[string]any), v) == nil {
				return nil
			}
		}
		return fmt.Errorf("%v matches no anyOf", v)
	}
	if c, ok := schema["const"]; ok && c != v {
		return fmt.Errorf("%v is not the const %v", v, c)
	}
	if e, ok := schema["enum"].([]any); ok && !slices.Contains(e, v) {
		return fmt.Errorf("%v is not in %v", v, e)
	}
	num := func(k string) (float64, bool) { f, ok := schema[k].(float64); return f, ok }
	switch schema["type"] {
	case "object":
		o, ok := v.(map[string]any)
		if !ok {
			return fmt.Errorf("%v is not an object", v)
		}
		props, _ := schema["properties"].(map[string]any)
		for _, r := range schema["required"].([]any) {
			if _, ok := o[r.(string)]; !ok {
				return fmt.Errorf("%q is missing", r)
			}
		}
		for k, val := range o {
			p, ok := props[k].(map[string]any)
			if !ok {
				return fmt.Errorf("%q is not a property", k)
			}
			if err := validate(root, p, val); err != nil {
				return fmt.Errorf("%s: %w", k, err)
			}
		}
	case "array":
		a, ok := v.([]any)
		if !ok {
			return fmt.Errorf("%v is not an array", v)
		}
		if m, ok := num("maxItems"); ok && float64(len(a)) > m {
			return fmt.Errorf("%d items, at most %v", len(a), m)
		}
		for _, item := range a {
			if err := validate(root, schema["items"].(map[string]any), item); err != nil {
				return err
			}
		}
	case "string":
		s, ok := v.(string)
		if !ok {
			return fmt.Errorf("%v is not a string", v)
		}
		n := float64(utf8.RuneCountInString(s))
		if m, ok := num("maxLength"); ok && n > m {
			return fmt.Errorf("%q is longer than %v", s, m)
		}
		if m, ok := num("minLength"); ok && n < m {
			return fmt.Errorf("%q is shorter than %v", s, m)
		}
	case "integer":
		f, ok := v.(float64)
		if !ok || f != math.Trunc(f) {
			return fmt.Errorf("%v is not an integer", v)
		}
		if m, ok := num("minimum"); ok && f < m {
			return fmt.Errorf("%v < %v", f, m)
		}
		if m, ok := num("maximum"); ok && f > m {
			return fmt.Errorf("%v > %v", f, m)
		}
	case "boolean":
		if _, ok := v.(bool); !ok {
			return fmt.Errorf("%v is not a boolean", v)
		}
	case "null":
		if v != nil {
			return fmt.Errorf("%v is not null", v)
		}
	}
	return nil
}

func TestBinarySamplingLogprobsAndChoices(t *testing.T) {
	_, url := startWorkerBinary(t, nil, "--slots", "2")
	checkSamplingLogprobsAndChoices(t, newOpenAIClient(url))
}

// checkSamplingLogprobsAndChoices checks seeds, penalties, logit_bias,
// logprobs and n; the queen's tests run it through the queen.
func checkSamplingLogprobsAndChoices(t *testing.T, client oai.Client) {
	ctx := t.Context()
	ignoreEOS := option.WithJSONSet("ignore_eos", true)
	text := func(params oai.CompletionNewParams, opts ...option.RequestOption) string {
		t.Helper()
		c, err := client.Completions.New(ctx, params, append(opts, ignoreEOS)...)
		if err != nil {
			t.Fatal(err)
		}
		return c.Choices[0].Text
	}
	base := oai.CompletionNewParams{Model: "tiny", Prompt: oai.CompletionNewParamsPromptUnion{OfString: oai.String("Once upon a time")},
		MaxTokens: oai.Int(24), Temperature: oai.Float(1)}

	t.Run("seeds", func(t *testing.T) {
		seeded := base
		seeded.Seed = oai.Int(42)
		a, b := text(seeded), text(seeded)
		seeded.Seed = oai.Int(43)
		c := text(seeded)
		if a != b {
			t.Errorf("seed 42 gave %q, then %q", a, b)
		}
		if a == c {
			t.Errorf("seeds 42 and 43 both gave %q", a)
		}
	})

	t.Run("penalties and biases change greedy output", func(t *testing.T) {
		greedy := base
		greedy.Temperature = oai.Float(0)
		plain := text(greedy)
		withFreq := greedy
		withFreq.FrequencyPenalty = oai.Float(2)
		if got := text(withFreq); got == plain {
			t.Errorf("frequency_penalty 2 left %q as it was", plain)
		}
		if got := text(greedy, option.WithJSONSet("repeat_penalty", 1.5)); got == plain {
			t.Errorf("repeat_penalty 1.5 left %q as it was", plain)
		}
		biased := greedy
		biased.LogitBias = map[string]int64{"100": 100} // token 100 is the byte 0x61, "a"
		if got := text(biased); got != strings.Repeat("a", 24) {
			t.Errorf("logit_bias +100 on token 100 gave %q, want 24 a's", got)
		}
	})

	t.Run("chat logprobs", func(t *testing.T) {
		params := chatParams("Hello", 8)
		params.Temperature = oai.Float(0)
		params.Logprobs = oai.Bool(true)
		params.TopLogprobs = oai.Int(3)
		c, err := client.Chat.Completions.New(ctx, params, ignoreEOS)
		if err != nil {
			t.Fatal(err)
		}
		lps := c.Choices[0].Logprobs.Content
		if len(lps) != 8 {
			t.Fatalf("%d token logprobs, want 8", len(lps))
		}
		var joined []byte
		for i, lp := range lps {
			if lp.Logprob > 0 || len(lp.TopLogprobs) != 3 {
				t.Errorf("token %d: logprob %v with %d top, want ≤ 0 and 3", i, lp.Logprob, len(lp.TopLogprobs))
				continue
			}
			// Greedy: the chosen token is the likeliest of the top ones.
			if lp.TopLogprobs[0].Logprob != lp.Logprob || !slices.Equal(lp.TopLogprobs[0].Bytes, lp.Bytes) {
				t.Errorf("token %d: chosen %q (%v) is not the first of %+v", i, lp.Token, lp.Logprob, lp.TopLogprobs)
			}
			for _, b := range lp.Bytes {
				joined = append(joined, byte(b))
			}
		}
		if len(joined) == 0 {
			t.Error("the tokens carry no bytes")
		}

		// Streamed: the same tokens, spread over the chunks.
		stream := client.Chat.Completions.NewStreaming(ctx, params, ignoreEOS)
		var streamed []oai.ChatCompletionTokenLogprob
		for stream.Next() {
			for _, ch := range stream.Current().Choices {
				streamed = append(streamed, ch.Logprobs.Content...)
			}
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		if len(streamed) != len(lps) {
			t.Fatalf("stream: %d token logprobs, want %d", len(streamed), len(lps))
		}
		// The second run finds the prompt in the slot's memory and decodes
		// only its last token: the logits agree to float rounding (a batch
		// of one sums in another order), not to the last bit.
		for i := range lps {
			if math.Abs(streamed[i].Logprob-lps[i].Logprob) > 1e-4 || streamed[i].Token != lps[i].Token {
				t.Errorf("token %d: streamed %q %v, whole %q %v", i, streamed[i].Token, streamed[i].Logprob, lps[i].Token, lps[i].Logprob)
			}
		}
	})

	t.Run("completion logprobs", func(t *testing.T) {
		params := base
		params.Temperature = oai.Float(0)
		params.MaxTokens = oai.Int(6)
		params.Logprobs = oai.Int(2)
		c, err := client.Completions.New(ctx, params, ignoreEOS)
		if err != nil {
			t.Fatal(err)
		}
		lp := c.Choices[0].Logprobs
		if len(lp.Tokens) != 6 || len(lp.TokenLogprobs) != 6 || len(lp.TopLogprobs) != 6 || len(lp.TextOffset) != 6 {
			t.Fatalf("logprobs %+v, want 6 of each", lp)
		}
		for i := range lp.Tokens {
			if lp.TokenLogprobs[i] > 0 || len(lp.TopLogprobs[i]) == 0 || len(lp.TopLogprobs[i]) > 2 {
				t.Errorf("token %d: logprob %v, top %v", i, lp.TokenLogprobs[i], lp.TopLogprobs[i])
			}
			if best := slices.Max(mapValues(lp.TopLogprobs[i])); best != lp.TokenLogprobs[i] {
				t.Errorf("token %d: greedy chose logprob %v, the best of the top is %v", i, lp.TokenLogprobs[i], best)
			}
		}
	})

	t.Run("n choices", func(t *testing.T) {
		params := chatParams("Hello", 10)
		params.Temperature = oai.Float(1)
		params.Seed = oai.Int(7)
		params.N = oai.Int(3)
		c, err := client.Chat.Completions.New(ctx, params, ignoreEOS)
		if err != nil {
			t.Fatal(err)
		}
		if len(c.Choices) != 3 || c.Usage.CompletionTokens != 30 || c.Usage.TotalTokens != c.Usage.PromptTokens+30 {
			t.Fatalf("%d choices, usage %+v; want 3 choices of 10 tokens", len(c.Choices), c.Usage)
		}
		texts := map[string]bool{}
		for i, ch := range c.Choices {
			if ch.Index != int64(i) || ch.FinishReason != "length" {
				t.Errorf("choice %d: index %d finish %q", i, ch.Index, ch.FinishReason)
			}
			texts[ch.Message.Content] = true
		}
		if len(texts) < 2 {
			t.Errorf("3 sampled choices were all %q", c.Choices[0].Message.Content)
		}
		// Choice i is what a request of its own with seed 7+i gets, whether
		// it ran beside others (their prompt decoded once) or after them.
		for i, ch := range c.Choices {
			one := params
			one.N, one.Seed = oai.Int(1), oai.Int(7+int64(i))
			alone, err := client.Chat.Completions.New(ctx, one, ignoreEOS)
			if err != nil {
				t.Fatal(err)
			}
			if alone.Choices[0].Message.Content != ch.Message.Content {
				t.Errorf("choice %d %q, alone with seed %d %q", i, ch.Message.Content, 7+i, alone.Choices[0].Message.Content)
			}
		}

		params.StreamOptions = oai.ChatCompletionStreamOptionsParam{IncludeUsage: oai.Bool(true)}
		stream := client.Chat.Completions.NewStreaming(ctx, params, ignoreEOS)
		got := make([]strings.Builder, 3)
		finished := 0
		interleaved := false // a piece of choice 1 came before choice 0 ended
		var usage oai.CompletionUsage
		for stream.Next() {
			ev := stream.Current()
			for _, ch := range ev.Choices {
				got[ch.Index].WriteString(ch.Delta.Content)
				if ch.Index == 1 && ch.Delta.Content != "" && finished == 0 {
					interleaved = true
				}
				if ch.FinishReason != "" {
					finished++
				}
			}
			if ev.Usage.TotalTokens > 0 {
				usage = ev.Usage
			}
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		for i := range got {
			if got[i].String() != c.Choices[i].Message.Content {
				t.Errorf("streamed choice %d %q, whole %q", i, got[i].String(), c.Choices[i].Message.Content)
			}
		}
		if finished != 3 || usage.CompletionTokens != 30 {
			t.Errorf("stream: %d finish reasons, usage %+v; want 3 and 30 completion tokens", finished, usage)
		}
		if !interleaved {
			t.Errorf("with two slots, choices 0 and 1 did not stream at once")
		}
	})
}

func mapValues(m map[string]float64) []float64 {
	out := make([]float64, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	return out
}

func TestBinaryEmbeddings(t *testing.T) {
	_, url := startWorkerBinary(t, nil)
	checkEmbeddings(t, newOpenAIClient(url))
}

// checkEmbeddings: deterministic, unit norm, distinct for distinct
// inputs, base64 the same vectors; dimensions other than the model's
// refused.
func checkEmbeddings(t *testing.T, client oai.Client) {
	ctx := t.Context()
	params := oai.EmbeddingNewParams{Model: "tiny", Input: oai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: []string{"The bees", "A queen", "The bees"}}}
	res, err := client.Embeddings.New(ctx, params)
	if err != nil {
		t.Fatalf("embeddings: %v", err)
	}
	if len(res.Data) != 3 || res.Usage.PromptTokens == 0 || res.Model != "tiny" {
		t.Fatalf("embeddings answer %+v", res)
	}
	for i, d := range res.Data {
		var norm float64
		for _, x := range d.Embedding {
			norm += x * x
		}
		if d.Index != int64(i) || len(d.Embedding) == 0 || math.Abs(norm-1) > 1e-4 {
			t.Errorf("embedding %d: index %d, %d dimensions, norm² %v", i, d.Index, len(d.Embedding), norm)
		}
	}
	if !slices.Equal(res.Data[0].Embedding, res.Data[2].Embedding) {
		t.Error("the same input gave two embeddings")
	}
	if slices.Equal(res.Data[0].Embedding, res.Data[1].Embedding) {
		t.Error("two inputs gave the same embedding")
	}
	// The Go client reads only float answers; base64 is read here.
	var b64 struct {
		Data []struct {
			Embedding string `json:"embedding"`
		} `json:"data"`
	}
	if err := client.Post(ctx, "embeddings", map[string]any{"model": "tiny", "input": "A queen", "encoding_format": "base64"}, &b64); err != nil {
		t.Fatalf("base64 embeddings: %v", err)
	}
	raw, err := base64.StdEncoding.DecodeString(b64.Data[0].Embedding)
	if err != nil || len(raw) != 4*len(res.Data[1].Embedding) {
		t.Fatalf("base64 embedding of %d bytes (%v), want %d", len(raw), err, 4*len(res.Data[1].Embedding))
	}
	for k, want := range res.Data[1].Embedding {
		if got := math.Float32frombits(binary.LittleEndian.Uint32(raw[4*k:])); got != float32(want) {
			t.Fatalf("base64 dimension %d is %v, float %v", k, got, want)
		}
	}
	params.Dimensions = oai.Int(8)
	_, err = client.Embeddings.New(ctx, params)
	var apiErr *oai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || apiErr.Param != "dimensions" {
		t.Errorf("dimensions: %v, want a 400 on dimensions", err)
	}
	// The model's own size may be asked for (as clients send it).
	params.Dimensions = oai.Int(int64(len(res.Data[0].Embedding)))
	if same, err := client.Embeddings.New(ctx, params); err != nil || !slices.Equal(same.Data[0].Embedding, res.Data[0].Embedding) {
		t.Errorf("dimensions = the model's %d: %v", len(res.Data[0].Embedding), err)
	}
}
