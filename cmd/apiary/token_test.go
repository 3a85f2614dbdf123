package main

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"
)

// A token no request can carry is refused at start by every command
// that takes one, each problem on a line of its own that names the
// token's variable once: 20 spaces passed the queen's length check, a
// token with a newline was taken, and the queen's length error began
// each line with the names of all three tokens.
func TestTokensThatCanNeverWorkAreRefused(t *testing.T) {
	const form = "; a token must be printable ASCII without spaces, as it is sent in an HTTP header (e.g. openssl rand -hex 32)"
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		says []string // lines of stderr, after "apiary: " and the command's prefix
	}{
		{"queen", map[string]string{"APIARY_API_TOKEN": "short", "APIARY_ADMIN_TOKEN": strings.Repeat(" ", 20),
			"APIARY_CLUSTER_TOKEN": "0123456789abcdef\n"},
			[]string{"queen", "--addr", "127.0.0.1:0"},
			[]string{"APIARY_API_TOKEN is 5 bytes; a token needs at least 16 (e.g. openssl rand -hex 32)",
				"APIARY_ADMIN_TOKEN is blank (only white space)" + form,
				"APIARY_CLUSTER_TOKEN has a newline at byte 17" + form}},
		{"hive", map[string]string{"APIARY_CLUSTER_TOKEN": "0123456789 abcdef"},
			[]string{"hive", "--addr", "127.0.0.1:0", "--queen", ""},
			[]string{"APIARY_CLUSTER_TOKEN has a space at byte 11" + form}},
		{"engine-front", map[string]string{"APIARY_WORKER_TOKEN": "0123456789abcdef\r\n", "APIARY_ENGINE_KEY": "0123456789abcdéf"},
			[]string{"engine-front", "--engine-url", "http://127.0.0.1:1", "--", "/bin/true"},
			[]string{"APIARY_WORKER_TOKEN has a carriage return at byte 17" + form,
				"APIARY_ENGINE_KEY has a non-ASCII byte at byte 15" + form}},
		{"worker", map[string]string{"APIARY_WORKER_TOKEN": "\t"},
			[]string{"worker", "--model", "/nonexistent/tiny.gguf"},
			[]string{"APIARY_WORKER_TOKEN is blank (only white space)" + form}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			args := tc.args
			if tc.name == "queen" || tc.name == "hive" {
				args = append(args, "--data-dir", t.TempDir())
			}
			// A daemon that took the token would serve until the context
			// ends (then exit 0), not hang the test.
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			var errb bytes.Buffer
			code := exitCode(run(ctx, args, io.Discard, &errb), &errb)
			errOut := errb.String()
			if code != 2 {
				t.Errorf("exit %d, want 2; stderr %q", code, errOut)
			}
			for _, line := range tc.says {
				if !strings.Contains(errOut, line+"\n") {
					t.Errorf("stderr lacks the line %q:\n%s", line, errOut)
				}
			}
			for name := range tc.env {
				if n := strings.Count(errOut, name); n != 1 {
					t.Errorf("%s named %d times, want once:\n%s", name, n, errOut)
				}
			}
			if strings.Contains(errOut, "the tokens (") {
				t.Errorf("the token error repeats the prefix of all tokens:\n%s", errOut)
			}
		})
	}
}
