package batch

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/apiary-llm/apiary/internal/openai"
)

func TestParseInput(t *testing.T) {
	chat := func(id string) string {
		return `{"custom_id":"` + id + `","method":"POST","url":"/v1/chat/completions","body":{"model":"tiny","messages":[{"role":"user","content":"hi"}]}}`
	}
	comp := `{"custom_id":"c","method":"POST","url":"/v1/completions","body":{"model":"tiny","prompt":"hi"}}`
	for _, tc := range []struct {
		name, file string
		want       int    // requests, when it is accepted
		err        string // the message's beginning, when it is refused
	}{
		{"one chat", chat("a"), 1, ""},
		{"blank lines are skipped", chat("a") + "\n\n" + chat("b") + "\n", 2, ""},
		{"completions", comp, 1, ""},
		{"empty", "\n \n", 0, "the file has no requests"},
		{"not JSON", chat("a") + "\n{nope", 0, "line 2: not a JSON object"},
		{"no custom_id", `{"method":"POST","url":"/v1/completions","body":{"model":"tiny","prompt":"x"}}`, 0, "line 1: custom_id is missing"},
		{"duplicate custom_id", chat("a") + "\n" + chat("b") + "\n" + chat("a"), 0, `line 3: custom_id "a" is also the custom_id of line 1`},
		{"GET", `{"custom_id":"a","method":"GET","url":"/v1/completions","body":{"model":"tiny","prompt":"x"}}`, 0, `line 1: method must be "POST"`},
		{"unknown url", `{"custom_id":"a","method":"POST","url":"/v1/images","body":{}}`, 0, `line 1: url: "/v1/images" is not an endpoint`},
		{"embeddings", `{"custom_id":"a","method":"POST","url":"/v1/embeddings","body":{"model":"tiny","input":"x"}}` + "\n" +
			`{"custom_id":"b","method":"POST","url":"/v1/embeddings","body":{"model":"tiny","input":["x","y"],"encoding_format":"base64"}}`, 2, ""},
		{"bad embeddings body", `{"custom_id":"a","method":"POST","url":"/v1/embeddings","body":{"model":"tiny","input":"x"}}` + "\n" +
			`{"custom_id":"b","method":"POST","url":"/v1/embeddings","body":{"model":"tiny","input":[1,2]}}`, 0, "line 2: body.input: token arrays"},
		{"embeddings without input", `{"custom_id":"a","method":"POST","url":"/v1/embeddings","body":{"model":"tiny"}}`, 0, "line 1: body.input"},
		{"two endpoints", chat("a") + "\n" + comp, 0, "line 2: url /v1/completions differs from line 1's /v1/chat/completions"},
		{"body not an object", `{"custom_id":"a","method":"POST","url":"/v1/completions","body":"x"}`, 0, "line 1: body must be a JSON object"},
		{"bad body field", chat("a") + "\n" + `{"custom_id":"b","method":"POST","url":"/v1/chat/completions","body":{"model":"tiny","messages":[{"role":"user","content":"x"}],"temperature":"hot"}}`,
			0, "line 2: body.temperature"},
		{"no model", `{"custom_id":"a","method":"POST","url":"/v1/completions","body":{"prompt":"x"}}`, 0, "line 1: body.model is missing"},
		{"stream", `{"custom_id":"a","method":"POST","url":"/v1/completions","body":{"model":"tiny","prompt":"x","stream":true}}`, 0, "line 1: body.stream is true"},
		{"long custom_id", `{"custom_id":"` + strings.Repeat("x", 513) + `","method":"POST","url":"/v1/completions","body":{"model":"tiny","prompt":"x"}}`, 0, "line 1: custom_id is 513 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reqs, err := ParseInput(strings.NewReader(tc.file))
			if tc.err == "" {
				if err != nil || len(reqs) != tc.want {
					t.Fatalf("got %d requests, %v; want %d", len(reqs), err, tc.want)
				}
				return
			}
			var oe *openai.Error
			if !errors.As(err, &oe) || oe.Status != http.StatusBadRequest || !strings.HasPrefix(oe.Message, tc.err) {
				t.Fatalf("got %v; want a 400 whose message begins %q", err, tc.err)
			}
		})
	}
}

func TestParseInputKeepsLinesAndBodies(t *testing.T) {
	reqs, err := ParseInput(strings.NewReader("\n" + `{"custom_id":"x","method":"POST","url":"/v1/completions","body":{"model":"m2","prompt":"p","max_tokens":3}}`))
	if err != nil {
		t.Fatal(err)
	}
	r := reqs[0]
	if r.Line != 2 || r.CustomID != "x" || r.Model != "m2" || r.URL != EndpointCompletions || string(r.Body) != `{"model":"m2","prompt":"p","max_tokens":3}` {
		t.Fatalf("got %+v", r)
	}
}

func TestParseInputRefusesTooManyRequests(t *testing.T) {
	var b strings.Builder
	for i := range MaxRequests + 1 {
		b.WriteString(`{"custom_id":"` + "k" + strconv.Itoa(i) + `","method":"POST","url":"/v1/completions","body":{"model":"m","prompt":"p"}}` + "\n")
	}
	_, err := ParseInput(strings.NewReader(b.String()))
	if err == nil || !strings.Contains(err.Error(), "line 50001: a batch holds at most 50000 requests") {
		t.Fatalf("got %v", err)
	}
}
