package worker

import (
	"strings"
	"unicode/utf8"
)

// textFilter turns the raw token pieces of one generation into the text a
// client may see, as soon as it is certain:
//
//   - bytes of a UTF-8 character split across tokens are held until the
//     character is complete (invalid bytes become U+FFFD);
//   - text that could be the start of a stop sequence is held until the
//     following tokens show whether it is one;
//   - once a stop sequence appears, the text before it is released and the
//     rest, the stop sequence included, is dropped.
type textFilter struct {
	stops   []string
	pending []byte // an incomplete UTF-8 character at the end of the pieces
	held    string // complete text that may be the start of a stop sequence
	stopped bool
	matched string // the stop sequence that matched
}

func newTextFilter(stops []string) *textFilter { return &textFilter{stops: stops} }

// push adds one token's piece and returns the text now safe to send, and
// whether a stop sequence matched (then nothing more may be pushed).
func (f *textFilter) push(piece []byte) (text string, stopped bool) {
	f.pending = append(f.pending, piece...)
	n := completeLen(f.pending)
	s := f.held + strings.ToValidUTF8(string(f.pending[:n]), "\uFFFD")
	f.pending = append(f.pending[:0], f.pending[n:]...)

	if i, stop := f.firstStop(s); i >= 0 {
		f.held, f.pending, f.stopped, f.matched = "", nil, true, stop
		return s[:i], true
	}
	keep := f.stopPrefixLen(s)
	f.held = s[len(s)-keep:]
	return s[:len(s)-keep], false
}

// flush returns what is still held when the generation ends without a stop
// sequence: a possible stop prefix that turned out not to be one, and the
// bytes of an unfinished character (as U+FFFD).
func (f *textFilter) flush() string {
	if f.stopped {
		return ""
	}
	s := f.held + strings.ToValidUTF8(string(f.pending), "\uFFFD")
	f.held, f.pending = "", nil
	return s
}

// firstStop is the index of the earliest stop sequence in s, and that
// sequence; -1 when none is.
func (f *textFilter) firstStop(s string) (int, string) {
	first, which := -1, ""
	for _, stop := range f.stops {
		if i := strings.Index(s, stop); i >= 0 && (first < 0 || i < first) {
			first, which = i, stop
		}
	}
	return first, which
}

// stopPrefixLen is the length of the longest suffix of s that is a proper
// prefix of a stop sequence. Because s is valid UTF-8 and stop sequences
// are too, the cut falls on a character boundary.
func (f *textFilter) stopPrefixLen(s string) int {
	longest := 0
	for _, stop := range f.stops {
		for k := min(len(s), len(stop)-1); k > longest; k-- {
			if strings.HasSuffix(s, stop[:k]) {
				longest = k
				break
			}
		}
	}
	return longest
}

// completeLen is the length of the longest prefix of p that does not end
// inside a UTF-8 character which later bytes could complete.
func completeLen(p []byte) int {
	for i := len(p) - 1; i >= 0 && i >= len(p)-(utf8.UTFMax-1); i-- {
		if utf8.RuneStart(p[i]) {
			if utf8.FullRune(p[i:]) {
				return len(p)
			}
			return i
		}
	}
	return len(p)
}
