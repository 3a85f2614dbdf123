package queen

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/apiary-llm/apiary/internal/api"
)

// A worker that dies in the middle of a streamed /v1/responses: the
// stream ends with response.failed as OpenAI ends one — the response as
// it stood (the text so far, its message incomplete), status failed, the
// error's code and message — and no bare error event.
func TestResponsesStreamFailsWithTheResponse(t *testing.T) {
	died := make(chan struct{})
	dying := newFakeWorker(t, func(_ *http.Request, send func(string) error, hijack func()) {
		_ = send(`{"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":"a"}}]}`)
		_ = send(`{"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"b"}}]}`)
		hijack()
		close(died)
	})
	x, _ := routeQueen(t, map[string][]api.Model{"http://hive-a": {tinyModel}})
	x.registerAt("a", "http://hive-a")
	x.readyWorker("a", dying.URL)

	resp := x.post(t.Context(), "/v1/responses", `{"model":"tiny","input":"hi","stream":true}`)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	<-died
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %v: %s", resp.StatusCode, err, body)
	}
	var types []string
	var last struct {
		Type     string
		Response struct {
			Status string
			Error  struct{ Code, Message string }
			Output []struct {
				Status  string
				Content []struct{ Text string }
			}
		}
	}
	for _, ev := range strings.Split(strings.TrimSpace(string(body)), "\n\n") {
		name, data, ok := strings.Cut(ev, "\ndata: ")
		if !ok || json.Unmarshal([]byte(data), &last) != nil || name != "event: "+last.Type {
			t.Fatalf("not a named event: %q", ev)
		}
		types = append(types, last.Type)
	}
	r := last.Response
	if last.Type != "response.failed" || r.Status != "failed" || r.Error.Code != "worker_failed" ||
		!strings.Contains(r.Error.Message, "stopped answering") || len(r.Output) != 1 || r.Output[0].Status != "incomplete" ||
		len(r.Output[0].Content) != 1 || r.Output[0].Content[0].Text != "ab" {
		t.Errorf("the last event %+v", last)
	}
	for _, typ := range types {
		if typ == "error" {
			t.Errorf("events %v: a bare error event", types)
		}
	}
}
