package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// `apiary workers logs` prints a worker's log as printable text: its
// newlines stay, every other control character shows as an escape, and a
// character split between two reads is printed whole.
func TestWorkersLogsPrintsPrintableText(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/admin/workers/{id}/logs", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("id") != "wk-00000000000000aa" || r.URL.Query().Get("tail") != "2" || r.URL.Query().Get("follow") != "1" {
			http.Error(w, `{"error":{"code":"bad","message":"`+r.URL.String()+`"}}`, http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "text/plain")
		f := w.(http.Flusher)
		for _, piece := range []string{"ok line\n", "evil \x1b]0;pwned\a\x1b[2J \xc3", "\xa9t\u00e9\n"} {
			_, _ = w.Write([]byte(piece))
			f.Flush()
		}
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	code, out, errOut := apiary(t, "workers", "logs", "wk-00000000000000aa", "--tail", "2", "-f", "--queen", srv.URL)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if want := "ok line\nevil \\x1b]0;pwned\\x07\\x1b[2J ét\u00e9\n"; out != want {
		t.Errorf("printed %q, want %q", out, want)
	}
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"worker-1"}, "not a lifecycle id"},
		{[]string{"wk-00000000000000aa", "--tail", "0"}, "--tail must be from 1 to 10000"},
		{[]string{"wk-00000000000000aa", "--tail", "10001"}, "--tail must be from 1 to 10000"},
		{[]string{"wk-00000000000000aa", "--json"}, "--json does not apply"},
		{nil, "accepts 1 arg"},
	} {
		code, _, errOut := apiary(t, append(append([]string{"workers", "logs"}, tc.args...), "--queen", srv.URL)...)
		if code != 2 || !strings.Contains(errOut, tc.says) {
			t.Errorf("workers logs %v: exit %d %q, want 2 and %q", tc.args, code, errOut, tc.says)
		}
	}
}
