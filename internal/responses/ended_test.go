package responses

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// streamEvents feeds a chat stream to a and returns the events it made,
// decoded, and whether the last one ended the stream.
func streamEvents(t *testing.T, a *Answer, chunks ...string) (events []map[string]any, ended bool) {
	t.Helper()
	for _, ev := range chunks {
		out, last, err := a.Event([]byte(ev), time.Now())
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range out {
			lines := strings.SplitN(string(f), "\n", 3)
			var d map[string]any
			if err := json.Unmarshal([]byte(strings.TrimPrefix(lines[1], "data: ")), &d); err != nil {
				t.Fatal(err)
			}
			events = append(events, d)
		}
		ended = last
	}
	return events, ended
}

func statuses(items []any) string {
	var s []string
	for _, it := range items {
		m := it.(map[string]any)
		s = append(s, m["type"].(string)+":"+m["status"].(string))
	}
	return strings.Join(s, ",")
}

// A response cut by max_output_tokens is incomplete, and so is the item
// the bound cut — in the whole answer, in the streamed output_item.done
// and in the final streamed response; items before it ended well.
func TestIncompleteItems(t *testing.T) {
	var whole map[string]any
	b, err := NewAnswer(Request{}, "tiny", time.Now()).Whole([]byte(`{"choices":[{"message":{"content":"Hel"},"finish_reason":"length"}],"usage":{"prompt_tokens":1,"completion_tokens":2}}`), time.Now())
	if err != nil || json.Unmarshal(b, &whole) != nil {
		t.Fatal(b, err)
	}
	if whole["status"] != "incomplete" || statuses(whole["output"].([]any)) != "message:incomplete" {
		t.Errorf("whole: %s", b)
	}

	events, _ := streamEvents(t, NewAnswer(Request{}, "tiny", time.Now()),
		`{"choices":[{"delta":{"content":"Hel"}}]}`, `{"choices":[{"delta":{},"finish_reason":"length"}]}`,
		`{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2}}`, `[DONE]`)
	var done []string
	for _, e := range events {
		if e["type"] == "response.output_item.done" {
			done = append(done, e["item"].(map[string]any)["status"].(string))
		}
	}
	last := events[len(events)-1]
	final := last["response"].(map[string]any)
	if last["type"] != "response.incomplete" || final["status"] != "incomplete" ||
		statuses(final["output"].([]any)) != "message:incomplete" || strings.Join(done, ",") != "incomplete" {
		t.Errorf("streamed: done items %v, last %v", done, last)
	}

	// Text, then a call the bound cut: the message is whole, the call not.
	events, _ = streamEvents(t, NewAnswer(Request{}, "tiny", time.Now()),
		`{"choices":[{"delta":{"content":"Hi"}}]}`,
		`{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"call_1","function":{"name":"f","arguments":"{\"a\""}}]}}]}`,
		`{"choices":[{"delta":{},"finish_reason":"length"}]}`, `[DONE]`)
	if final := events[len(events)-1]["response"].(map[string]any); statuses(final["output"].([]any)) != "message:completed,function_call:incomplete" {
		t.Errorf("text then a cut call: %v", final["output"])
	}
	b, _ = NewAnswer(Request{}, "tiny", time.Now()).Whole([]byte(`{"choices":[{"message":{"content":"Hi"},"finish_reason":"stop"}]}`), time.Now())
	if json.Unmarshal(b, &whole) != nil || statuses(whole["output"].([]any)) != "message:completed" {
		t.Errorf("a whole answer that stopped: %s", b)
	}
}

// A failure mid-stream — the worker's error event (the relay's too, when
// a worker stops answering), or an event that is no JSON — ends the
// stream with response.failed: the response as it stood, status failed,
// the error's code and message, the open items incomplete.
func TestFailedMidStream(t *testing.T) {
	for name, c := range map[string]struct{ event, code, message string }{
		"error event": {`{"error":{"message":"the worker serving this stream stopped answering","type":"server_error","code":"worker_failed"}}`,
			"worker_failed", "the worker serving this stream stopped answering"},
		"no code":  {`{"error":{"message":"out of memory"}}`, "server_error", "out of memory"},
		"not json": {`{"choices":`, "server_error", "the worker's stream sent an event that is no JSON"},
	} {
		events, ended := streamEvents(t, NewAnswer(Request{}, "tiny", time.Now()),
			`{"choices":[{"delta":{"content":"Hel"}}]}`, c.event)
		last := events[len(events)-1]
		r, _ := last["response"].(map[string]any)
		e, _ := r["error"].(map[string]any)
		if !ended || last["type"] != "response.failed" || r["status"] != "failed" || e["code"] != c.code || e["message"] != c.message ||
			statuses(r["output"].([]any)) != "message:incomplete" {
			t.Errorf("%s: ended %v, last event %v", name, ended, last)
		}
		content := r["output"].([]any)[0].(map[string]any)["content"].([]any)
		if len(content) != 1 || content[0].(map[string]any)["text"] != "Hel" {
			t.Errorf("%s: the failed message holds %v, want the text so far", name, content)
		}
		for _, ev := range events {
			if ev["type"] == "error" {
				t.Errorf("%s: an error event: %v", name, ev)
			}
		}
	}
	// A call open when the worker failed is incomplete with the
	// arguments it had.
	events, _ := streamEvents(t, NewAnswer(Request{}, "tiny", time.Now()),
		`{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"call_1","function":{"name":"f","arguments":"{\"a\""}}]}}]}`,
		`{"error":{"message":"gone","code":"worker_failed"}}`)
	r := events[len(events)-1]["response"].(map[string]any)
	if call := r["output"].([]any)[0].(map[string]any); call["status"] != "incomplete" || call["arguments"] != `{"a"` {
		t.Errorf("an open call: %v", call)
	}
}
