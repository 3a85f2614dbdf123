// Package termtext makes text that came from elsewhere (a daemon's names,
// reasons and errors, a model's answer) safe to write on a terminal: no
// control character reaches it, so no escape sequence can retitle the
// window, clear the screen, move the cursor or rewrite what was printed,
// and no bidirectional override can make text read other than it is.
//
// Control characters are C0 (U+0000–U+001F, tab and newline included), DEL
// (U+007F) and C1 (U+0080–U+009F, where a terminal may read U+009B as CSI);
// bidirectional controls are U+202A–U+202E and U+2066–U+2069. A byte that
// is not UTF-8 counts as a control character too.
package termtext

import (
	"strconv"
	"strings"
	"unicode/utf8"
)

// Line returns s as one line of printable text: every control character,
// newline and tab included, is written as a visible escape (\n, \t, \r,
// \x1b, \u009b, \u202e; a byte that is not UTF-8 as \xff). It is for table
// cells and one-line messages.
func Line(s string) string { return clean(s, "", true) }

// Text is Line for a message of several lines: newlines are kept, every
// other control character is escaped.
func Text(s string) string { return clean(s, "\n", true) }

// Stream returns a model's answer fit for a terminal: newlines and tabs
// are kept, every other control character and bidirectional control (and
// any byte that is not UTF-8) is dropped.
func Stream(s string) string { return clean(s, "\n\t", false) }

// clean keeps the control characters in keep, and escapes (or drops) the
// others.
func clean(s, keep string, escape bool) string {
	if printableASCII(s) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			if escape {
				b.WriteString(`\x`)
				b.WriteString(hex2(s[i]))
			}
		case strings.ContainsRune(keep, r) || !isControl(r):
			b.WriteString(s[i : i+size])
		case !escape:
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\r':
			b.WriteString(`\r`)
		case r < 0x80:
			b.WriteString(`\x`)
			b.WriteString(hex2(byte(r)))
		default:
			q := strconv.QuoteRuneToASCII(r) // '\u202e'
			b.WriteString(q[1 : len(q)-1])
		}
		i += size
	}
	return b.String()
}

// isControl reports whether r must not reach a terminal as it is.
func isControl(r rune) bool {
	return r < 0x20 || (r >= 0x7f && r <= 0x9f) ||
		(r >= 0x202a && r <= 0x202e) || (r >= 0x2066 && r <= 0x2069)
}

func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] >= 0x7f {
			return false
		}
	}
	return true
}

func hex2(c byte) string {
	const digits = "0123456789abcdef"
	return string([]byte{digits[c>>4], digits[c&0xf]})
}
