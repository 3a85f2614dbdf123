//go:build !race

package queen

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/apiary-llm/apiary/internal/testmodel"
)

// A named tool_choice is exactly one call of that function (OpenAI
// documents one), whatever parallel_tool_calls says, whole and streamed,
// through the queen; "required" with parallel calls allowed may make
// several.
func TestNamedToolChoiceIsOneCall(t *testing.T) {
	const token = "api-0123456789abcdef"
	c := startClusterWith(t, clusterOptions{model: testmodel.Options{ToolTemplate: true}, apiToken: token}, nil)
	tools := `[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string","maxLength":4}},"required":["city"],"additionalProperties":false}}},
		{"type":"function","function":{"name":"get_time","parameters":{"type":"object","properties":{"zone":{"type":"string","maxLength":4}},"required":["zone"],"additionalProperties":false}}}]`
	calls := func(choice string, stream bool) []string {
		t.Helper()
		body := `{"model":"tiny","messages":[{"role":"user","content":"Weather and time in Paris?"}],"tools":` + tools +
			`,"tool_choice":` + choice + `,"parallel_tool_calls":true,"temperature":0,"max_tokens":300,"stream":` + map[bool]string{true: "true", false: "false"}[stream] + `}`
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, c.url+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			var b bytes.Buffer
			b.ReadFrom(resp.Body)
			t.Fatalf("%s: %s %s", choice, resp.Status, b.String())
		}
		var names []string
		if !stream {
			var a struct {
				Choices []struct {
					Message struct {
						Content   json.RawMessage
						ToolCalls []struct{ Function struct{ Name string } } `json:"tool_calls"`
					}
				}
			}
			if err := json.NewDecoder(resp.Body).Decode(&a); err != nil {
				t.Fatal(err)
			}
			if m := a.Choices[0].Message; len(m.ToolCalls) > 0 && string(m.Content) != "null" {
				t.Errorf("%s: a message of calls alone has content %s; OpenAI sends null", choice, m.Content)
			}
			for _, tc := range a.Choices[0].Message.ToolCalls {
				names = append(names, tc.Function.Name)
			}
			return names
		}
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			data, ok := strings.CutPrefix(sc.Text(), "data: ")
			if !ok || data == "[DONE]" {
				continue
			}
			var ch struct {
				Choices []struct {
					Delta struct {
						ToolCalls []struct {
							Index    int
							Function struct{ Name string }
						} `json:"tool_calls"`
					}
				}
			}
			if err := json.Unmarshal([]byte(data), &ch); err != nil {
				t.Fatalf("%s: %v", data, err)
			}
			for _, ch := range ch.Choices {
				for _, tc := range ch.Delta.ToolCalls {
					if tc.Function.Name != "" {
						names = append(names, tc.Function.Name)
					}
				}
			}
		}
		return names
	}
	for _, stream := range []bool{false, true} {
		if got := calls(`{"type":"function","function":{"name":"get_time"}}`, stream); len(got) != 1 || got[0] != "get_time" {
			t.Errorf("named get_time (stream %v): calls %v, want exactly one get_time", stream, got)
		}
	}
	t.Logf("required, parallel allowed: calls %v", calls(`"required"`, false))

	// A model's time is the same in the list and on its own.
	get := func(path string, v any) {
		t.Helper()
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, c.url+path, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
			t.Fatal(err)
		}
	}
	var list struct {
		Data []struct {
			ID      string
			Created int64
		}
	}
	var one struct {
		ID      string
		Created int64
	}
	get("/v1/models", &list)
	get("/v1/models/tiny", &one)
	t.Logf("list %+v, one %+v", list, one)
}
