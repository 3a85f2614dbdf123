package chat

import (
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/ardanlabs/jinja"
)

// The template engine's own tojson differs from the one Hugging Face
// gives templates (Python's json.dumps with ensure_ascii=False): with
// indent it sorts the keys and escapes <, > and &. Templates are compiled
// with their tojson filter renamed to this one, which writes what
// json.dumps writes.
const tojsonFilter = "apiary_tojson"

var tojsonUse = regexp.MustCompile(`\|\s*tojson\b`)

// withOwnFilters rewrites the template's uses of tojson to tojsonFilter.
func withOwnFilters(src string) string {
	return tojsonUse.ReplaceAllString(src, "|"+tojsonFilter)
}

// pyJSON is Python's json.dumps(x, ensure_ascii, indent, separators,
// sort_keys) for template values.
func pyJSON(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 0 {
		return jinja.Undefined(), errors.New("tojson: nothing to encode")
	}
	e := jsonEncoder{item: ", ", key: ": "}
	if v, ok := kwargs["indent"]; ok && !v.IsNone() && !v.IsUndefined() {
		switch {
		case v.IsInt():
			e.indent, e.indented = strings.Repeat(" ", int(v.AsInt())), true
		case v.IsString():
			e.indent, e.indented = v.AsString(), true
		default:
			return jinja.Undefined(), errors.New("tojson: indent must be an integer or a string")
		}
		e.item = ","
	}
	if v, ok := kwargs["separators"]; ok && v.IsList() && v.AsList().Len() == 2 {
		it, k := v.AsList().Get(0), v.AsList().Get(1)
		if !it.IsString() || !k.IsString() {
			return jinja.Undefined(), errors.New("tojson: separators must be two strings")
		}
		e.item, e.key = it.AsString(), k.AsString()
	}
	if v, ok := kwargs["ensure_ascii"]; ok {
		e.ascii = v.IsTruthy()
	}
	if v, ok := kwargs["sort_keys"]; ok {
		e.sortKeys = v.IsTruthy()
	}
	var b strings.Builder
	if err := e.encode(&b, args[0], 0); err != nil {
		return jinja.Undefined(), err
	}
	return jinja.NewString(b.String()), nil
}

type jsonEncoder struct {
	item, key string
	indent    string
	indented  bool
	ascii     bool
	sortKeys  bool
}

func (e jsonEncoder) newline(b *strings.Builder, depth int) {
	if e.indented {
		b.WriteByte('\n')
		b.WriteString(strings.Repeat(e.indent, depth))
	}
}

func (e jsonEncoder) encode(b *strings.Builder, v jinja.Value, depth int) error {
	switch {
	case v.IsUndefined(), v.IsNone():
		b.WriteString("null")
	case v.IsBool():
		b.WriteString(strconv.FormatBool(v.AsBool()))
	case v.IsInt():
		b.WriteString(strconv.FormatInt(v.AsInt(), 10))
	case v.IsFloat():
		b.WriteString(pyFloat(v.AsFloat()))
	case v.IsString():
		e.str(b, v.AsString())
	case v.IsList():
		items := v.AsList().Items
		if len(items) == 0 {
			b.WriteString("[]")
			return nil
		}
		b.WriteByte('[')
		for i, it := range items {
			if i > 0 {
				b.WriteString(e.item)
			}
			e.newline(b, depth+1)
			if err := e.encode(b, it, depth+1); err != nil {
				return err
			}
		}
		e.newline(b, depth)
		b.WriteByte(']')
	case v.IsDict():
		d := v.AsDict()
		keys := d.OrderedKeys()
		if len(keys) == 0 {
			b.WriteString("{}")
			return nil
		}
		if e.sortKeys {
			sortStrings(keys)
		}
		b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				b.WriteString(e.item)
			}
			e.newline(b, depth+1)
			e.str(b, k)
			b.WriteString(e.key)
			val, _ := d.Get(k)
			if err := e.encode(b, val, depth+1); err != nil {
				return err
			}
		}
		e.newline(b, depth)
		b.WriteByte('}')
	default:
		return fmt.Errorf("tojson: cannot encode %v", v)
	}
	return nil
}

func sortStrings(s []string) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}

// str writes s as json.dumps does: ", \ and control characters escaped,
// and with ensure_ascii everything past ASCII as \uXXXX (UTF-16).
func (e jsonEncoder) str(b *strings.Builder, s string) {
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
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		default:
			switch {
			case r < 0x20 || (e.ascii && r == 0x7f):
				fmt.Fprintf(b, `\u%04x`, r)
			case e.ascii && r > 0x7f:
				if r > 0xffff {
					r -= 0x10000
					fmt.Fprintf(b, `\u%04x\u%04x`, 0xd800+(r>>10), 0xdc00+(r&0x3ff))
				} else {
					fmt.Fprintf(b, `\u%04x`, r)
				}
			case r == utf8.RuneError:
				b.WriteRune(r)
			default:
				b.WriteRune(r)
			}
		}
	}
	b.WriteByte('"')
}

// pyFloat is Python's repr of a float, as json.dumps writes it.
func pyFloat(f float64) string {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	}
	if a := math.Abs(f); a == 0 || (a >= 1e-4 && a < 1e16) {
		s := strconv.FormatFloat(f, 'f', -1, 64)
		if !strings.ContainsAny(s, ".") {
			s += ".0"
		}
		return s
	}
	s := strconv.FormatFloat(f, 'e', -1, 64) // 1e+16, 1.5e-05: Python's shape
	return s
}
