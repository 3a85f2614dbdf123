package batch

import (
	"errors"
	"io"
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
			reqs, err := parseAll(tc.file, testLimits)
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
	reqs, err := parseAll("\n"+`{"custom_id":"x","method":"POST","url":"/v1/completions","body":{"model":"m2","prompt":"p","max_tokens":3}}`, testLimits)
	if err != nil {
		t.Fatal(err)
	}
	r := reqs[0]
	if r.Line != 2 || r.CustomID != "x" || r.Model != "m2" || r.URL != EndpointCompletions || string(r.Body) != `{"model":"m2","prompt":"p","max_tokens":3}` {
		t.Fatalf("got %+v", r)
	}
}

// testLimits are the queen's defaults.
var testLimits = InputLimits{MaxLines: DefaultMaxLines, MaxLineBytes: DefaultMaxLineBytes}

// parseAll scans file and keeps every request.
func parseAll(file string, lim InputLimits) ([]Request, error) {
	var out []Request
	_, err := ScanInput(strings.NewReader(file), lim, func(r Request) error {
		out = append(out, r)
		return nil
	})
	return out, err
}

func TestParseInputRefusesTooManyRequests(t *testing.T) {
	var b strings.Builder
	for i := range DefaultMaxLines + 1 {
		b.WriteString(`{"custom_id":"` + "k" + strconv.Itoa(i) + `","method":"POST","url":"/v1/completions","body":{"model":"m","prompt":"p"}}` + "\n")
	}
	_, err := parseAll(b.String(), testLimits)
	if err == nil || !strings.Contains(err.Error(), "line 50001: the file holds more than 50000 requests, the queen's limit on a batch (--batch-max-lines)") {
		t.Fatalf("got %v", err)
	}
	_, err = parseAll("\n\n"+b.String(), InputLimits{MaxLines: 3, MaxLineBytes: 1 << 20})
	if err == nil || !strings.Contains(err.Error(), "line 6: the file holds more than 3 requests") {
		t.Fatalf("with --batch-max-lines 3: got %v", err)
	}
}

// A line longer than the queen's request body limit is refused naming
// its line, in the middle of the file and as its last line without a
// newline; a line of exactly the limit is accepted.
func TestScanInputBoundsALine(t *testing.T) {
	line := func(id string, size int) string {
		head := `{"custom_id":"` + id + `","method":"POST","url":"/v1/completions","body":{"model":"m","prompt":"`
		tail := `"}}`
		return head + strings.Repeat("x", size-len(head)-len(tail)) + tail
	}
	lim := InputLimits{MaxLines: 10, MaxLineBytes: 200}
	if n, err := ScanInput(strings.NewReader(line("a", 200)+"\r\n"+line("b", 200)), lim, nil); err != nil || n != 2 {
		t.Fatalf("lines of the limit: %d, %v", n, err)
	}
	for _, file := range []string{
		line("a", 100) + "\n" + line("b", 201) + "\n" + line("c", 100) + "\n",
		line("a", 100) + "\n" + line("b", 5000) + "\n",
		line("a", 100) + "\n" + line("b", 201),
	} {
		_, err := ScanInput(strings.NewReader(file), lim, nil)
		var oe *openai.Error
		if !errors.As(err, &oe) || oe.Status != http.StatusBadRequest ||
			!strings.HasPrefix(oe.Message, "line 2: the line is longer than 200 bytes, the queen's limit on a request body (--max-body-bytes)") {
			t.Fatalf("got %v", err)
		}
	}
}

// countingReader makes lines as it is read and counts the bytes it gave.
type countingReader struct {
	lines, next int
	buf         []byte
	read        int64
}

func (r *countingReader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		if r.next == r.lines {
			return 0, io.EOF
		}
		r.buf = []byte(`{"custom_id":"` + strconv.Itoa(r.next) + `","method":"POST","url":"/v1/completions","body":{"model":"m","prompt":"` + strings.Repeat("y", 900) + `"}}` + "\n")
		r.next++
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	r.read += int64(n)
	return n, nil
}

// The input is read as a stream: the first request reaches fn while the
// file is still mostly unread, and what the scan holds grows by a digest
// a request, not by the lines.
func TestScanInputStreams(t *testing.T) {
	r := &countingReader{lines: 20000}
	var readAtFirst int64 = -1
	n, err := ScanInput(r, testLimits, func(Request) error {
		if readAtFirst < 0 {
			readAtFirst = r.read
		}
		return nil
	})
	if err != nil || n != 20000 {
		t.Fatalf("%d requests, %v", n, err)
	}
	if readAtFirst > 1<<20 || readAtFirst < 0 {
		t.Fatalf("the first request came after %d of the file's %d bytes were read", readAtFirst, r.read)
	}
	t.Logf("first request after %d of %d bytes", readAtFirst, r.read)
}
