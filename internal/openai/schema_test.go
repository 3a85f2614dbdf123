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
		// What zod writes (issue #31's item 5).
		{"zod formats, pattern, bounds and records", `{"type":"object","properties":{
			"email":{"type":"string","format":"email"},"site":{"type":"string","format":"uri"},"id":{"type":"string","format":"uuid"},
			"at":{"type":"string","format":"date-time"},"code":{"type":"string","pattern":"^[A-Z]{3}$"},
			"price":{"type":"number","minimum":0,"exclusiveMaximum":1000},"n":{"type":"integer","minimum":1,"multipleOf":2},
			"tags":{"type":"object","propertyNames":{"type":"string","pattern":"^[a-z]+$"},"additionalProperties":{"type":"string"}}},
			"required":["email","site","id","at","code","price","n","tags"],"additionalProperties":false}`, false},
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
		{"pattern not a string", `{"type":"string","pattern":7}`, false, bad(CodeInvalidValue, "s.pattern")},
		{"pattern on a number", `{"type":"number","pattern":"^1$"}`, false, bad(CodeInvalidValue, "s.pattern")},
		{"pattern not anchored", `{"type":"string","pattern":"^a"}`, false, bad(CodeUnsupported, "s.pattern")},
		{"pattern ending in an escaped dollar", `{"type":"string","pattern":"^a\\$"}`, false, bad(CodeUnsupported, "s.pattern")},
		{"format on an object", `{"type":"object","properties":{"d":{"type":"object","format":"date"}}}`, false, bad(CodeInvalidValue, "s.properties.d.format")},
		{"allOf", `{"allOf":[{"type":"string"}]}`, false, bad(CodeUnsupported, "s.allOf")},
		{"not", `{"not":{"type":"string"}}`, false, bad(CodeUnsupported, "s.not")},
		{"tuple items", `{"type":"array","items":[{"type":"string"}]}`, false, bad(CodeUnsupported, "s.items")},
		{"minimum on a string", `{"type":"string","minimum":0}`, false, bad(CodeUnsupported, "s.minimum")},
		{"multipleOf zero", `{"type":"number","multipleOf":0}`, false, bad(CodeInvalidValue, "s.multipleOf")},
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
