package api

import (
	"regexp"
	"strings"
)

// idPattern is what an id on the wire may be: pool, node, worker and
// lifecycle ids. It uses * and leaves the length to CheckID: a counted
// repetition such as {0,127} compiles into a program of that many copies,
// which costs every process start milliseconds.
var idPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:@-]*$`)

// IsLifecycleID says whether s is a lifecycle row's id as the queen makes
// them: wk- and 16 lowercase hex digits. The queen refuses any other (400),
// and the CLI before it asks (a usage error).
func IsLifecycleID(s string) bool {
	hex, ok := strings.CutPrefix(s, "wk-")
	if !ok || len(hex) != 16 {
		return false
	}
	for _, c := range hex {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// MaxIDLen bounds an id.
const MaxIDLen = 128

// CheckID is the one check of an id that queen and hive both apply, so
// that a hive never takes what its queen would refuse: 1-128 letters,
// digits, '.', '_', ':', '@' or '-', starting with a letter or digit. what
// names the field in the 400.
func CheckID(what, s string) error {
	if len(s) > MaxIDLen || !idPattern.MatchString(s) {
		return BadRequest("%s %q is not valid: 1-128 letters, digits, '.', '_', ':', '@' or '-', starting with a letter or digit", what, Printable(s, 140))
	}
	return nil
}

// modelPattern is a model ref: a GGUF file name without .gguf. At most
// 200 bytes, which CheckModel counts.
var modelPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._+-]*$`)

// MaxModelLen bounds a model ref.
const MaxModelLen = 200

// CheckModel is the one check of a model ref that queen and routing
// apply: a GGUF file name without .gguf (letters, digits, '.', '_', '+',
// '-'), never "..".
func CheckModel(s string) error {
	if len(s) > MaxModelLen || !modelPattern.MatchString(s) || strings.Contains(s, "..") {
		return BadRequest("model %q is not a model ref: a GGUF file name without .gguf (letters, digits, '.', '_', '+', '-')", Printable(s, MaxModelLen+20))
	}
	return nil
}
