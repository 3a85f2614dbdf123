package termtext

import (
	"strings"
	"testing"
)

func TestLine(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"plain text", "plain text"},
		{"", ""},
		{"größe 日本", "größe 日本"},
		{"\x1b]0;pwned\x07", `\x1b]0;pwned\x07`},
		{"\x1b[2J", `\x1b[2J`},
		{"a\nb\tc\rd", `a\nb\tc\rd`},
		{"del\x7f", `del\x7f`},
		{"csi\u009b2J", `csi\u009b2J`},
		{"rlo\u202eevil", `rlo\u202eevil`},
		{"isolate\u2066x\u2069", `isolate\u2066x\u2069`},
		{"bad\xffbyte\xc2", `bad\xffbyte\xc2`},
		{"nul\x00", `nul\x00`},
	} {
		if got := Line(tc.in); got != tc.want {
			t.Errorf("Line(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestText(t *testing.T) {
	if got, want := Text("one\x1b[2J\ntwo\tthree"), "one\\x1b[2J\ntwo\\tthree"; got != want {
		t.Errorf("Text = %q, want %q", got, want)
	}
}

func TestStream(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"Hello, world.\n\tIndented", "Hello, world.\n\tIndented"},
		{"a\x1b]0;pwned\x07b", "a]0;pwnedb"},
		{"clear\x1b[2J", "clear[2J"},
		{"cr\r\nlf", "cr\nlf"},
		{"c1\u009b31m rlo\u202e", "c131m rlo"},
		{"日本\xff", "日本"},
	} {
		if got := Stream(tc.in); got != tc.want {
			t.Errorf("Stream(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// Nothing any function returns holds a byte a terminal acts on (besides
// the newline and tab Text and Stream keep).
func FuzzClean(f *testing.F) {
	f.Add("\x1b]0;pwned\x07\x1b[2J\u009b\u202e\xff")
	f.Fuzz(func(t *testing.T, s string) {
		for name, out := range map[string]string{"Line": Line(s), "Text": Text(s), "Stream": Stream(s)} {
			for _, r := range out {
				if isControl(r) && !(r == '\n' && name != "Line") && !(r == '\t' && name == "Stream") {
					t.Fatalf("%s(%q) = %q holds %U", name, s, out, r)
				}
			}
			if strings.ContainsRune(out, 0xfffd) && !strings.ContainsRune(s, 0xfffd) && name != "Stream" {
				t.Fatalf("%s(%q) = %q: invalid bytes should be escaped", name, s, out)
			}
		}
	})
}
