package llamacpp_test

import (
	"encoding/json"
	"errors"
	"math"
	"regexp"
	"strings"
	"testing"

	"github.com/apiary-llm/apiary/internal/chat"
	"github.com/apiary-llm/apiary/internal/engine"
	"github.com/apiary-llm/apiary/internal/llamacpp"
	"github.com/google/go-cmp/cmp"
)

// text runs one generation and returns its text and tokens.
func text(t *testing.T, e *llamacpp.Engine, req engine.Request) (string, []engine.Token) {
	t.Helper()
	var b strings.Builder
	var toks []engine.Token
	if _, err := e.Generate(t.Context(), req, func(tok engine.Token) error {
		b.Write(tok.Piece)
		toks = append(toks, tok)
		return nil
	}); err != nil {
		t.Fatalf("Generate: %v", err)
	}
	return b.String(), toks
}

func TestRepeatPenaltyChangesGreedyOutput(t *testing.T) {
	e := load(t, 1)
	base := engine.Request{Prompt: prompt(t, e, "The bees"), MaxTokens: 48, IgnoreEOS: true}
	plain, _ := collect(t, e, base)
	req := base
	req.RepeatPenalty = 1.5
	a, _ := collect(t, e, req)
	b, _ := collect(t, e, req)
	if cmp.Equal(a, plain) {
		t.Error("repeat_penalty 1.5 left the greedy output as it was")
	}
	if !cmp.Equal(a, b) {
		t.Error("repeat_penalty 1.5: two greedy runs differ")
	}
	req.RepeatPenalty = 1 // off
	if c, _ := collect(t, e, req); !cmp.Equal(c, plain) {
		t.Error("repeat_penalty 1 changed the greedy output")
	}
}

func TestLogitBiasForcesAndBansTokens(t *testing.T) {
	e := load(t, 1)
	base := engine.Request{Prompt: prompt(t, e, "The bees"), MaxTokens: 8, IgnoreEOS: true}
	plain, _ := collect(t, e, base)

	forced := base
	forced.LogitBias = map[int]float32{100: 100}
	got, _ := collect(t, e, forced)
	if want := []int{100, 100, 100, 100, 100, 100, 100, 100}; !cmp.Equal(got, want) {
		t.Errorf("bias +100 on token 100: tokens %v, want only 100", got)
	}

	banned := base
	banned.LogitBias = map[int]float32{plain[0]: -100}
	got, _ = collect(t, e, banned)
	if got[0] == plain[0] {
		t.Errorf("bias -100 on token %d: it still came first", plain[0])
	}

	bad := base
	bad.LogitBias = map[int]float32{e.Info().Vocab: 1}
	if _, _, err := generate(t.Context(), e, bad); !errors.Is(err, engine.ErrTokenID) {
		t.Errorf("bias on token %d (past the vocabulary): err %v, want ErrTokenID", e.Info().Vocab, err)
	}
}

// A JSON schema constrains even a random-weight model to JSON the schema
// accepts, and it ends at the end of the JSON.
func TestJSONSchemaConstrainsOutput(t *testing.T) {
	e := load(t, 1)
	schema := `{"type":"object","properties":{"name":{"type":"string","maxLength":8},"ok":{"type":"boolean"},` +
		`"n":{"type":"integer","minimum":0,"maximum":99},"color":{"enum":["red","green"]}},` +
		`"required":["name","ok","n","color"],"additionalProperties":false}`
	for _, temp := range []float32{0, 1} {
		out, _ := text(t, e, engine.Request{Prompt: prompt(t, e, "JSON:"), MaxTokens: 200, Temperature: temp, Seed: 7,
			JSONSchema: []byte(schema)})
		var got struct {
			Name  *string
			OK    *bool
			N     *int
			Color *string
		}
		dec := json.NewDecoder(strings.NewReader(out))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&got); err != nil {
			t.Fatalf("temperature %v: output %q is not the schema's JSON: %v", temp, out, err)
		}
		if got.Name == nil || len([]rune(*got.Name)) > 8 || got.OK == nil || got.N == nil || *got.N < 0 || *got.N > 99 ||
			got.Color == nil || (*got.Color != "red" && *got.Color != "green") {
			t.Errorf("temperature %v: output %q breaks the schema", temp, out)
		}
	}
}

// What the schema checker now lets through (issue #31's item 5) and
// llama.cpp enforces: a pattern, and the uuid and date formats.
func TestJSONSchemaPatternAndFormats(t *testing.T) {
	e := load(t, 1)
	schema := `{"type":"object","properties":{"code":{"type":"string","pattern":"^[A-Z]{3}-[0-9]{2}$"},` +
		`"id":{"type":"string","format":"uuid"},"day":{"type":"string","format":"date"}},` +
		`"required":["code","id","day"],"additionalProperties":false}`
	for _, temp := range []float32{0, 1} {
		out, _ := text(t, e, engine.Request{Prompt: prompt(t, e, "JSON:"), MaxTokens: 300, Temperature: temp, Seed: 11,
			JSONSchema: []byte(schema)})
		var got struct{ Code, ID, Day string }
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Fatalf("temperature %v: output %q is not the schema's JSON: %v", temp, out, err)
		}
		if !regexp.MustCompile(`^[A-Z]{3}-[0-9]{2}$`).MatchString(got.Code) ||
			!regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`).MatchString(got.ID) ||
			!regexp.MustCompile(`^[0-9]{4}-[0-9]{2}-[0-9]{2}$`).MatchString(got.Day) {
			t.Errorf("temperature %v: output %q breaks the pattern or a format", temp, out)
		}
	}
}

func TestGrammarConstrainsOutput(t *testing.T) {
	e := load(t, 1)
	out, _ := text(t, e, engine.Request{Prompt: prompt(t, e, "x"), MaxTokens: 50, Temperature: 1, Seed: 3,
		Grammar: `root ::= ("yes" | "no") "!"`})
	if out != "yes!" && out != "no!" {
		t.Fatalf("output %q, want yes! or no!", out)
	}
	for _, bad := range []engine.Request{
		{Prompt: []int{1}, MaxTokens: 1, Grammar: `root ::= (`},
		{Prompt: []int{1}, MaxTokens: 1, JSONSchema: []byte(`{"$ref":"#/nowhere"}`)},
		{Prompt: []int{1}, MaxTokens: 1, JSONSchema: []byte(`not json`)},
	} {
		if _, _, err := generate(t.Context(), e, bad); !errors.Is(err, engine.ErrGrammar) {
			t.Errorf("grammar %q schema %q: err %v, want ErrGrammar", bad.Grammar, bad.JSONSchema, err)
		}
	}
}

func TestLogprobsAreTheModelsDistribution(t *testing.T) {
	e := load(t, 1)
	_, toks := text(t, e, engine.Request{Prompt: prompt(t, e, "The bees"), MaxTokens: 12, IgnoreEOS: true, Logprobs: true, TopLogprobs: 5})
	if len(toks) != 12 {
		t.Fatalf("%d tokens, want 12", len(toks))
	}
	for i, tok := range toks {
		if tok.Logprob > 0 || len(tok.Top) != 5 {
			t.Fatalf("token %d: logprob %v with %d alternatives; want ≤ 0 and 5", i, tok.Logprob, len(tok.Top))
		}
		// Greedy: the chosen token is the likeliest.
		if tok.Top[0].ID != tok.ID || tok.Top[0].Logprob != tok.Logprob {
			t.Errorf("token %d: chosen %d (%v), top %d (%v)", i, tok.ID, tok.Logprob, tok.Top[0].ID, tok.Top[0].Logprob)
		}
		var mass float64
		for j, alt := range tok.Top {
			if j > 0 && alt.Logprob > tok.Top[j-1].Logprob {
				t.Errorf("token %d: alternatives not in order: %v", i, tok.Top)
			}
			mass += math.Exp(float64(alt.Logprob))
		}
		if mass > 1.0001 {
			t.Errorf("token %d: the top 5 hold probability %v > 1", i, mass)
		}
	}
	// Without logprobs asked, none are computed.
	_, toks = text(t, e, engine.Request{Prompt: prompt(t, e, "The bees"), MaxTokens: 2, IgnoreEOS: true})
	if toks[0].Logprob != 0 || toks[0].Top != nil {
		t.Errorf("logprobs filled without being asked: %+v", toks[0])
	}
}

func TestEmbeddingsAreDeterministicNormalisedAndDistinct(t *testing.T) {
	e := load(t, 1)
	a, err := e.Embed(t.Context(), prompt(t, e, "The bees"))
	if err != nil {
		t.Fatal(err)
	}
	again, err := e.Embed(t.Context(), prompt(t, e, "The bees"))
	if err != nil {
		t.Fatal(err)
	}
	other, err := e.Embed(t.Context(), prompt(t, e, "A queen"))
	if err != nil {
		t.Fatal(err)
	}
	var norm float64
	for _, x := range a {
		norm += float64(x) * float64(x)
	}
	if len(a) != 64 || math.Abs(norm-1) > 1e-4 {
		t.Errorf("embedding of %d dimensions with norm² %v; want 64 and 1", len(a), norm)
	}
	if !cmp.Equal(a, again) {
		t.Error("the same input gave two embeddings")
	}
	if cmp.Equal(a, other) {
		t.Error("two inputs gave the same embedding")
	}
	// Generation still works beside the embeddings context.
	if _, res := collect(t, e, engine.Request{Prompt: prompt(t, e, "q"), MaxTokens: 3, IgnoreEOS: true}); res.CompletionTokens != 3 {
		t.Errorf("generation after embeddings: %+v", res)
	}
}

// TestWrappedSchemaForcesToolCalls: a schema wrapped in a family's call
// syntax (chat.Syntax.Constraint) gives calls that the family's parser
// reads back, one or several, on the random-weight model.
func TestWrappedSchemaForcesToolCalls(t *testing.T) {
	e := load(t, 1)
	tools := []chat.Tool{
		{Name: "get_weather", Parameters: json.RawMessage(`{"type":"object","properties":{"city":{"type":"string","maxLength":8}},"required":["city"],"additionalProperties":false}`)},
		{Name: "ping"},
	}
	for _, syn := range []chat.Syntax{chat.Hermes, chat.Llama3, chat.Mistral} {
		for _, parallel := range []bool{false, true} {
			schema, w := syn.Constraint(tools, parallel)
			out, _ := text(t, e, engine.Request{Prompt: prompt(t, e, "call"), MaxTokens: 400, Temperature: 1, Seed: 5,
				JSONSchema: schema, Wrap: &engine.GrammarWrap{Prefix: w.Prefix, Suffix: w.Suffix, Separator: w.Separator, Repeat: w.Repeat}})
			content, calls := syn.Parse(out)
			if content != "" || len(calls) == 0 || (!parallel && len(calls) != 1) {
				t.Errorf("%v parallel=%v: output %q parses as content %q and calls %+v", syn, parallel, out, content, calls)
				continue
			}
			for _, c := range calls {
				if c.Name != "get_weather" && c.Name != "ping" {
					t.Errorf("%v: call of %q", syn, c.Name)
				}
			}
		}
	}
}

func TestWrapGrammarText(t *testing.T) {
	g := llamacpp.WrapGrammar("root ::= \"x\"\nspace ::= \" \"?", engine.GrammarWrap{Prefix: "<a>\n\"", Suffix: "</a>", Separator: "\n", Repeat: true})
	want := "root ::= \"<a>\\n\\\"\" apiary-wrapped-root \"</a>\" (\"\\n\" \"<a>\\n\\\"\" apiary-wrapped-root \"</a>\")*\n" +
		"apiary-wrapped-root ::= \"x\"\nspace ::= \" \"?"
	if g != want {
		t.Errorf("wrapped grammar\n%s\nwant\n%s", g, want)
	}
	if g := llamacpp.WrapGrammar("root ::= \"x\"", engine.GrammarWrap{}); g != "root ::= apiary-wrapped-root\napiary-wrapped-root ::= \"x\"" {
		t.Errorf("empty wrap: %q", g)
	}
}
