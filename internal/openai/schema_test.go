package openai

import (
	"encoding/json"
	"testing"
)

func TestCheckSchemaAcceptsTheSubset(t *testing.T) {
	for _, tt := range []struct {
		name   string
		schema string
		strict bool
	}{
		{"empty", `{}`, false},
		{"strict object", `{"type":"object","properties":{"a":{"type":"string","maxLength":3},"b":{"type":["integer","null"]}},
			"required":["a","b"],"additionalProperties":false,"title":"T","description":"d"}`, true},
		{"arrays and enums", `{"type":"array","items":{"enum":["x",1,null]},"minItems":1,"maxItems":4}`, false},
		{"anyOf const", `{"anyOf":[{"const":"a"},{"type":"number"},{"type":"boolean"}]}`, false},
		{"refs", `{"$defs":{"n":{"type":"integer","minimum":0,"maximum":9}},"type":"object",
			"properties":{"x":{"$ref":"#/$defs/n"}},"required":["x"],"additionalProperties":false}`, true},
		{"definitions", `{"definitions":{"s":{"type":"string"}},"$ref":"#/definitions/s"}`, false},
		{"loose object", `{"type":"object","properties":{"a":{"type":"string"}}}`, false},
	} {
		if err := CheckSchema("schema", json.RawMessage(tt.schema), tt.strict); err != nil {
			t.Errorf("%s: %v", tt.name, err)
		}
	}
}

func TestCheckSchemaNamesWhatItRefuses(t *testing.T) {
	for _, tt := range []struct {
		name   string
		schema string
		strict bool
		want   wantErr
	}{
		{"pattern", `{"type":"string","pattern":"^a"}`, false, bad(CodeUnsupported, "s.pattern")},
		{"format", `{"type":"object","properties":{"d":{"type":"string","format":"date"}}}`, false, bad(CodeUnsupported, "s.properties.d.format")},
		{"allOf", `{"allOf":[{"type":"string"}]}`, false, bad(CodeUnsupported, "s.allOf")},
		{"not", `{"not":{"type":"string"}}`, false, bad(CodeUnsupported, "s.not")},
		{"tuple items", `{"type":"array","items":[{"type":"string"}]}`, false, bad(CodeUnsupported, "s.items")},
		{"minimum on a number", `{"type":"number","minimum":0}`, false, bad(CodeUnsupported, "s.minimum")},
		{"remote ref", `{"$ref":"https://example.com/s.json"}`, false, bad(CodeUnsupported, "s.$ref")},
		{"missing def", `{"$ref":"#/$defs/none"}`, false, bad(CodeInvalidValue, "s.$ref")},
		{"unknown type", `{"type":"date"}`, false, bad(CodeInvalidValue, "s.type")},
		{"required not a property", `{"type":"object","properties":{},"required":["a"]}`, false, bad(CodeInvalidValue, "s.required[0]")},
		{"not an object", `[1]`, false, bad(CodeInvalidType, "s")},
		{"strict extra properties", `{"type":"object","properties":{"a":{"type":"string"}},"required":["a"]}`, true, bad(CodeInvalidValue, "s.additionalProperties")},
		{"strict optional property", `{"type":"object","properties":{"a":{"type":"string"}},"additionalProperties":false}`, true, bad(CodeInvalidValue, "s.required")},
	} {
		t.Run(tt.name, func(t *testing.T) {
			checkErr(t, CheckSchema("s", json.RawMessage(tt.schema), tt.strict), tt.want)
		})
	}
}
