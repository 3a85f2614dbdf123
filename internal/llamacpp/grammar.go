package llamacpp

/*
#cgo CXXFLAGS: -std=c++17
#include <stdlib.h>
#include "schema.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"strings"
	"unsafe"

	"github.com/apiary-llm/apiary/internal/engine"
)

// SchemaGrammar turns a JSON schema into a GBNF grammar with llama.cpp's
// converter (common/json-schema-to-grammar.cpp). An error wraps
// engine.ErrGrammar and carries the converter's reason.
func SchemaGrammar(schema []byte) (string, error) {
	if len(schema) == 0 {
		return "", fmt.Errorf("%w: empty JSON schema", engine.ErrGrammar)
	}
	cs := C.CBytes(schema)
	defer C.free(cs)
	var ok C.int
	out := C.apiary_schema_to_grammar((*C.char)(cs), C.size_t(len(schema)), &ok)
	if out == nil {
		return "", errors.New("out of memory converting a JSON schema")
	}
	defer C.free(unsafe.Pointer(out))
	text := C.GoString(out)
	if ok == 0 {
		return "", fmt.Errorf("%w: %s", engine.ErrGrammar, text)
	}
	return strings.ReplaceAll(text, anyJSONChar, validJSONChar), nil
}

// WrapGrammar turns a grammar made by SchemaGrammar into one whose output
// is w's text around the schema's JSON (a tool call in a model family's
// syntax): the schema's root rule is renamed, and a new root puts the
// prefix, the JSON and the suffix in order, repeated when w says so.
func WrapGrammar(grammar string, w engine.GrammarWrap) string {
	const inner = "apiary-wrapped-root"
	lines := strings.Split(grammar, "\n")
	for i, l := range lines {
		if rest, ok := strings.CutPrefix(l, "root ::="); ok {
			lines[i] = inner + " ::=" + rest
		}
	}
	item := strings.TrimSpace(gbnfLiteral(w.Prefix) + " " + inner + " " + gbnfLiteral(w.Suffix))
	root := "root ::= " + item
	if w.Repeat {
		root += " (" + strings.TrimSpace(gbnfLiteral(w.Separator)+" "+item) + ")*"
	}
	return root + "\n" + strings.Join(lines, "\n")
}

// gbnfLiteral is s as a GBNF string literal; "" for the empty string.
func gbnfLiteral(s string) string {
	if s == "" {
		return ""
	}
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// llama.cpp's grammar reads a token's bytes as UTF-8 without checking
// them, so bytes that are not UTF-8 (a byte-level token such as 0xFC) read
// as code points past U+10FFFF. The converter's character class for JSON
// strings admits those; the class that replaces it keeps JSON strings to
// real characters (no surrogates, nothing past U+10FFFF).
const (
	anyJSONChar   = `[^"\\\x7F\x00-\x1F]`
	validJSONChar = `[^"\\\x7F\x00-\x1F\uD800-\uDFFF\U00110000-\U7FFFFFFF]`
)
