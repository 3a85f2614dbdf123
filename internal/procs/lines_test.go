package procs

import (
	"slices"
	"strings"
	"testing"
)

func TestLinesSplitsAndBounds(t *testing.T) {
	var got []string
	l := NewLines(func(s string) { got = append(got, s) })
	for _, p := range []string{"one\r\ntw", "o\n", "\nthree", "\n"} {
		if n, err := l.Write([]byte(p)); n != len(p) || err != nil {
			t.Fatalf("Write(%q) = %d, %v", p, n, err)
		}
	}
	if want := []string{"one", "two", "", "three"}; !slices.Equal(got, want) {
		t.Errorf("lines %q, want %q", got, want)
	}
	got = nil
	_, _ = l.Write([]byte(strings.Repeat("x", maxLine+1)))
	if len(got) != 1 || len(got[0]) != maxLine+1 {
		t.Errorf("a line without end is not handed over once it passes the bound: %d lines", len(got))
	}
}
