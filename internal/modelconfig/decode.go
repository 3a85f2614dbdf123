package modelconfig

import (
	"errors"
	"io"
	"reflect"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/apiary-llm/apiary/internal/config"
)

// decode fills out from the YAML in data, strictly: a key that names no
// field, a key given twice and a value of the wrong type are each a
// problem named by its path in the file (models.qwen.ctx_size), all
// reported at once. yaml.v3's own strict mode names neither the path nor
// a repeated key of a struct.
func decode(data []byte, out *File) error {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return config.YAMLError(err)
	}
	if len(doc.Content) == 0 {
		return nil // an empty file: no models
	}
	var p config.Problems
	decodeNode(doc.Content[0], "", reflect.ValueOf(out).Elem(), &p)
	return p.Err()
}

var durationType = reflect.TypeFor[time.Duration]()

func decodeNode(n *yaml.Node, path string, v reflect.Value, p *config.Problems) {
	if n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	where := path
	if where == "" {
		where = "the file"
	}
	isNull := n.Kind == yaml.ScalarNode && n.Tag == "!!null"
	switch {
	case v.Kind() == reflect.Struct:
		if isNull {
			return // "name:" alone: every default
		}
		if n.Kind != yaml.MappingNode {
			p.Add(where, "must be a mapping of keys (line %d)", n.Line)
			return
		}
		tags := yamlKeys(v.Type())
		eachPair(n, path, p, func(key string, k, val *yaml.Node) {
			i, ok := tags[key]
			if !ok {
				p.Add(join(path, key), "is not a known key (line %d); the keys are %s", k.Line, strings.Join(keyList(v.Type()), ", "))
				return
			}
			decodeNode(val, join(path, key), v.Field(i), p)
		})
	case v.Kind() == reflect.Map:
		if isNull {
			return
		}
		if n.Kind != yaml.MappingNode {
			p.Add(where, "must be a mapping of names (line %d)", n.Line)
			return
		}
		if v.IsNil() {
			v.Set(reflect.MakeMap(v.Type()))
		}
		eachPair(n, path, p, func(key string, _, val *yaml.Node) {
			elem := reflect.New(v.Type().Elem()).Elem()
			decodeNode(val, join(path, key), elem, p)
			v.SetMapIndex(reflect.ValueOf(key), elem)
		})
	default:
		if v.Type() == durationType && n.Kind == yaml.ScalarNode && n.Tag == "!!int" {
			// A bare number would be nanoseconds: ask for the unit.
			p.Add(where, "is %s without a unit (line %d); write a duration such as 30s or 5m", n.Value, n.Line)
			return
		}
		if err := n.Decode(v.Addr().Interface()); err != nil {
			p.Add(where, "%s", yamlProblem(err))
		}
	}
}

// eachPair calls fn with each key of the mapping n, reporting a key that
// is not a string or that comes twice.
func eachPair(n *yaml.Node, path string, p *config.Problems, fn func(key string, k, v *yaml.Node)) {
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			p.Add(join(path, "?"), "a key must be a plain name (line %d)", k.Line)
			continue
		}
		if line, dup := seen[k.Value]; dup {
			p.Add(join(path, k.Value), "is given twice (lines %d and %d)", line, k.Line)
			continue
		}
		seen[k.Value] = k.Line
		fn(k.Value, k, val)
	}
}

// yamlProblem is yaml.v3's error without its "yaml: unmarshal errors:"
// preamble.
func yamlProblem(err error) string {
	var te *yaml.TypeError
	if errors.As(err, &te) {
		return "has the wrong type (" + strings.Join(te.Errors, "; ") + ")"
	}
	return strings.TrimPrefix(err.Error(), "yaml: ")
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// yamlKeys maps each yaml key of struct type t to its field index.
func yamlKeys(t reflect.Type) map[string]int {
	out := map[string]int{}
	for i := range t.NumField() {
		if tag := yamlTag(t.Field(i)); tag != "" {
			out[tag] = i
		}
	}
	return out
}

// keyList is the yaml keys of t in field order.
func keyList(t reflect.Type) []string {
	var out []string
	for i := range t.NumField() {
		if tag := yamlTag(t.Field(i)); tag != "" {
			out = append(out, tag)
		}
	}
	return out
}

func yamlTag(f reflect.StructField) string {
	if !f.IsExported() {
		return ""
	}
	tag, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
	if tag == "-" {
		return ""
	}
	return tag
}

// modelKeys is the keys of a model, in the order Diff names them.
var modelKeys = keyList(reflect.TypeFor[Model]())

// reflectFields is each key of m with its value.
func reflectFields(m Model) map[string]any {
	v := reflect.ValueOf(m)
	out := map[string]any{}
	for key, i := range yamlKeys(v.Type()) {
		out[key] = v.Field(i).Interface()
	}
	return out
}

// readFull reads r into buf until buf is full or r ends.
func readFull(r io.Reader, buf []byte) (int, error) {
	n, err := io.ReadFull(r, buf)
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		err = nil
	}
	return n, err
}
