//go:build !race

package queen

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/apiary-llm/apiary/internal/testbin"
	"github.com/apiary-llm/apiary/internal/testmodel"
)

// The npm releases the Responses API is checked with as OpenAI answers
// it: the newest `openai` (7.x, which @openai/agents builds on), the
// newest @openai/agents and the zod its output types are written in.
const (
	npmOpenAI7Version = "7.59.0"
	npmAgentsVersion  = "0.20.0"
	npmZodVersion     = "4.6.7"
)

// The Responses API as this year's OpenAI clients expect it: the npm
// `openai` client's responses.create and responses.stream with fields
// the server does not know are answered (200), a response cut by
// max_output_tokens says incomplete on its items too (whole, in the
// streamed output_item.done and the final response), tool_choice
// "required" beside a json_schema text.format is a call of the tool;
// and @openai/agents with a function tool, tool_choice "required" and a
// zod output type runs to a final output the schema validates, whole
// and streamed.
func TestProcessResponsesAsOpenAIAnswers(t *testing.T) {
	openaiPrefix := testbin.NPM(t, "openai", npmOpenAI7Version)
	agentsPrefix := testbin.NPM(t, "@openai/agents", npmAgentsVersion)
	zodPrefix := testbin.NPM(t, "zod", npmZodVersion)
	const token = "api-0123456789abcdef"
	c := startClusterWith(t, clusterOptions{model: testmodel.Options{ToolTemplate: true}, apiToken: token}, nil)
	env := []string{"BASE_URL=" + c.url, "API_KEY=" + token, "MODEL=tiny", "OPENAI_PREFIX=" + openaiPrefix}

	type item struct{ Type, Status string }
	var f struct {
		Version string
		Whole   struct {
			Status     string
			Incomplete *struct{ Reason string }
			Items      []item
			OutputText string `json:"output_text"`
		}
		Streamed struct {
			Status     string
			Items      []item
			Done       []item
			OutputText string `json:"output_text"`
		}
		Forced struct {
			Status string
			Output []responseItem
			Text   struct{ Format struct{ Type, Name string } }
		}
	}
	stdout := runNodeScript(t, "openai-responses-fields.mjs", env...)
	if err := json.Unmarshal(stdout, &f); err != nil {
		t.Fatalf("the script printed %q: %v", string(stdout), err)
	}
	t.Logf("openai %s: %s", f.Version, stdout)
	if f.Version != npmOpenAI7Version {
		t.Errorf("openai %s, want %s", f.Version, npmOpenAI7Version)
	}
	cut := []item{{"message", "incomplete"}}
	if f.Whole.Status != "incomplete" || f.Whole.Incomplete == nil || f.Whole.Incomplete.Reason != "max_output_tokens" ||
		!slices.Equal(f.Whole.Items, cut) || f.Whole.OutputText == "" {
		t.Errorf("whole, with unknown fields: %+v, want incomplete with its message incomplete", f.Whole)
	}
	if f.Streamed.Status != "incomplete" || !slices.Equal(f.Streamed.Items, cut) || !slices.Equal(f.Streamed.Done, cut) ||
		f.Streamed.OutputText != f.Whole.OutputText {
		t.Errorf("streamed, with unknown fields: %+v, want incomplete with its message incomplete, the text %q", f.Streamed, f.Whole.OutputText)
	}
	var city struct{ City *string }
	if f.Forced.Status != "completed" || len(f.Forced.Output) != 1 || f.Forced.Output[0].Type != "function_call" ||
		f.Forced.Output[0].Name != "get_weather" || json.Unmarshal([]byte(f.Forced.Output[0].Arguments), &city) != nil || city.City == nil ||
		f.Forced.Text.Format.Type != "json_schema" || f.Forced.Text.Format.Name != "bee" {
		t.Errorf("tool_choice required with a json_schema format: %+v, want a call of get_weather and the format echoed", f.Forced)
	}

	type run struct {
		FinalOutput *struct {
			Name *string
			N    *int
		} `json:"final_output"`
		Valid     bool
		Items     []string
		Responses int
		Calls     []string
	}
	var a struct {
		Versions struct{ OpenAI, Agents, Zod string }
		Run      run
		Streamed run
	}
	stdout = runNodeScript(t, "openai-agents.mjs", append(env, "AGENTS_PREFIX="+agentsPrefix, "ZOD_PREFIX="+zodPrefix)...)
	if err := json.Unmarshal(stdout, &a); err != nil {
		t.Fatalf("the script printed %q: %v", string(stdout), err)
	}
	t.Logf("@openai/agents: %s", stdout)
	if a.Versions.OpenAI != npmOpenAI7Version || a.Versions.Agents != npmAgentsVersion || a.Versions.Zod != npmZodVersion {
		t.Errorf("versions %+v, want openai %s, @openai/agents %s, zod %s", a.Versions, npmOpenAI7Version, npmAgentsVersion, npmZodVersion)
	}
	// The first turn forces the call; the SDK then resets tool_choice,
	// and the second answers in the output type.
	want := []string{"tool_call_item", "tool_call_output_item", "message_output_item"}
	for name, r := range map[string]run{"run": a.Run, "streamed run": a.Streamed} {
		if r.FinalOutput == nil || r.FinalOutput.Name == nil || r.FinalOutput.N == nil || !r.Valid ||
			!slices.Equal(r.Items, want) || r.Responses != 2 || len(r.Calls) != 1 {
			t.Errorf("%s: %+v, want a tool call, its output and a final output the schema validates, in 2 responses", name, r)
		}
	}
}
