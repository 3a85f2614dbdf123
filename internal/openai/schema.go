package openai

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// MaxSchemaDepth bounds how deeply a JSON schema may nest.
const MaxSchemaDepth = 32

// schemaTypes are the JSON types a schema's "type" may name.
var schemaTypes = []string{"object", "array", "string", "number", "integer", "boolean", "null"}

// CheckSchema checks a response_format JSON schema against the subset the
// worker turns into a grammar that enforces every part of it: objects with
// properties, required and additionalProperties; arrays with items,
// minItems and maxItems; strings with minLength and maxLength; integers
// with minimum, maximum, exclusiveMinimum and exclusiveMaximum; number,
// boolean and null; enum, const, anyOf (oneOf is read as anyOf), and $ref
// to "#/$defs/…" or "#/definitions/…". Annotations (title, description,
// default, examples, $schema, $id, $comment) are ignored. Any other keyword
// is refused with a 400 naming it, so that no constraint is silently
// dropped. strict adds OpenAI's strict-mode rules: every object sets
// additionalProperties to false and lists all its properties in required.
func CheckSchema(param string, raw json.RawMessage, strict bool) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var root any
	if err := dec.Decode(&root); err != nil {
		return typeError(param, "a JSON schema object", raw)
	}
	if _, ok := root.(map[string]any); !ok {
		return typeError(param, "a JSON schema object", raw)
	}
	c := schemaChecker{root: root.(map[string]any), strict: strict}
	return c.check(param, root, 0)
}

type schemaChecker struct {
	root   map[string]any
	strict bool
}

func schemaUnsupported(param, format string, a ...any) *Error {
	return Unsupported(param, "%s: %s", param, fmt.Sprintf(format, a...))
}

func (c schemaChecker) check(param string, v any, depth int) error {
	if depth > MaxSchemaDepth {
		return Invalid(param, "%s nests deeper than %d levels", param, MaxSchemaDepth)
	}
	s, ok := v.(map[string]any)
	if !ok {
		return Invalid(param, "%s must be a schema object", param)
	}
	types, err := schemaTypeList(param, s)
	if err != nil {
		return err
	}
	keys := make([]string, 0, len(s))
	for k := range s {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		val, p := s[k], param+"."+k
		switch k {
		case "type", "title", "description", "default", "examples", "$schema", "$id", "$comment":
		case "properties":
			props, ok := val.(map[string]any)
			if !ok {
				return Invalid(p, "%s must be an object of schemas", p)
			}
			names := make([]string, 0, len(props))
			for name := range props {
				names = append(names, name)
			}
			slices.Sort(names)
			for _, name := range names {
				if err := c.check(p+"."+name, props[name], depth+1); err != nil {
					return err
				}
			}
		case "required":
			list, ok := val.([]any)
			if !ok {
				return Invalid(p, "%s must be an array of property names", p)
			}
			props, _ := s["properties"].(map[string]any)
			for i, item := range list {
				name, ok := item.(string)
				if !ok {
					return Invalid(fmt.Sprintf("%s[%d]", p, i), "%s must name properties", p)
				}
				if _, ok := props[name]; !ok {
					return Invalid(fmt.Sprintf("%s[%d]", p, i), "%s names %q, which is not among the properties", p, name)
				}
			}
		case "additionalProperties":
			if _, ok := val.(bool); ok {
				continue
			}
			if err := c.check(p, val, depth+1); err != nil {
				return err
			}
		case "items":
			if _, ok := val.([]any); ok {
				return schemaUnsupported(p, "tuple items (an array of schemas) are not supported; give one schema")
			}
			if err := c.check(p, val, depth+1); err != nil {
				return err
			}
		case "enum":
			if list, ok := val.([]any); !ok || len(list) == 0 {
				return Invalid(p, "%s must be a non-empty array", p)
			}
		case "const":
		case "anyOf", "oneOf":
			list, ok := val.([]any)
			if !ok || len(list) == 0 {
				return Invalid(p, "%s must be a non-empty array of schemas", p)
			}
			for i, sub := range list {
				if err := c.check(fmt.Sprintf("%s[%d]", p, i), sub, depth+1); err != nil {
					return err
				}
			}
		case "$defs", "definitions":
			defs, ok := val.(map[string]any)
			if !ok {
				return Invalid(p, "%s must be an object of schemas", p)
			}
			names := make([]string, 0, len(defs))
			for name := range defs {
				names = append(names, name)
			}
			slices.Sort(names)
			for _, name := range names {
				if err := c.check(p+"."+name, defs[name], depth+1); err != nil {
					return err
				}
			}
		case "$ref":
			if err := c.checkRef(p, val); err != nil {
				return err
			}
		case "minItems", "maxItems":
			if !slices.Contains(types, "array") {
				return schemaUnsupported(p, "%s applies to arrays only here (\"type\": \"array\")", k)
			}
			if err := schemaCount(p, val); err != nil {
				return err
			}
		case "minLength", "maxLength":
			if !slices.Equal(types, []string{"string"}) {
				return schemaUnsupported(p, "%s is enforced for \"type\": \"string\" only", k)
			}
			if err := schemaCount(p, val); err != nil {
				return err
			}
		case "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum":
			// Enforced on integers; on numbers accepted as OpenAI accepts
			// them, not enforced (llama.cpp's converter bounds integers
			// only).
			switch {
			case slices.Equal(types, []string{"integer"}):
				n, ok := val.(json.Number)
				if _, err := strconv.ParseInt(string(n), 10, 64); !ok || err != nil {
					return Invalid(p, "%s must be an integer", p)
				}
			case slices.Equal(types, []string{"number"}):
				if _, ok := val.(json.Number); !ok {
					return Invalid(p, "%s must be a number", p)
				}
			default:
				return schemaUnsupported(p, "%s applies to \"type\": \"integer\" or \"number\" only here", k)
			}
		case "multipleOf":
			numeric := slices.Equal(types, []string{"integer"}) || slices.Equal(types, []string{"number"})
			if n, ok := val.(json.Number); !ok || !numeric || n.String() == "0" {
				return Invalid(p, "%s must be a non-zero number on an integer or a number", p)
			}
		case "pattern":
			// Enforced: llama.cpp turns a regular expression anchored at
			// both ends into grammar rules (one it cannot is refused when
			// the grammar is made); any other it would leave free, so it
			// is refused here.
			re, ok := val.(string)
			if !ok || !slices.Equal(types, []string{"string"}) {
				return Invalid(p, "%s must be a regular expression on \"type\": \"string\"", p)
			}
			if !strings.HasPrefix(re, "^") || !strings.HasSuffix(re, "$") || strings.HasSuffix(re, `\$`) {
				return schemaUnsupported(p, "only patterns anchored at both ends (^…$) can be enforced; got %q", re)
			}
		case "format":
			// date, time, date-time and uuid are enforced; the other
			// formats OpenAI takes (email, hostname, ipv4, ipv6, uri,
			// duration, …) are accepted and leave the string free.
			if _, ok := val.(string); !ok || !slices.Equal(types, []string{"string"}) {
				return Invalid(p, "%s must be a format name on \"type\": \"string\"", p)
			}
		case "propertyNames":
			// Accepted, not enforced: the names come from properties and
			// additionalProperties.
			if err := c.check(p, val, depth+1); err != nil {
				return err
			}
		default:
			return schemaUnsupported(p, "the JSON schema keyword %q is not supported (supported: type, properties, required, "+
				"additionalProperties, items, enum, const, anyOf, oneOf, $ref, $defs, minItems, maxItems, minLength, maxLength, "+
				"pattern, format, propertyNames, minimum/maximum and multipleOf)", k)
		}
	}
	if c.strict && (slices.Contains(types, "object") || s["properties"] != nil) {
		return c.checkStrictObject(param, s)
	}
	return nil
}

// schemaTypeList reads "type": a name or an array of names.
func schemaTypeList(param string, s map[string]any) ([]string, error) {
	t, ok := s["type"]
	if !ok {
		return nil, nil
	}
	var names []string
	switch t := t.(type) {
	case string:
		names = []string{t}
	case []any:
		for _, item := range t {
			name, ok := item.(string)
			if !ok {
				return nil, Invalid(param+".type", "%s.type must be a type name or an array of them", param)
			}
			names = append(names, name)
		}
	default:
		return nil, Invalid(param+".type", "%s.type must be a type name or an array of them", param)
	}
	for _, name := range names {
		if !slices.Contains(schemaTypes, name) {
			return nil, Invalid(param+".type", "%s.type %q is not one of %s", param, name, strings.Join(schemaTypes, ", "))
		}
	}
	return names, nil
}

func schemaCount(param string, v any) error {
	n, ok := v.(json.Number)
	i, err := strconv.ParseInt(string(n), 10, 32)
	if !ok || err != nil || i < 0 {
		return Invalid(param, "%s must be a non-negative integer", param)
	}
	return nil
}

// checkRef accepts a reference to a definition of the same document.
func (c schemaChecker) checkRef(param string, v any) error {
	ref, ok := v.(string)
	if !ok {
		return Invalid(param, "%s must be a string", param)
	}
	for _, prefix := range []string{"#/$defs/", "#/definitions/"} {
		name, ok := strings.CutPrefix(ref, prefix)
		if !ok {
			continue
		}
		defs, _ := c.root[strings.TrimSuffix(strings.TrimPrefix(prefix, "#/"), "/")].(map[string]any)
		if _, ok := defs[name]; !ok {
			return Invalid(param, "%s %q names no definition", param, ref)
		}
		return nil
	}
	return schemaUnsupported(param, "only references to \"#/$defs/…\" or \"#/definitions/…\" are supported, got %q", ref)
}

// checkStrictObject applies OpenAI's strict-mode rules to an object schema.
func (c schemaChecker) checkStrictObject(param string, s map[string]any) error {
	if ap, ok := s["additionalProperties"].(bool); !ok || ap {
		return Invalid(param+".additionalProperties", "strict mode needs \"additionalProperties\": false on every object (%s)", param)
	}
	props, _ := s["properties"].(map[string]any)
	req, _ := s["required"].([]any)
	for name := range props {
		if !slices.Contains(req, any(name)) {
			return Invalid(param+".required", "strict mode needs every property in required; %q is missing (%s)", name, param)
		}
	}
	return nil
}
