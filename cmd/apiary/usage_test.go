package main

import (
	"strings"
	"testing"
)

// Regression (issue 12): an unknown command exited 1 while every other
// usage error exits 2.
func TestUnknownCommandExits2(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		says string
	}{
		{[]string{"bogus"}, 2, `unknown command "bogus" for "apiary"`},
		{[]string{"quen"}, 2, "did you mean queen?"},
		{[]string{"pools", "bogus"}, 2, `unknown command "bogus" for "apiary pools"`},
		{[]string{"workers", "ls", "--bogus"}, 2, "unknown flag: --bogus"},
		{nil, 0, ""},
	} {
		code, out, errOut := apiary(t, tc.args...)
		if code != tc.code || !strings.Contains(errOut, tc.says) {
			t.Errorf("apiary %v: exit %d, stderr %q; want %d and %q", tc.args, code, errOut, tc.code, tc.says)
		}
		if tc.args == nil && !strings.Contains(out, "Available Commands") {
			t.Errorf("apiary alone prints no help: %q", out)
		}
	}
}

// Regression (issue 12): persistent `apiary infer --model /other/dir/small.gguf`
// silently served the pools' own, different, small. A path is refused
// with a usage error that names the ref and ephemeral mode.
func TestPersistentInferRefusesAModelPath(t *testing.T) {
	q := "--queen=" + startTestQueen(t)
	for _, model := range []string{"/other/dir/small.gguf", "./small.gguf", "small.gguf", "dir/small"} {
		code, out, errOut := apiary(t, "infer", q, "--model", model, "--prompt", "hi")
		if code != 2 || out != "" {
			t.Errorf("infer --model %s: exit %d, stdout %q; want 2 and nothing", model, code, out)
		}
		for _, s := range []string{"--model " + model + " is a path", "--model small", "ephemeral mode"} {
			if !strings.Contains(errOut, s) {
				t.Errorf("infer --model %s: stderr lacks %q: %s", model, s, errOut)
			}
		}
	}
}
