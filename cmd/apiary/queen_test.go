package main

import (
	"strings"
	"testing"
)

// Retention flags: 0 keeps forever (checked end to end by the queen's
// TestProcessQueenRetentionFlags); a negative or sub-minute one is a usage
// error that names the flag.
func TestQueenRetentionFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"--rows-retention", "-1h"}, "--rows-retention must not be negative"},
		{[]string{"--audit-retention", "30s"}, "--audit-retention 30s is shorter than 1m0s"},
	} {
		args := append([]string{"queen", "--addr", "127.0.0.1:0", "--data-dir", t.TempDir()}, tc.args...)
		code, _, errOut := apiary(t, args...)
		if code != 2 || !strings.Contains(errOut, tc.says) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", tc.args, code, errOut, tc.says)
		}
	}
}
