package worker

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestTextFilter(t *testing.T) {
	tests := []struct {
		name    string
		stops   []string
		pieces  []string
		want    []string // text released after each piece
		flush   string
		stopped bool
	}{
		{
			name:   "plain text passes through token by token",
			pieces: []string{"Hel", "lo", " world"},
			want:   []string{"Hel", "lo", " world"},
		},
		{
			name:   "euro sign split over two tokens is held until complete",
			pieces: []string{"a", "\xe2\x82", "\xac", "b"},
			want:   []string{"a", "", "€", "b"},
		},
		{
			name:   "emoji split over four tokens",
			pieces: []string{"\xf0", "\x9f", "\x90", "\x9d!"},
			want:   []string{"", "", "", "🐝!"},
		},
		{
			name:   "completion of one character and start of the next in one piece",
			pieces: []string{"\xc3", "\xa9\xc3", "\xa9"},
			want:   []string{"", "é", "é"},
		},
		{
			name:   "invalid bytes become the replacement character",
			pieces: []string{"a\xffb", "\x80"},
			want:   []string{"a\uFFFDb", "\uFFFD"},
		},
		{
			name:   "unfinished character at the end is flushed as a replacement",
			pieces: []string{"ok", "\xe2\x82"},
			want:   []string{"ok", ""},
			flush:  "\uFFFD",
		},
		{
			name:    "stop sequence inside one token",
			stops:   []string{"END"},
			pieces:  []string{"abc", "xENDy"},
			want:    []string{"abc", "x"},
			stopped: true,
		},
		{
			name:    "stop sequence across token boundaries is held then dropped",
			stops:   []string{"world"},
			pieces:  []string{"Hello", " wor", "ld! more"},
			want:    []string{"Hello", " ", ""},
			stopped: true,
		},
		{
			name:   "a stop prefix that turns out not to be one is released",
			stops:  []string{"world"},
			pieces: []string{"Hello wo", "rk", "s"},
			want:   []string{"Hello ", "work", "s"},
		},
		{
			name:   "a held stop prefix is flushed at the end",
			stops:  []string{"\n\n"},
			pieces: []string{"line", "\n"},
			want:   []string{"line", ""},
			flush:  "\n",
		},
		{
			name:    "stop at the very start sends nothing",
			stops:   []string{"###"},
			pieces:  []string{"#", "##", "tail"},
			want:    []string{"", ""},
			stopped: true,
		},
		{
			name:    "the earliest of several stops wins",
			stops:   []string{"two", "one"},
			pieces:  []string{"zero one two"},
			want:    []string{"zero "},
			stopped: true,
		},
		{
			name:    "stop sequence with a multi-byte character split across tokens",
			stops:   []string{"€5"},
			pieces:  []string{"cost \xe2", "\x82\xac", "5 total"},
			want:    []string{"cost ", "", ""},
			stopped: true,
		},
		{
			name:   "overlapping prefixes hold only what may still match",
			stops:  []string{"abab"},
			pieces: []string{"xaba", "c"},
			want:   []string{"x", "abac"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newTextFilter(tt.stops)
			var got []string
			stopped := false
			for _, p := range tt.pieces {
				text, s := f.push([]byte(p))
				got = append(got, text)
				if s {
					stopped = true
					break
				}
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("released text mismatch (-want +got):\n%s", diff)
			}
			if stopped != tt.stopped {
				t.Errorf("stopped = %v, want %v", stopped, tt.stopped)
			}
			if got := f.flush(); got != tt.flush {
				t.Errorf("flush = %q, want %q", got, tt.flush)
			}
		})
	}
}
