package ollama

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"
)

func decodeMap(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	return m
}

// A tool round trip in Ollama's shapes (arguments an object, the tool's
// answer by tool_name) becomes OpenAI's (arguments a string, the answer
// by the call's id); options map to sampling fields, Ollama's load
// options are left out, a misspelt one is refused.
func TestChatTranslates(t *testing.T) {
	req, _, body, err := Chat([]byte(`{"model":"tiny:latest","messages":[
		{"role":"user","content":"Weather in Paris?"},
		{"role":"assistant","content":"","tool_calls":[{"function":{"name":"get_weather","arguments":{"city":"Paris"}}}]},
		{"role":"tool","content":"sunny","tool_name":"get_weather"}],
		"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}],
		"format":"json","options":{"num_predict":16,"temperature":0,"stop":"\n","num_ctx":4096,"seed":7}}`))
	if err != nil {
		t.Fatal(err)
	}
	if req.Model != "tiny:latest" || req.Stream != nil {
		t.Errorf("request %+v", req)
	}
	m := decodeMap(t, body)
	msgs := m["messages"].([]any)
	call := msgs[1].(map[string]any)["tool_calls"].([]any)[0].(map[string]any)
	fn := call["function"].(map[string]any)
	if fn["arguments"] != `{"city":"Paris"}` || fn["name"] != "get_weather" || call["type"] != "function" {
		t.Errorf("assistant's call %v", call)
	}
	if msgs[2].(map[string]any)["tool_call_id"] != call["id"] {
		t.Errorf("the tool's answer %v does not answer call %v", msgs[2], call["id"])
	}
	if m["max_tokens"] != 16.0 || m["temperature"] != 0.0 || m["seed"] != 7.0 || m["num_ctx"] != nil || m["stream"] != true ||
		m["stream_options"].(map[string]any)["include_usage"] != true {
		t.Errorf("body %v", m)
	}
	if stop := m["stop"].([]any); len(stop) != 1 || stop[0] != "\n" {
		t.Errorf("stop %v", m["stop"])
	}
	if m["response_format"].(map[string]any)["type"] != "json_object" || m["tools"] == nil {
		t.Errorf("format or tools lost: %v", m)
	}

	_, _, body, err = Chat([]byte(`{"model":"m","messages":[{"role":"user","content":"x"}],"stream":false,"format":{"type":"object"},"options":{"num_predict":-1}}`))
	if err != nil {
		t.Fatal(err)
	}
	m = decodeMap(t, body)
	if m["stream"] != false || m["stream_options"] != nil || m["max_tokens"] != nil ||
		m["response_format"].(map[string]any)["type"] != "json_schema" {
		t.Errorf("body %v", m)
	}

	for in, want := range map[string]string{
		`{"model":"m","messages":[{"role":"user","content":"x"}],"options":{"temprature":0}}`:    "options.temprature is not an Ollama option",
		`{"model":"m","messages":[{"role":"robot","content":"x"}]}`:                              `messages[0].role "robot"`,
		`{"model":"m","messages":[{"role":"user","content":"x","images":["aGk="]}]}`:             "images[0]: not a PNG, JPEG, GIF or BMP picture",
		`{"model":"m","messages":[{"role":"assistant","content":"x","images":["aGk="]}]}`:        "only a user message carries images",
		`{"model":"m","messages":[{"role":"user","content":"x"}],"format":"yaml"}`:               `format must be "json" or a JSON schema`,
		`{"model":"m","messages":[{"role":"user","content":"x"}],"options":{"num_predict":1.5}}`: "options.num_predict must be an integer",
		`{"model":"m","messages":[{"role":"user","content":"x"}],"frobnicate":1}`:                `unknown field "frobnicate"`,
		`{"model":"m","messages":[{"role":"user","content":"x"}]} {}`:                            "more than one JSON value",
	} {
		if _, _, _, err := Chat([]byte(in)); !errors.Is(err, ErrBadRequest) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", in, err, want)
		}
	}
}

func TestGenerateAndEmbedTranslate(t *testing.T) {
	_, _, path, body, err := Generate([]byte(`{"model":"m","prompt":"hi","system":"be brief","stream":false}`))
	if err != nil || path != "/v1/chat/completions" {
		t.Fatalf("%s %v", path, err)
	}
	if msgs := decodeMap(t, body)["messages"].([]any); len(msgs) != 2 || msgs[0].(map[string]any)["role"] != "system" {
		t.Errorf("messages %v", msgs)
	}
	_, _, path, body, err = Generate([]byte(`{"model":"m","prompt":"hi","raw":true}`))
	if err != nil || path != "/v1/completions" || decodeMap(t, body)["prompt"] != "hi" {
		t.Errorf("raw: %s %s %v", path, body, err)
	}
	for in, want := range map[string]string{
		`{"model":"m","prompt":"x","context":[1,2]}`:   "keeps no token context",
		`{"model":"m","prompt":"x","template":"{{}}"}`: "model's own chat template",
		`{"model":"m","prompt":"x","suffix":"y"}`:      "fill-in-the-middle",
	} {
		if _, _, _, _, err := Generate([]byte(in)); !errors.Is(err, ErrBadRequest) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", in, err, want)
		}
	}
	_, body, err = Embed([]byte(`{"model":"m","input":["a","b"],"dimensions":8}`))
	if m := decodeMap(t, body); err != nil || len(m["input"].([]any)) != 2 || m["dimensions"] != 8.0 || m["encoding_format"] != "float" {
		t.Errorf("embed: %s %v", body, err)
	}
	if _, _, err := Embed([]byte(`{"model":"m","input":3}`)); !errors.Is(err, ErrBadRequest) {
		t.Errorf("embed of a number: %v", err)
	}
}

// A stream of OpenAI chunks (text, a call whose arguments come in
// pieces, the finish, usage, [DONE]) becomes Ollama's lines: the text,
// the call in one line with its arguments as an object, then done with
// the counts; an error event becomes Ollama's error line.
func TestAnswerStream(t *testing.T) {
	a := NewAnswer(KindChat, "tiny", time.Now())
	now := time.Now()
	var lines []map[string]any
	last := false
	for _, ev := range []string{
		`{"choices":[{"delta":{"role":"assistant","content":"Hel"}}]}`,
		`{"choices":[{"delta":{"content":"lo"}}]}`,
		`{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{\"ci"}}]}}]}`,
		`{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"ty\":\"Paris\"}"}}]}}]}`,
		`{"choices":[{"delta":{},"finish_reason":"tool_calls"}]}`,
		`{"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":9}}`,
		`[DONE]`,
	} {
		ls, l, err := a.Event([]byte(ev), now)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range ls {
			lines = append(lines, decodeMap(t, b))
		}
		last = l
	}
	if !last || len(lines) != 4 {
		t.Fatalf("%d lines %v (last %v)", len(lines), lines, last)
	}
	if lines[0]["message"].(map[string]any)["content"] != "Hel" || lines[1]["done"] != false {
		t.Errorf("text lines %v", lines[:2])
	}
	calls := lines[2]["message"].(map[string]any)["tool_calls"].([]any)
	fn := calls[0].(map[string]any)["function"].(map[string]any)
	if len(calls) != 1 || fn["name"] != "get_weather" || fn["arguments"].(map[string]any)["city"] != "Paris" {
		t.Errorf("calls line %v", lines[2])
	}
	d := lines[3]
	if d["done"] != true || d["done_reason"] != "stop" || d["prompt_eval_count"] != 12.0 || d["eval_count"] != 9.0 || d["model"] != "tiny" {
		t.Errorf("done line %v", d)
	}

	a = NewAnswer(KindGenerate, "tiny", time.Now())
	ls, l, err := a.Event([]byte(`{"error":{"message":"the worker failed","code":"worker_failed"}}`), now)
	if err != nil || !l || len(ls) != 1 || decodeMap(t, ls[0])["error"] != "the worker failed" {
		t.Errorf("error event: %s %v %v", ls, l, err)
	}
}

func TestAnswerWhole(t *testing.T) {
	a := NewAnswer(KindChat, "tiny", time.Now())
	b, err := a.Whole([]byte(`{"choices":[{"message":{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{\"x\":1}"}}]},"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":3,"completion_tokens":4}}`), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	m := decodeMap(t, b)
	msg := m["message"].(map[string]any)
	if msg["content"] != "" || msg["tool_calls"].([]any)[0].(map[string]any)["function"].(map[string]any)["arguments"].(map[string]any)["x"] != 1.0 ||
		m["done"] != true || m["eval_count"] != 4.0 {
		t.Errorf("whole %v", m)
	}
	a = NewAnswer(KindGenerate, "tiny", time.Now())
	b, err = a.Whole([]byte(`{"choices":[{"text":"hi","finish_reason":"length"}],"usage":{"prompt_tokens":1,"completion_tokens":2}}`), time.Now())
	if m := decodeMap(t, b); err != nil || m["response"] != "hi" || m["done_reason"] != "length" {
		t.Errorf("generate whole %s %v", b, err)
	}
	if _, err := NewAnswer(KindChat, "m", time.Now()).Whole([]byte(`<html>`), time.Now()); err == nil {
		t.Errorf("a page was taken for an answer")
	}
}

// A chat of no messages, or a generate of no prompt, is a load; with
// keep_alive 0 (a number or a duration string) an unload; a request with
// input is neither, whatever its keep_alive. The answer is done at once.
func TestLoadAndUnloadRequests(t *testing.T) {
	for in, want := range map[string]Action{
		`{"model":"m"}`:                                                           ActionLoad,
		`{"model":"m","messages":[]}`:                                             ActionLoad,
		`{"model":"m","keep_alive":"5m"}`:                                         ActionLoad,
		`{"model":"m","keep_alive":-1}`:                                           ActionLoad,
		`{"model":"m","keep_alive":0}`:                                            ActionUnload,
		`{"model":"m","messages":[],"keep_alive":"0"}`:                            ActionUnload,
		`{"model":"m","keep_alive":"0s"}`:                                         ActionUnload,
		`{"model":"m","keep_alive":0.0}`:                                          ActionUnload,
		`{"model":"m","messages":[{"role":"user","content":"x"}],"keep_alive":0}`: ActionNone,
	} {
		_, act, body, err := Chat([]byte(in))
		if err != nil || act != want || (act != ActionNone) != (body == nil) {
			t.Errorf("chat %s: action %d, body %s, %v; want action %d", in, act, body, err, want)
		}
	}
	for in, want := range map[string]Action{
		`{"model":"m"}`: ActionLoad,
		`{"model":"m","prompt":"","keep_alive":0}`:   ActionUnload,
		`{"model":"m","prompt":"hi","keep_alive":0}`: ActionNone,
		`{"model":"m","system":"be brief"}`:          ActionNone,
	} {
		_, act, _, _, err := Generate([]byte(in))
		if err != nil || act != want {
			t.Errorf("generate %s: action %d, %v; want %d", in, act, err, want)
		}
	}
	for _, in := range []string{`{"model":"m","keep_alive":"soon"}`, `{"model":"m","keep_alive":true}`} {
		if _, _, _, err := Chat([]byte(in)); !errors.Is(err, ErrBadRequest) || !strings.Contains(err.Error(), "keep_alive") {
			t.Errorf("%s: %v, want a keep_alive error", in, err)
		}
	}
	at := time.Date(2026, 11, 29, 1, 2, 3, 0, time.UTC)
	b, err := Done(KindGenerate, "tiny:latest", "unload", at)
	if m := decodeMap(t, b); err != nil || m["done"] != true || m["done_reason"] != "unload" || m["response"] != "" || m["model"] != "tiny:latest" {
		t.Errorf("generate's unload: %s %v", b, err)
	}
	b, _ = Done(KindChat, "tiny", "load", at)
	if m := decodeMap(t, b); m["done_reason"] != "load" || m["message"].(map[string]any)["content"] != "" {
		t.Errorf("chat's load: %s", b)
	}
}

// A JSON schema as format is taken as given, as Ollama takes it: not in
// OpenAI's strict mode (no additionalProperties needed).
func TestFormatSchemaIsNotStrict(t *testing.T) {
	_, _, body, err := Chat([]byte(`{"model":"m","messages":[{"role":"user","content":"x"}],
		"format":{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"}},"required":["name"]}}`))
	if err != nil {
		t.Fatal(err)
	}
	js := decodeMap(t, body)["response_format"].(map[string]any)["json_schema"].(map[string]any)
	if _, set := js["strict"]; set || js["schema"].(map[string]any)["required"] == nil {
		t.Errorf("json_schema %v: want the schema as given, without strict", js)
	}
}

// Ollama's images (base64, no data URI) become OpenAI image_url parts
// with the data URI of each picture's type, after the message's text, in
// /api/chat and /api/generate.
func TestImagesBecomeImageParts(t *testing.T) {
	png := base64.StdEncoding.EncodeToString([]byte("\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"))
	gif := base64.StdEncoding.EncodeToString([]byte("GIF89a\x01\x00\x01\x00"))
	_, _, body, err := Chat([]byte(`{"model":"m","messages":[{"role":"user","content":"what is it?","images":["` + png + `","` + gif + `"]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	want := []any{map[string]any{"type": "text", "text": "what is it?"},
		map[string]any{"type": "image_url", "image_url": map[string]any{"url": "data:image/png;base64," + png}},
		map[string]any{"type": "image_url", "image_url": map[string]any{"url": "data:image/gif;base64," + gif}}}
	if got := decodeMap(t, body)["messages"].([]any)[0].(map[string]any)["content"]; !reflect.DeepEqual(got, want) {
		t.Errorf("chat content %v, want %v", got, want)
	}
	_, _, path, body, err := Generate([]byte(`{"model":"m","prompt":"what is it?","images":["` + png + `"]}`))
	if err != nil || path != "/v1/chat/completions" {
		t.Fatal(path, err)
	}
	if got := decodeMap(t, body)["messages"].([]any)[0].(map[string]any)["content"]; !reflect.DeepEqual(got, want[:2]) {
		t.Errorf("generate content %v, want %v", got, want[:2])
	}
	if _, _, _, _, err := Generate([]byte(`{"model":"m","prompt":"x","raw":true,"images":["` + png + `"]}`)); err == nil || !strings.Contains(err.Error(), "raw prompt") {
		t.Errorf("raw with images: %v", err)
	}
}
