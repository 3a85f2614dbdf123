//go:build !race

package queen

import (
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/apiary-llm/apiary/internal/keeper"
	"github.com/apiary-llm/apiary/internal/testbin"
	"github.com/apiary-llm/apiary/internal/testmodel"
)

type responseItem struct {
	Type, Name, Arguments, Status string
	CallID                        string `json:"call_id"`
}

// The npm `openai` client's Responses API through the queen: the text is
// the chat completion's greedy text, whole and streamed (with the
// documented event sequence), a forced function call round-trips, a
// json_schema answer follows its schema, and previous_response_id is
// refused with the reason.
func TestProcessResponsesNPMClient(t *testing.T) {
	prefix := testbin.NPM(t, "openai", npmOpenAIVersion)
	const token = "api-0123456789abcdef"
	c := startClusterWith(t, clusterOptions{model: testmodel.Options{ToolTemplate: true}, apiToken: token}, nil)
	stdout := runNodeScript(t, "openai-responses.mjs", "BASE_URL="+c.url, "API_KEY="+token, "MODEL=tiny", "OPENAI_PREFIX="+prefix)
	type usage struct {
		InputTokens  int `json:"input_tokens"`
		OutputTokens int `json:"output_tokens"`
		TotalTokens  int `json:"total_tokens"`
	}
	var r struct {
		Version string
		Text    struct {
			OutputText string `json:"output_text"`
			Status     string
			Incomplete *struct{ Reason string }
			Usage      usage
			Model, ID  string
		}
		Call struct {
			Output []responseItem
			Status string
		}
		RoundTrip struct {
			OutputText string `json:"output_text"`
			Status     string
			Usage      usage
		} `json:"round_trip"`
		JSONSchema struct {
			OutputText string `json:"output_text"`
		} `json:"json_schema"`
		Streamed struct {
			Events     []string
			OutputText string `json:"output_text"`
			Status     string
			Usage      usage
		}
		CallStreamed struct {
			Events []string
			Output []responseItem
		} `json:"call_streamed"`
		Next struct {
			OutputText string `json:"output_text"`
			Previous   string
			Store      bool
		}
		Retrieved struct {
			ID         string
			OutputText string `json:"output_text"`
		}
		RetrieveDeleted struct {
			Status         int
			Message, Param string
		} `json:"retrieve_deleted"`
		PreviousDeleted struct {
			Status         int
			Message, Param string
		} `json:"previous_deleted"`
	}
	if err := json.Unmarshal(stdout, &r); err != nil {
		t.Fatalf("the script printed %q: %v", string(stdout), err)
	}
	if r.Version != npmOpenAIVersion {
		t.Errorf("openai %s, want %s", r.Version, npmOpenAIVersion)
	}
	want := openAIChatText(t, c.url, token)
	t.Logf("text %q; streamed events %v; call %+v", r.Text.OutputText, r.Streamed.Events, r.Call.Output)
	if r.Text.OutputText != want || r.Text.Status != "incomplete" || r.Text.Incomplete == nil || r.Text.Incomplete.Reason != "max_output_tokens" ||
		r.Text.Usage.OutputTokens != 8 || r.Text.Usage.InputTokens == 0 || r.Text.Usage.TotalTokens != r.Text.Usage.InputTokens+8 ||
		r.Text.Model != "tiny" || !strings.HasPrefix(r.Text.ID, "resp_") {
		t.Errorf("text: %+v, want %q, incomplete after 8 tokens", r.Text, want)
	}
	var args struct{ City *string }
	if len(r.Call.Output) != 1 || r.Call.Output[0].Type != "function_call" || r.Call.Output[0].Name != "get_weather" ||
		r.Call.Output[0].CallID == "" || json.Unmarshal([]byte(r.Call.Output[0].Arguments), &args) != nil || args.City == nil || r.Call.Status != "completed" {
		t.Errorf("forced call: %+v", r.Call)
	}
	if r.RoundTrip.OutputText == "" || r.RoundTrip.Usage.OutputTokens == 0 {
		t.Errorf("after the tool's output: %+v", r.RoundTrip)
	}
	var bee struct {
		Name *string
		N    *int
	}
	if err := json.Unmarshal([]byte(r.JSONSchema.OutputText), &bee); err != nil || bee.Name == nil || bee.N == nil || *bee.N < 1 || *bee.N > 9 {
		t.Errorf("json_schema: %q (%v)", r.JSONSchema.OutputText, err)
	}
	wantEvents := []string{"response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"}
	if r.Streamed.OutputText != want || r.Streamed.Status != "incomplete" || r.Streamed.Usage.OutputTokens != 8 ||
		!slices.Equal(r.Streamed.Events[:min(4, len(r.Streamed.Events))], wantEvents) ||
		!slices.Contains(r.Streamed.Events, "response.output_text.delta") ||
		!slices.Equal(r.Streamed.Events[max(0, len(r.Streamed.Events)-4):], []string{"response.output_text.done", "response.content_part.done", "response.output_item.done", "response.incomplete"}) {
		t.Errorf("streamed: %+v, want %q", r.Streamed, want)
	}
	if len(r.CallStreamed.Output) != 1 || r.CallStreamed.Output[0].Arguments != r.Call.Output[0].Arguments ||
		!slices.Contains(r.CallStreamed.Events, "response.function_call_arguments.delta") ||
		r.CallStreamed.Events[len(r.CallStreamed.Events)-1] != "response.completed" {
		t.Errorf("streamed call: %+v, want the whole answer's call %+v", r.CallStreamed, r.Call.Output)
	}
	// Straight to the worker: the same response, whole and streamed (a
	// worker keeps none: previous_response_id is refused there).
	rows, err := c.admin.Workers(t.Context(), keeper.WorkerFilter{})
	if err != nil || len(rows) != 1 || rows[0].PID == nil {
		t.Fatalf("workers %+v %v", rows, err)
	}
	wtok := testbin.WorkerToken(t, *rows[0].PID)
	var direct struct {
		Output []struct {
			Content []struct{ Text string }
		}
		Status string
	}
	postJSON(t, rows[0].URI+"/v1/responses", wtok, `{"model":"tiny","input":"Say hello to the bees.","max_output_tokens":8,"temperature":0}`, &direct)
	if len(direct.Output) != 1 || len(direct.Output[0].Content) != 1 || direct.Output[0].Content[0].Text != want || direct.Status != "incomplete" {
		t.Errorf("straight to the worker: %+v, want %q", direct, want)
	}
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, rows[0].URI+"/v1/responses",
		strings.NewReader(`{"model":"tiny","input":"Say hello to the bees.","max_output_tokens":8,"temperature":0,"stream":true}`))
	req.Header.Set("Authorization", "Bearer "+wtok)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	sse, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(sse), "event: response.output_text.delta") || !strings.Contains(string(sse), "event: response.incomplete") {
		t.Errorf("streamed straight to the worker: %s", sse)
	}

	// previous_response_id: the kept conversation, then the new input,
	// is what the model continues: the chat completion of the same
	// messages gives the same greedy text.
	var cont struct {
		Choices []struct{ Message struct{ Content string } }
	}
	conv, _ := json.Marshal([]map[string]string{{"role": "user", "content": "Say hello to the bees."},
		{"role": "assistant", "content": r.Text.OutputText}, {"role": "user", "content": "Again."}})
	postJSON(t, c.url+"/v1/chat/completions", token, `{"model":"tiny","max_tokens":8,"temperature":0,"messages":`+string(conv)+`}`, &cont)
	if r.Next.OutputText != cont.Choices[0].Message.Content || r.Next.Previous != r.Text.ID || !r.Next.Store {
		t.Errorf("continued: %+v, want %q after the kept conversation", r.Next, cont.Choices[0].Message.Content)
	}
	if r.Retrieved.ID != r.Text.ID || r.Retrieved.OutputText != r.Text.OutputText {
		t.Errorf("retrieved %+v, want %s", r.Retrieved, r.Text.ID)
	}
	if r.RetrieveDeleted.Status != 404 || r.PreviousDeleted.Status != 400 || r.PreviousDeleted.Param != "previous_response_id" ||
		!strings.Contains(r.PreviousDeleted.Message, "not found") {
		t.Errorf("after the delete: retrieve %+v, continue %+v", r.RetrieveDeleted, r.PreviousDeleted)
	}
}
