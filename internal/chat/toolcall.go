package chat

import (
	"bytes"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"strings"
	"unicode"
)

// Syntax is how a model family writes tool calls.
type Syntax int

const (
	// Hermes is Hermes 2 Pro's and Qwen 2.5's (and the default):
	// <tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>, one block
	// a call.
	Hermes Syntax = iota
	// Llama3 is Llama 3.x's: {"name": …, "parameters": {…}}, after
	// <|python_tag|> or alone.
	Llama3
	// Mistral is Mistral's: [TOOL_CALLS][{"name": …, "arguments": {…}}, …].
	Mistral
)

func (s Syntax) String() string {
	switch s {
	case Llama3:
		return "llama3"
	case Mistral:
		return "mistral"
	}
	return "hermes"
}

// SyntaxOf tells a template's tool-call syntax from its text: [TOOL_CALLS]
// is Mistral's, Llama 3's header markers with the ipython role or
// <|python_tag|> are Llama 3.x's, anything else (<tool_call>, or a
// template that knows no tools) is Hermes'.
func SyntaxOf(template string) Syntax {
	switch {
	case strings.Contains(template, "[TOOL_CALLS]"):
		return Mistral
	case strings.Contains(template, "<|python_tag|>"),
		strings.Contains(template, "<|start_header_id|>") && strings.Contains(template, "ipython"):
		return Llama3
	}
	return Hermes
}

// Wrap is how the calls forced by Constraint's schema are written: one
// (or, with Repeat, several separated by Separator) of Prefix, JSON the
// schema accepts, Suffix.
type Wrap struct {
	Prefix, Suffix, Separator string
	Repeat                    bool
}

// argsKey is the member holding a call's arguments.
func (s Syntax) argsKey() string {
	if s == Llama3 {
		return "parameters"
	}
	return "arguments"
}

// Constraint returns the JSON schema of one call of one of tools in s's
// syntax, with the text around it, for a grammar that forces a call.
// parallel allows several calls where the syntax has a way to write them.
func (s Syntax) Constraint(tools []Tool, parallel bool) ([]byte, Wrap) {
	alts := make([]any, len(tools))
	for i, t := range tools {
		params := json.RawMessage(`{"type":"object","properties":{},"additionalProperties":false}`) // no parameters: {}
		if len(bytes.TrimSpace(t.Parameters)) > 0 {
			params = t.Parameters
		}
		alts[i] = ordered{{"type", "object"}, {"properties", ordered{{"name", ordered{{"const", t.Name}}}, {s.argsKey(), params}}},
			{"required", []string{"name", s.argsKey()}}, {"additionalProperties", false}}
	}
	var call any = alts[0]
	if len(alts) > 1 {
		call = ordered{{"anyOf", alts}}
	}
	switch s {
	case Mistral:
		arr := ordered{{"type", "array"}, {"items", call}, {"minItems", 1}}
		if !parallel {
			arr = append(arr, kv{"maxItems", 1})
		}
		return mustJSON(arr), Wrap{Prefix: "[TOOL_CALLS]"}
	case Llama3:
		return mustJSON(call), Wrap{}
	}
	return mustJSON(call), Wrap{Prefix: "<tool_call>\n", Suffix: "\n</tool_call>", Separator: "\n", Repeat: parallel}
}

// Format writes c in s's syntax, as the model would.
func (s Syntax) Format(c ToolCall) string {
	args := strings.TrimSpace(c.Arguments)
	if !json.Valid([]byte(args)) {
		args = string(mustJSON(c.Arguments))
	}
	obj := fmt.Sprintf(`{"name": %s, %q: %s}`, mustJSON(c.Name), s.argsKey(), args)
	switch s {
	case Mistral:
		return "[TOOL_CALLS][" + obj + "]"
	case Llama3:
		return obj
	}
	return "<tool_call>\n" + obj + "\n</tool_call>"
}

// markers are the texts that open a call in s's syntax.
func (s Syntax) markers() []string {
	switch s {
	case Mistral:
		return []string{"[TOOL_CALLS]"}
	case Llama3:
		return []string{"<|python_tag|>"}
	}
	return []string{"<tool_call>"}
}

// opensCall reports whether text (past leading spaces) begins a call: a
// marker, or a bare call's first character.
func (s Syntax) opensCall(text string) bool {
	t := strings.TrimLeftFunc(text, unicode.IsSpace)
	if t == "" {
		return false
	}
	for _, m := range s.markers() {
		if strings.HasPrefix(t, m) || strings.HasPrefix(m, t) {
			return true
		}
	}
	return s.bareStart() != 0 && t[0] == s.bareStart()
}

// bareStart is the first character of calls written without a marker
// (Llama 3.x's JSON object, Mistral's array when the control token
// [TOOL_CALLS] is not rendered as text), or 0.
func (s Syntax) bareStart() byte {
	switch s {
	case Mistral:
		return '['
	case Llama3:
		return '{'
	}
	return 0
}

// callID is the id a template is given for id: Mistral's templates want
// nine letters and digits, so other ids are mapped to such a one (the same
// id always to the same one, so calls and results still match).
func (s Syntax) callID(id string) string {
	if s != Mistral || id == "" {
		return id
	}
	if len(id) == 9 && strings.IndexFunc(id, func(r rune) bool { return r > unicode.MaxASCII || !(unicode.IsLetter(r) || unicode.IsDigit(r)) }) < 0 {
		return id
	}
	const alnum = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	h := fnv.New64a()
	h.Write([]byte(id))
	n := h.Sum64()
	out := make([]byte, 9)
	for i := range out {
		out[i] = alnum[n%uint64(len(alnum))]
		n /= uint64(len(alnum))
	}
	return string(out)
}

// Parse finds the calls in a whole generated text: content is the text
// that is not a call (trimmed when there are calls), calls the calls in
// order (their IDs empty). Text that looks like a call but is not valid
// JSON of one is content.
func (s Syntax) Parse(text string) (content string, calls []ToolCall) {
	start := -1
	for _, m := range s.markers() {
		if i := strings.Index(text, m); i >= 0 && (start < 0 || i < start) {
			start = i
		}
	}
	if start < 0 {
		trimmed := strings.TrimLeftFunc(text, unicode.IsSpace)
		if b := s.bareStart(); b == 0 || trimmed == "" || trimmed[0] != b {
			return text, nil
		}
		start = len(text) - len(trimmed)
	}
	calls, rest, ok := s.parseCalls(text[start:])
	if !ok {
		return text, nil
	}
	content = strings.TrimSpace(text[:start])
	if rest = strings.TrimSpace(rest); rest != "" {
		content = strings.TrimSpace(content + "\n" + rest)
	}
	return content, calls
}

// parseCalls reads calls from the start of text (a marker or a bare call);
// rest is the text after them.
func (s Syntax) parseCalls(text string) (calls []ToolCall, rest string, ok bool) {
	switch s {
	case Mistral:
		text = strings.TrimPrefix(text, "[TOOL_CALLS]")
		var items []json.RawMessage
		n, err := decodeOne(text, &items)
		if err != nil || len(items) == 0 {
			return nil, text, false
		}
		for _, it := range items {
			c, ok := s.callOf(it)
			if !ok {
				return nil, text, false
			}
			calls = append(calls, c)
		}
		return calls, text[n:], true
	case Llama3:
		text = strings.TrimPrefix(text, "<|python_tag|>")
		for {
			var obj json.RawMessage
			n, err := decodeOne(text, &obj)
			if err != nil {
				break
			}
			c, ok := s.callOf(obj)
			if !ok {
				break
			}
			calls = append(calls, c)
			text = strings.TrimLeft(text[n:], " \t\r\n;")
		}
		return calls, text, len(calls) > 0
	}
	for {
		t := strings.TrimLeftFunc(text, unicode.IsSpace)
		if !strings.HasPrefix(t, "<tool_call>") {
			break
		}
		t = t[len("<tool_call>"):]
		var obj json.RawMessage
		n, err := decodeOne(t, &obj)
		if err != nil {
			break
		}
		c, ok := s.callOf(obj)
		if !ok {
			break
		}
		calls = append(calls, c)
		t = strings.TrimLeftFunc(t[n:], unicode.IsSpace)
		text = strings.TrimPrefix(t, "</tool_call>")
	}
	return calls, text, len(calls) > 0
}

// callOf reads one call object: a name and its arguments (an object, or
// a string holding one), under "arguments" or "parameters".
func (s Syntax) callOf(raw json.RawMessage) (ToolCall, bool) {
	var obj struct {
		Name       string          `json:"name"`
		Arguments  json.RawMessage `json:"arguments"`
		Parameters json.RawMessage `json:"parameters"`
	}
	if json.Unmarshal(raw, &obj) != nil || obj.Name == "" {
		return ToolCall{}, false
	}
	args := obj.Arguments
	if len(args) == 0 {
		args = obj.Parameters
	}
	if len(args) == 0 || string(args) == "null" {
		args = json.RawMessage(`{}`)
	}
	var str string
	if json.Unmarshal(args, &str) == nil && json.Valid([]byte(str)) {
		args = json.RawMessage(str)
	}
	var buf bytes.Buffer
	if json.Compact(&buf, args) != nil {
		return ToolCall{}, false
	}
	return ToolCall{Name: obj.Name, Arguments: buf.String()}, true
}

// decodeOne decodes the JSON value at the start of text (after
// whitespace) into v and returns how many bytes it took.
func decodeOne(text string, v any) (int, error) {
	dec := json.NewDecoder(strings.NewReader(text))
	if err := dec.Decode(v); err != nil {
		return 0, err
	}
	return int(dec.InputOffset()), nil
}

// Splitter separates a streamed answer into content, passed on as soon as
// it cannot be the start of a call, and the calls, found when the answer
// ends.
type Splitter struct {
	syn     Syntax
	pending string // held back: could open a call
	tail    string // from the first call on
	inCall  bool
	started bool // content other than whitespace was passed on
	cp      callProgress
}

// NewSplitter returns a splitter for answers in syn's syntax.
func NewSplitter(syn Syntax) *Splitter { return &Splitter{syn: syn} }

// Push takes the next piece of the answer and returns the content that
// may be passed on now.
func (sp *Splitter) Push(text string) string {
	if sp.inCall {
		sp.tail += text
		return ""
	}
	sp.pending += text
	if !sp.started {
		trimmed := strings.TrimLeftFunc(sp.pending, unicode.IsSpace)
		if trimmed == "" {
			return ""
		}
		if b := sp.syn.bareStart(); b != 0 && trimmed[0] == b {
			sp.inCall, sp.tail, sp.pending = true, sp.pending, ""
			return ""
		}
	}
	for _, m := range sp.syn.markers() {
		if i := strings.Index(sp.pending, m); i >= 0 {
			out := sp.pending[:i]
			sp.inCall, sp.tail, sp.pending = true, sp.pending[i:], ""
			return sp.emit(out)
		}
	}
	hold := 0
	for _, m := range sp.syn.markers() {
		for n := min(len(m)-1, len(sp.pending)); n > hold; n-- {
			if strings.HasSuffix(sp.pending, m[:n]) {
				hold = n
				break
			}
		}
	}
	out := sp.pending[:len(sp.pending)-hold]
	sp.pending = sp.pending[len(sp.pending)-hold:]
	if !sp.started && strings.TrimSpace(out) == "" {
		sp.pending = out + sp.pending // leading whitespace waits for what follows
		return ""
	}
	return sp.emit(out)
}

func (sp *Splitter) emit(s string) string {
	if strings.TrimSpace(s) != "" {
		sp.started = true
	}
	return s
}

// Finish ends the answer: content is what was still held back (or a
// would-be call that did not parse), calls the calls found.
func (sp *Splitter) Finish() (content string, calls []ToolCall) {
	if !sp.inCall {
		if !sp.started {
			return strings.TrimSpace(sp.pending), nil
		}
		return sp.pending, nil
	}
	c, calls := sp.syn.Parse(sp.tail)
	if len(calls) == 0 {
		return sp.tail, nil
	}
	return c, calls
}

// ordered is a JSON object whose members keep their order.
type ordered []kv

type kv struct {
	k string
	v any
}

func (o ordered) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, m := range o {
		if i > 0 {
			b.WriteByte(',')
		}
		k, err := json.Marshal(m.k)
		if err != nil {
			return nil, err
		}
		v, err := json.Marshal(m.v)
		if err != nil {
			return nil, err
		}
		b.Write(k)
		b.WriteByte(':')
		b.Write(v)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("chat: %v", err)) // only values built here, which always marshal
	}
	return b
}
