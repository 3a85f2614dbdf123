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
		return "", errors.New("llamacpp: out of memory converting a JSON schema")
	}
	defer C.free(unsafe.Pointer(out))
	text := C.GoString(out)
	if ok == 0 {
		return "", fmt.Errorf("%w: %s", engine.ErrGrammar, text)
	}
	return strings.ReplaceAll(text, anyJSONChar, validJSONChar), nil
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
