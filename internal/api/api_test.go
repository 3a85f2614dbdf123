package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/apiary-llm/apiary/internal/openai"
)

// Every error answer has OpenAI's shape: code, message, type, param.
func TestWriteErrorShape(t *testing.T) {
	for status, want := range map[int]string{
		404: `{"error":{"code":"not_found","message":"m","type":"not_found_error","param":null}}`,
		405: `{"error":{"code":"not_found","message":"m","type":"invalid_request_error","param":null}}`,
		401: `{"error":{"code":"not_found","message":"m","type":"authentication_error","param":null}}`,
		503: `{"error":{"code":"not_found","message":"m","type":"server_error","param":null}}`,
	} {
		w := httptest.NewRecorder()
		WriteError(w, status, "not_found", "m")
		if got := strings.TrimSpace(w.Body.String()); got != want || w.Code != status {
			t.Errorf("%d: %s", status, got)
		}
		if status == http.StatusUnauthorized && w.Header().Get("WWW-Authenticate") == "" {
			t.Error("401 without WWW-Authenticate")
		}
	}
}

func TestPrintable(t *testing.T) {
	for in, want := range map[string]string{
		"plain text":    "plain text",
		"a\x1b[2Jb":     "a\uFFFD[2Jb",
		"bell\a\nnl":    "bell\uFFFD\uFFFDnl",
		"rtl\u202eevil": "rtl\uFFFDevil",
		"bad\xffbyte":   "bad\uFFFDbyte",
		"c1\u009bcsi":   "c1\uFFFDcsi",
		"ünïcödé 日本":    "ünïcödé 日本",
	} {
		if got := Printable(in, 64); got != want {
			t.Errorf("Printable(%q) = %q, want %q", in, got, want)
		}
	}
	// Cut on a rune boundary, marked.
	if got := Printable(strings.Repeat("é", 9), 9); got != strings.Repeat("é", 4)+"…" || !utf8.ValidString(got) {
		t.Errorf("cut: %q", got)
	}
}

func TestRemoteError(t *testing.T) {
	d := RemoteError(500, []byte(`{"error":{"code":"boom","message":"it \u001b[31mbroke"}}`))
	if d.Code != "boom" || strings.ContainsRune(d.Message, 0x1b) {
		t.Errorf("%+v", d)
	}
	d = RemoteError(502, []byte("<html>proxy</html>"))
	if d.Code != "unexpected_answer" || strings.Contains(d.Message, "html") {
		t.Errorf("%+v", d)
	}
}

func TestCheckID(t *testing.T) {
	for _, ok := range []string{"a", "pool-1", "wk-0123456789abcdef", "n1.example:9200", strings.Repeat("a", 128)} {
		if err := CheckID("id", ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "-a", "a b", "a/b", "a\x1b", strings.Repeat("a", 129), "ä"} {
		if err := CheckID("id", bad); err == nil || strings.ContainsRune(err.Error(), 0x1b) {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

func TestStatusOf(t *testing.T) {
	for _, tc := range []struct {
		err    error
		status int
		code   string
	}{
		{BadRequest("x %d", 1), http.StatusBadRequest, "invalid_request"},
		{fmt.Errorf("ctx: %w", &RequestError{Status: http.StatusConflict, Code: "worker_ended", Err: errors.New("ended")}), http.StatusConflict, "worker_ended"},
		{fmt.Errorf("a: %w", openai.Sentinel(http.StatusGone, "pool_offline", "offline")), http.StatusGone, "pool_offline"},
		{&http.MaxBytesError{Limit: 10}, http.StatusRequestEntityTooLarge, "body_too_large"},
		{errors.New("disk on fire"), http.StatusInternalServerError, "internal_error"},
	} {
		if s, c := StatusOf(tc.err); s != tc.status || c != tc.code {
			t.Errorf("StatusOf(%v) = %d %s, want %d %s", tc.err, s, c, tc.status, tc.code)
		}
	}
	w := httptest.NewRecorder()
	Fail(w, errors.New("secret detail"), "queen")
	if w.Code != http.StatusInternalServerError || strings.Contains(w.Body.String(), "secret detail") || !strings.Contains(w.Body.String(), "queen's log") {
		t.Errorf("an internal error answered %d %s", w.Code, w.Body)
	}
}

func TestFormatBytes(t *testing.T) {
	for n, want := range map[uint64]string{0: "0 B", 1023: "1023 B", 1 << 20: "1.0 MiB", 3 << 30: "3.0 GiB"} {
		if got := FormatBytes(n); got != want {
			t.Errorf("FormatBytes(%d) = %q, want %q", n, got, want)
		}
	}
}

// An unchanged heartbeat as hives send it skips the JSON decoder, with
// the decoder's result; any other body, those that only resemble it
// included, is decoded strictly.
func TestDecodeHeartbeat(t *testing.T) {
	hiveBody, err := json.Marshal(Heartbeat{Unchanged: true})
	if err != nil {
		t.Fatal(err)
	}
	before := func() Heartbeat { // what was there is kept or replaced as the decoder would
		return Heartbeat{GPUs: []GPU{{ID: 9}}, Workers: []Worker{{WorkerID: "w"}}, WorkerTokens: map[string]string{"w": "t"}}
	}
	post := func(body string) (Heartbeat, error) {
		r := httptest.NewRequest(http.MethodPost, "/v2/pools/p/heartbeat", strings.NewReader(body))
		hb := before()
		err := Decode(r, &hb, false)
		return hb, err
	}
	for _, body := range []string{string(hiveBody), string(hiveBody) + "\n", `{"unchanged":true}`, ` {"unchanged": true} `,
		`{"unchanged":true,"gpus":[],"workers":[]}`} {
		hb, err := post(body)
		want := before()
		if jerr := json.Unmarshal([]byte(body), &want); err != nil || jerr != nil || !reflect.DeepEqual(hb, want) {
			t.Errorf("%q: %+v, %v; the decoder: %+v, %v", body, hb, err, want, jerr)
		}
	}
	hb, err := post(`{"unchanged":true,"gpus":[{"id":1}]}`)
	if err != nil || !hb.Unchanged || len(hb.GPUs) != 1 || hb.GPUs[0].ID != 1 {
		t.Errorf("an unchanged beat with devices is decoded as sent (the queen refuses it): %+v, %v", hb, err)
	}
	for _, body := range []string{`{"unchanged":true,"extra":1}`, `{"unchanged":true}{}`, `{"unchanged":true`} {
		if _, err := post(body); err == nil || !strings.Contains(err.Error(), "invalid JSON body") {
			t.Errorf("%q: %v, want invalid JSON body", body, err)
		}
	}
}

// LineDecoder decodes line after line with one decoder, strictly as
// DecodeBytes: a bad line is refused alone, and the next is decoded.
func TestLineDecoder(t *testing.T) {
	var d LineDecoder
	type v struct {
		A int    `json:"a"`
		B string `json:"b"`
	}
	for i, c := range []struct {
		line, err string
		want      v
	}{
		{line: `{"a":1,"b":"x"}`, want: v{A: 1, B: "x"}},
		{line: ` {"a":2} `, want: v{A: 2}},
		{line: `{"a":3}{"a":4}`, err: "more than one value"},
		{line: `{"a":5}`, want: v{A: 5}},
		{line: `{"a":`, err: "the JSON ends before its value does"},
		{line: `{"a":6}`, want: v{A: 6}},
		{line: `{"c":1}`, err: `unknown field "c"`},
		{line: `{"a":"seven"}`, err: "a must be a whole number, not string"},
		{line: `[}`, err: "invalid character"},
		{line: `{"a":8} x`, err: "more than one value"},
		{line: `  `, err: "empty"},
		{line: `{"b":"` + strings.Repeat("y", 3000) + `"}`, want: v{B: strings.Repeat("y", 3000)}},
		{line: `{"a":9}`, want: v{A: 9}},
	} {
		var got v
		err := d.Decode([]byte(c.line), &got)
		switch {
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("line %d %.20q: %v, want an error with %q", i, c.line, err, c.err)
		case c.err == "" && (err != nil || got != c.want):
			t.Errorf("line %d %.20q: %+v, %v; want %+v", i, c.line, got, err, c.want)
		}
	}
	var hb Heartbeat
	if err := d.Decode([]byte(`{"unchanged":true}`), &hb); err != nil || !hb.Unchanged {
		t.Errorf("an unchanged heartbeat: %+v, %v", hb, err)
	}
}

// The scheme of an Authorization header is case-insensitive (RFC 7235):
// "bearer T" was once refused by every token check.
func TestBearerSchemeIsCaseInsensitive(t *testing.T) {
	for header, want := range map[string]string{
		"Bearer tok":      "tok",
		"bearer tok":      "tok",
		"BEARER tok":      "tok",
		"bEaReR tok":      "tok",
		"Bearer   tok  ":  "tok",
		"Bearer":          "",
		"Bearer ":         "",
		"Basic dG9rCg==":  "",
		"Bearertok":       "",
		"tok":             "",
		"":                "",
		"Bearer tok more": "tok more", // compared whole, so never a match
	} {
		r := httptest.NewRequest("GET", "/", nil)
		if header != "" {
			r.Header.Set("Authorization", header)
		}
		if got := Bearer(r); got != want {
			t.Errorf("Bearer of %q = %q, want %q", header, got, want)
		}
	}
}

// Regression (issue #34 item 6): a body of the wrong shape was refused
// with encoding/json's words, "json: unknown field …" and "cannot
// unmarshal string into Go struct field StartWorker.gpu of type int".
// The message names the field by its JSON path and the kind it takes.
func TestBadJSONBodySaysWhatIsWrongInWords(t *testing.T) {
	type inner struct {
		N uint `json:"n"`
	}
	type body struct {
		GPU   *int    `json:"gpu"`
		Name  string  `json:"name"`
		Inner inner   `json:"inner"`
		List  []int   `json:"list"`
		F     float64 `json:"f"`
	}
	for in, want := range map[string]string{
		`{"gpu":"0"}`:        "invalid JSON body: gpu must be a whole number, not string",
		`{"name":1}`:         "invalid JSON body: name must be a string, not number",
		`{"inner":{"n":-1}}`: "invalid JSON body: inner.n must be a whole number of 0 or more, not number -1",
		`{"list":{}}`:        "invalid JSON body: list must be an array, not object",
		`{"bogus":1}`:        `invalid JSON body: unknown field "bogus"`,
		`[1]`:                "invalid JSON body: want an object, not array",
		`{"name":"x",}`:      "invalid JSON body: invalid character '}' looking for beginning of object key string (at byte 13)",
		`{"name":"x"`:        "invalid JSON body: the JSON ends before its value does",
	} {
		var b body
		err := DecodeBytes([]byte(in), &b)
		if err == nil || err.Error() != want {
			t.Errorf("DecodeBytes(%s) = %v, want %q", in, err, want)
		}
		for _, leak := range []string{"json:", "Go struct", "of type"} {
			if err != nil && strings.Contains(err.Error(), leak) {
				t.Errorf("DecodeBytes(%s): %q shows %q", in, err, leak)
			}
		}
		var ute *json.UnmarshalTypeError
		if in == `{"gpu":"0"}` && !errors.As(err, &ute) {
			t.Errorf("DecodeBytes(%s): the *json.UnmarshalTypeError is not wrapped: %v", in, err)
		}
	}
}
