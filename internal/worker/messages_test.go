package worker

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
)

// anthropicMessage is the part of an Anthropic answer the tests read.
type anthropicMessage struct {
	ID      string `json:"id"`
	Type    string `json:"type"`
	Role    string `json:"role"`
	Model   string `json:"model"`
	Content []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	} `json:"content"`
	StopReason   *string `json:"stop_reason"`
	StopSequence *string `json:"stop_sequence"`
	Usage        struct {
		InputTokens  int `json:"input_tokens"`
		OutputTokens int `json:"output_tokens"`
	} `json:"usage"`
}

// sseNamed is one event of an Anthropic stream.
type sseNamed struct {
	name string
	data map[string]any
}

// postMessages posts body to /v1/messages with the headers kv (name,
// value, …) and returns the status and the body.
func postMessages(t *testing.T, url, body string, kv ...string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url+"/v1/messages", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(kv); i += 2 {
		req.Header.Set(kv[i], kv[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, data
}

// namedEvents reads a whole Anthropic stream: "event:" and "data:" lines,
// each event ended by a blank line.
func namedEvents(t *testing.T, data []byte) []sseNamed {
	t.Helper()
	var out []sseNamed
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, 1<<20)
	var cur sseNamed
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			cur.name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &cur.data); err != nil {
				t.Fatalf("event data %q: %v", line, err)
			}
		case line == "":
			if cur.name == "" || cur.data == nil {
				t.Fatalf("event without a name or data in %q", data)
			}
			out = append(out, cur)
			cur = sseNamed{}
		default:
			t.Fatalf("unexpected stream line %q", line)
		}
	}
	return out
}

func TestBinaryMessages(t *testing.T) {
	_, url := startWorkerBinary(t, nil)
	checkMessages(t, url)
}

// checkMessages asks /v1/messages for the same greedy answer whole and
// streamed, then cut by a stop sequence, and checks the shapes, the event
// order and the refusals.
func checkMessages(t *testing.T, url string, auth ...string) {
	const convo = `"model":"tiny","max_tokens":12,"temperature":0,"system":"Be brief.",
		"messages":[{"role":"user","content":"Hi"},{"role":"assistant","content":[{"type":"text","text":"Hello"}]},
		{"role":"user","content":[{"type":"text","text":"Tell me"}]}]`
	status, data := postMessages(t, url, "{"+convo+"}", auth...)
	if status != http.StatusOK {
		t.Fatalf("messages: %d %s", status, data)
	}
	var m anthropicMessage
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(m.ID, "msg_") || m.Type != "message" || m.Role != "assistant" || m.Model != "tiny" ||
		len(m.Content) != 1 || m.Content[0].Type != "text" || m.StopReason == nil || m.Usage.InputTokens == 0 {
		t.Fatalf("answer %s", data)
	}
	switch *m.StopReason {
	case "max_tokens":
		if m.Usage.OutputTokens != 12 {
			t.Errorf("max_tokens after %d tokens, want 12", m.Usage.OutputTokens)
		}
	case "end_turn":
	default:
		t.Errorf("stop_reason %q", *m.StopReason)
	}
	text := m.Content[0].Text

	status, data = postMessages(t, url, `{"stream":true,`+convo+"}", auth...)
	if status != http.StatusOK {
		t.Fatalf("streamed messages: %d %s", status, data)
	}
	events := namedEvents(t, data)
	var names []string
	var streamed strings.Builder
	for _, ev := range events {
		names = append(names, ev.name)
		if ev.data["type"] != ev.name {
			t.Errorf("event %s carries type %v", ev.name, ev.data["type"])
		}
		if ev.name == "content_block_delta" {
			d, _ := ev.data["delta"].(map[string]any)
			if d["type"] != "text_delta" {
				t.Errorf("delta %v", d)
			}
			s, _ := d["text"].(string)
			streamed.WriteString(s)
		}
	}
	deltas := slices.DeleteFunc(slices.Clone(names), func(n string) bool { return n != "content_block_delta" })
	want := append(append([]string{"message_start", "content_block_start", "ping"}, deltas...), "content_block_stop", "message_delta", "message_stop")
	if !slices.Equal(names, want) || len(deltas) == 0 {
		t.Fatalf("events %v, want %v with at least one delta", names, want)
	}
	if streamed.String() != text {
		t.Errorf("streamed text %q, whole %q", streamed.String(), text)
	}
	start, _ := events[0].data["message"].(map[string]any)
	su, _ := start["usage"].(map[string]any)
	if start["role"] != "assistant" || start["stop_reason"] != nil || su["input_tokens"] != float64(m.Usage.InputTokens) {
		t.Errorf("message_start %v", events[0].data)
	}
	md := events[len(events)-2].data
	mdd, _ := md["delta"].(map[string]any)
	mu, _ := md["usage"].(map[string]any)
	if mdd["stop_reason"] != *m.StopReason || mu["output_tokens"] != float64(m.Usage.OutputTokens) {
		t.Errorf("message_delta %v, want stop_reason %s and %d output tokens", md, *m.StopReason, m.Usage.OutputTokens)
	}

	runes := []rune(text)
	if len(runes) < 4 {
		t.Fatalf("greedy answer %q too short to cut", text)
	}
	stop := string(runes[2:4])
	status, data = postMessages(t, url, `{"stop_sequences":[`+string(mustJSON(t, stop))+`],`+convo+"}", auth...)
	var cut anthropicMessage
	if err := json.Unmarshal(data, &cut); err != nil || status != http.StatusOK {
		t.Fatalf("stop_sequences: %d %s", status, data)
	}
	if cut.StopReason == nil || *cut.StopReason != "stop_sequence" || cut.StopSequence == nil || *cut.StopSequence != stop ||
		cut.Content[0].Text != text[:strings.Index(text, stop)] {
		t.Errorf("stop_sequences [%q] on %q: %s", stop, text, data)
	}

	for _, tt := range []struct{ name, body, msg string }{
		{"no max_tokens", `{"messages":[{"role":"user","content":"x"}]}`, "max_tokens"},
		{"a server tool", `{"max_tokens":5,"messages":[{"role":"user","content":"x"}],"tools":[{"type":"web_search_20250305","name":"web_search"}]}`, "server tools"},
		{"image without a source", `{"max_tokens":5,"messages":[{"role":"user","content":[{"type":"image","source":{}}]}]}`, "source.type: must be base64"},
		{"image to a model without a projector", `{"max_tokens":5,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"aGk="}}]}]}`, "projector"},
		{"bad role", `{"max_tokens":5,"messages":[{"role":"system","content":"x"}]}`, "messages.0.role"},
		{"temperature past 1", `{"max_tokens":5,"temperature":1.5,"messages":[{"role":"user","content":"x"}]}`, "temperature"},
	} {
		status, data := postMessages(t, url, tt.body, auth...)
		var e struct {
			Type  string `json:"type"`
			Error struct {
				Type    string `json:"type"`
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal(data, &e); err != nil || status != http.StatusBadRequest || e.Type != "error" ||
			e.Error.Type != "invalid_request_error" || !strings.Contains(e.Error.Message, tt.msg) {
			t.Errorf("%s: %d %s, want a 400 invalid_request_error naming %s", tt.name, status, data, tt.msg)
		}
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
