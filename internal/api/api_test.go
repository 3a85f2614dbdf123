package api

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
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
