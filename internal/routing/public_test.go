package routing

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/apiary-llm/apiary/internal/openai"
)

// The backstop finds what an answer must not hold (an address, a file
// path, a lifecycle id the client did not send) and lets through what the
// client sent and apiary's own API paths.
func TestInternalTextIsFound(t *testing.T) {
	r := httptest.NewRequest("POST", "/v1/chat/completions", nil)
	r.Header.Set("X-Apiary-Worker", "wk-00000000000000aa")
	for _, tc := range []struct{ msg, want string }{
		{`no pool can run extra (node-1: its hive does not have the model's file)`, ""},
		{`no pool has model "llama3"; see GET /v1/models`, ""},
		{`no endpoint POST /v1/chat/completions`, ""},
		{`see docs/models.md`, ""},
		{`worker wk-00000000000000aa failed`, ""}, // the client sent it
		{`"extra" is not in /home/u/.local/share/apiary/models`, "/home/u/.local/share/apiary/models"},
		{`hive unreachable: no answer: POST http://127.0.0.1:62230/v2/workers/start`, "http://"},
		{`dial tcp 10.1.2.3:9200: i/o timeout`, "10.1.2.3"},
		{`lifecycle row wk-0123456789abcdef is FAILED`, "wk-0123456789abcdef"},
		{`dial tcp [::1]:9200: connection refused`, "[::1]"},
		{`pulling big from hf://org/big-GGUF:Q4_K_M on pool a failed: no GGUF file of quantization Q4_K_M`, ""}, // the config's source
		{`GET https://huggingface.co/api/models/org/repo: 502`, "https://"},
	} {
		if got := internalText(tc.msg, r); got != tc.want {
			t.Errorf("internalText(%q) = %q, want %q", tc.msg, got, tc.want)
		}
	}
	s := &Service{log: slog.New(slog.DiscardHandler)}
	e := s.guarded(&openai.Error{Status: http.StatusServiceUnavailable, Code: "no_capacity",
		Message: "no worker can be placed: POST http://127.0.0.1:1/v2/workers/start"}, r)
	if e.Message != "Service Unavailable (no_capacity); the queen's log has the details" || e.HTTPStatus() != http.StatusServiceUnavailable {
		t.Errorf("guarded: %d %q", e.HTTPStatus(), e.Message)
	}
}
