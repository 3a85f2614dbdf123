//go:build !race

package queen

// The OpenAI request surface driven by the official npm clients (`openai`
// and `@anthropic-ai/sdk`) under node, through the queen and straight to
// the worker it started.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/apiary-llm/apiary/internal/keeper"
	"github.com/apiary-llm/apiary/internal/testbin"
	"github.com/apiary-llm/apiary/internal/testmodel"
)

// npmAnthropicVersion is the npm `@anthropic-ai/sdk` release the test runs.
const npmAnthropicVersion = "1.10.0"

// npmSurfaceRun is what testdata/npm-clients-surface.mjs prints.
type npmSurfaceRun struct {
	OpenAIVersion    string                           `json:"openai_version"`
	AnthropicVersion string                           `json:"anthropic_version"`
	NodeVersion      string                           `json:"node_version"`
	JSONSchema       struct{ Content, Finish string } `json:"json_schema"`
	ToolCall         npmToolAnswer                    `json:"tool_call"`
	ToolCallStreamed struct {
		npmToolAnswer
		Deltas int `json:"tool_call_deltas"`
	} `json:"tool_call_streamed"`
	RoundTrip struct {
		Content *string
		Finish  string
		Usage   struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
		}
	} `json:"round_trip"`
	Embeddings struct {
		Base64, Again, Float [][]float64
	}
	Logprobs []struct {
		Index  int
		Tokens []struct {
			Logprob float64
			Top     int
		}
	}
	LogprobsUsage struct {
		CompletionTokens int `json:"completion_tokens"`
	} `json:"logprobs_usage"`
	Penalties struct{ Plain, Frequency, Presence string }
	Messages  struct {
		ID, Type, Role string
		StopReason     string `json:"stop_reason"`
		Content        []struct{ Type, Text string }
		Usage          struct {
			InputTokens  int `json:"input_tokens"`
			OutputTokens int `json:"output_tokens"`
			CacheRead    int `json:"cache_read_input_tokens"`
		}
	}
	MessagesStreamed struct {
		Events     []string
		StopReason string `json:"stop_reason"`
		Content    []struct{ Type, Text string }
		Usage      struct {
			OutputTokens int `json:"output_tokens"`
		}
	} `json:"messages_streamed"`
	CountTokens struct {
		InputTokens int `json:"input_tokens"`
	} `json:"count_tokens"`
	MessagesTools struct {
		Called, Streamed, Answered struct {
			Content    []anthropicBlock
			StopReason string `json:"stop_reason"`
			Events     []string
		}
	} `json:"messages_tools"`
}

type anthropicBlock struct {
	Type, Text, ID, Name string
	Input                map[string]any
}

type npmToolAnswer struct {
	Finish  string
	Message struct {
		Content   *string
		ToolCalls []struct {
			ID       string
			Type     string
			Function struct{ Name, Arguments string }
		} `json:"tool_calls"`
	}
}

// Both npm clients, everything a real client sends, through the queen and
// straight to the worker: the same answers, each checked.
func TestProcessNPMClientsSurface(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("this test runs the npm clients with node (scripts/deps.sh installs it): %v", err)
	}
	openaiPrefix := testbin.NPM(t, "openai", npmOpenAIVersion)
	anthropicPrefix := testbin.NPM(t, "@anthropic-ai/sdk", npmAnthropicVersion)
	script, err := filepath.Abs(filepath.Join("testdata", "npm-clients-surface.mjs"))
	if err != nil {
		t.Fatal(err)
	}
	const token = "api-0123456789abcdef"
	c := startClusterWith(t, clusterOptions{model: testmodel.Options{ToolTemplate: true}, apiToken: token}, nil)

	run := func(base, key string) npmSurfaceRun {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), 3*waitLimit)
		defer cancel()
		cmd := exec.CommandContext(ctx, node, script)
		cmd.Env = append(os.Environ(), "BASE_URL="+base, "API_KEY="+key, "MODEL=tiny",
			"OPENAI_PREFIX="+openaiPrefix, "ANTHROPIC_PREFIX="+anthropicPrefix)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("node %s against %s: %v\nstderr:\n%s", script, base, err, stderr.String())
		}
		var r npmSurfaceRun
		if err := json.Unmarshal(stdout.Bytes(), &r); err != nil {
			t.Fatalf("the script printed %q: %v", stdout.String(), err)
		}
		return r
	}

	viaQueen := run(c.url, token)
	t.Logf("npm openai %s, @anthropic-ai/sdk %s, node %s", viaQueen.OpenAIVersion, viaQueen.AnthropicVersion, viaQueen.NodeVersion)
	if viaQueen.OpenAIVersion != npmOpenAIVersion || viaQueen.AnthropicVersion != npmAnthropicVersion {
		t.Errorf("the script loaded openai %s and @anthropic-ai/sdk %s, want %s and %s",
			viaQueen.OpenAIVersion, viaQueen.AnthropicVersion, npmOpenAIVersion, npmAnthropicVersion)
	}
	checkNPMSurface(t, "through the queen", viaQueen)

	rows, err := c.admin.Workers(t.Context(), keeper.WorkerFilter{})
	if err != nil || len(rows) != 1 || rows[0].URI == "" || rows[0].PID == nil {
		t.Fatalf("workers %+v %v, want the one that answered", rows, err)
	}
	direct := run(rows[0].URI, testbin.WorkerToken(t, *rows[0].PID))
	checkNPMSurface(t, "straight to the worker", direct)

	// Greedy answers are the same both ways.
	for _, p := range []struct{ what, queen, worker string }{
		{"json_schema", viaQueen.JSONSchema.Content, direct.JSONSchema.Content},
		{"tool call arguments", viaQueen.ToolCall.Message.ToolCalls[0].Function.Arguments, direct.ToolCall.Message.ToolCalls[0].Function.Arguments},
		{"penalised completion", viaQueen.Penalties.Frequency, direct.Penalties.Frequency},
	} {
		if p.queen != p.worker {
			t.Errorf("%s: %q through the queen, %q straight", p.what, p.queen, p.worker)
		}
	}
	if !slices.EqualFunc(viaQueen.Embeddings.Float, direct.Embeddings.Float, slices.Equal) {
		t.Errorf("embeddings differ between the queen and the worker")
	}
}

func checkNPMSurface(t *testing.T, how string, r npmSurfaceRun) {
	t.Helper()
	var bee struct {
		Name *string `json:"name"`
		N    *int    `json:"n"`
		Kind *string `json:"kind"`
	}
	dec := json.NewDecoder(strings.NewReader(r.JSONSchema.Content))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&bee); err != nil || bee.Name == nil || len([]rune(*bee.Name)) > 6 || bee.N == nil || *bee.N < 1 || *bee.N > 9 ||
		bee.Kind == nil || (*bee.Kind != "bee" && *bee.Kind != "wasp") {
		t.Errorf("%s: json_schema answer %q breaks the schema (%v)", how, r.JSONSchema.Content, err)
	}

	for name, a := range map[string]npmToolAnswer{"whole": r.ToolCall, "streamed": r.ToolCallStreamed.npmToolAnswer} {
		var args struct {
			City *string `json:"city"`
		}
		m := a.Message
		if a.Finish != "tool_calls" || len(m.ToolCalls) != 1 || m.ToolCalls[0].Type != "function" ||
			m.ToolCalls[0].ID == "" || m.ToolCalls[0].Function.Name != "get_weather" ||
			json.Unmarshal([]byte(m.ToolCalls[0].Function.Arguments), &args) != nil || args.City == nil || len([]rune(*args.City)) > 10 {
			t.Errorf("%s: %s forced tool call %+v, want one get_weather call with a city", how, name, a)
		}
	}
	if r.ToolCallStreamed.Deltas == 0 || r.ToolCallStreamed.Message.ToolCalls[0].Function.Arguments != r.ToolCall.Message.ToolCalls[0].Function.Arguments {
		t.Errorf("%s: the streamed call (%d tool_call deltas) assembled %+v, the whole one %+v", how,
			r.ToolCallStreamed.Deltas, r.ToolCallStreamed.Message, r.ToolCall.Message)
	}
	if rt := r.RoundTrip; rt.Content == nil || rt.Usage.CompletionTokens == 0 || rt.Usage.PromptTokens == 0 || (rt.Finish != "stop" && rt.Finish != "length") {
		t.Errorf("%s: the answer after the tool's result: %+v", how, rt)
	}

	e := r.Embeddings
	if len(e.Base64) != 2 || len(e.Again) != 1 || len(e.Float) != 1 || len(e.Base64[0]) == 0 {
		t.Fatalf("%s: embeddings %d/%d/%d vectors", how, len(e.Base64), len(e.Again), len(e.Float))
	}
	if !slices.Equal(e.Base64[0], e.Again[0]) {
		t.Errorf("%s: the same input embedded twice differs", how)
	}
	if slices.Equal(e.Base64[0], e.Base64[1]) {
		t.Errorf("%s: two inputs got the same embedding", how)
	}
	for i, f := range e.Float[0] {
		if math.Abs(f-e.Base64[0][i]) > 1e-6 {
			t.Errorf("%s: base64 and float embeddings differ at %d: %v vs %v", how, i, e.Base64[0][i], f)
			break
		}
	}
	for i, v := range e.Base64 {
		var norm float64
		for _, x := range v {
			norm += x * x
		}
		if math.Abs(math.Sqrt(norm)-1) > 1e-3 {
			t.Errorf("%s: embedding %d has norm %v, want 1", how, i, math.Sqrt(norm))
		}
	}

	if len(r.Logprobs) != 2 || r.LogprobsUsage.CompletionTokens != 10 {
		t.Errorf("%s: n=2 gave %d choices and %d completion tokens, want 2 and 10", how, len(r.Logprobs), r.LogprobsUsage.CompletionTokens)
	}
	for i, ch := range r.Logprobs {
		if ch.Index != i || len(ch.Tokens) != 5 {
			t.Errorf("%s: choice %d has index %d and %d tokens with logprobs, want %d and 5", how, i, ch.Index, len(ch.Tokens), i)
		}
		for _, tok := range ch.Tokens {
			if tok.Logprob > 0 || tok.Top != 3 {
				t.Errorf("%s: choice %d: logprob %v with %d top, want ≤ 0 and 3", how, i, tok.Logprob, tok.Top)
				break
			}
		}
	}

	p := r.Penalties
	if p.Plain == "" || p.Frequency == p.Plain || p.Presence == p.Plain {
		t.Errorf("%s: penalties left greedy output as it was: plain %q, frequency %q, presence %q", how, p.Plain, p.Frequency, p.Presence)
	}

	m := r.Messages
	if !strings.HasPrefix(m.ID, "msg_") || m.Type != "message" || m.Role != "assistant" || len(m.Content) != 1 || m.Content[0].Type != "text" ||
		m.Usage.InputTokens == 0 || m.Usage.OutputTokens == 0 || (m.StopReason != "max_tokens" && m.StopReason != "end_turn") {
		t.Errorf("%s: messages %+v", how, m)
	}
	// Anthropic tool use: a forced call is one tool_use block with an
	// input of the schema, stop_reason tool_use; streamed the same input
	// (input_json_delta events); after its tool_result the model answers.
	mt := r.MessagesTools
	for name, a := range map[string][]anthropicBlock{"whole": mt.Called.Content, "streamed": mt.Streamed.Content} {
		var uses []anthropicBlock
		for _, b := range a {
			if b.Type == "tool_use" {
				uses = append(uses, b)
			}
		}
		city, _ := func() (string, bool) {
			if len(uses) != 1 {
				return "", false
			}
			c, ok := uses[0].Input["city"].(string)
			return c, ok
		}()
		if len(uses) != 1 || uses[0].Name != "get_weather" || !strings.HasPrefix(uses[0].ID, "toolu_") || city == "" || len([]rune(city)) > 10 {
			t.Errorf("%s: messages %s forced tool use: %+v", how, name, a)
		}
	}
	if mt.Called.StopReason != "tool_use" || mt.Streamed.StopReason != "tool_use" || !slices.Contains(mt.Streamed.Events, "content_block_delta:input_json_delta") ||
		!slices.Contains(mt.Streamed.Events, "content_block_start:tool_use") {
		t.Errorf("%s: tool use stop reasons %q/%q, streamed events %v", how, mt.Called.StopReason, mt.Streamed.StopReason, mt.Streamed.Events)
	}
	if len(mt.Called.Content) > 0 && len(mt.Streamed.Content) > 0 &&
		fmt.Sprint(mt.Called.Content[len(mt.Called.Content)-1].Input) != fmt.Sprint(mt.Streamed.Content[len(mt.Streamed.Content)-1].Input) {
		t.Errorf("%s: streamed input %v, whole %v", how, mt.Streamed.Content, mt.Called.Content)
	}
	if len(mt.Answered.Content) == 0 || (mt.Answered.StopReason != "max_tokens" && mt.Answered.StopReason != "end_turn" && mt.Answered.StopReason != "tool_use") {
		t.Errorf("%s: after the tool_result: %+v", how, mt.Answered)
	}
	// count_tokens counts the prompt the same messages make: as
	// Anthropic's API, input_tokens leaves out what the cache held
	// (cache_read_input_tokens).
	if r.CountTokens.InputTokens != m.Usage.InputTokens+m.Usage.CacheRead {
		t.Errorf("%s: count_tokens %d, the message's input_tokens %d and cache_read_input_tokens %d", how, r.CountTokens.InputTokens, m.Usage.InputTokens, m.Usage.CacheRead)
	}
	ms := r.MessagesStreamed
	if len(ms.Events) < 5 || ms.Events[0] != "message_start" || ms.Events[len(ms.Events)-1] != "message_stop" ||
		len(ms.Content) != 1 || ms.Content[0].Text != m.Content[0].Text || ms.StopReason != m.StopReason || ms.Usage.OutputTokens != m.Usage.OutputTokens {
		t.Errorf("%s: streamed messages %+v, whole %+v", how, ms, m)
	}
}
