package chat

import (
	"encoding/json"
	"strings"
	"unicode"
)

// Piece is one step of a streamed answer: content, or a piece of call
// Index — its name in the call's first piece, then fragments of its
// arguments (JSON text) as they are generated.
type Piece struct {
	Content string
	Call    bool
	Index   int
	Name    string
	Args    string
}

// callProgress is how far the calls of a streamed answer were sent.
type callProgress struct {
	pos      int  // where the search for the next call begins in tail
	index    int  // the call being read
	named    bool // its name was sent
	sentArgs int  // bytes of its arguments sent
	args     jsonCompactor
	inArray  bool // Mistral: inside the calls' array
	done     bool // what follows is no call
	sent     int  // calls sent whole
	called   bool // a call was sent, whole or in part
}

// Feed takes the next piece of the answer and returns what may be sent
// now: content that cannot be the start of a call, and the calls as they
// are generated (name first, then argument fragments).
func (sp *Splitter) Feed(text string) []Piece {
	var out []Piece
	if c := sp.Push(text); c != "" {
		out = append(out, Piece{Content: c})
	}
	if sp.inCall {
		out = append(out, sp.progress()...)
	}
	return out
}

// Close ends the answer: content still held back, and the calls (or
// their ends) that could only be read once the answer was whole. When no
// call was sent, text that looked like one but is not is content. An
// answer cut off (CloseCut) inside a call keeps what of the call was
// sent; the call's unfinished markup is never content.
func (sp *Splitter) Close() []Piece { return sp.close(false) }

// CloseCut is Close for an answer that was cut off (the token limit, the
// context) rather than ended by the model.
func (sp *Splitter) CloseCut() []Piece { return sp.close(true) }

func (sp *Splitter) close(cut bool) []Piece {
	var out []Piece
	if sp.inCall {
		out = sp.progress()
	}
	rest, calls := sp.Finish()
	streamed := sp.cp.index > 0 || sp.cp.named
	if cut && sp.inCall && sp.syn.opensCall(rest) {
		rest = "" // an unfinished call, not content
	}
	if rest != "" && (len(calls) > 0 || !streamed) {
		out = append(out, Piece{Content: rest})
	}
	for k := sp.cp.sent; k < len(calls); k++ {
		if k == sp.cp.index && sp.cp.named {
			continue // begun but never ended: what was sent stays
		}
		out = append(out, Piece{Call: true, Index: k, Name: calls[k].Name}, Piece{Call: true, Index: k, Args: calls[k].Arguments})
		sp.cp.called = true
	}
	return out
}

// Called reports whether a call was sent (wholly or in part).
func (sp *Splitter) Called() bool { return sp.cp.called }

func (sp *Splitter) progress() []Piece {
	var out []Piece
	cp := &sp.cp
	for !cp.done {
		start, state := sp.nextObject()
		if state == scanMore {
			break
		}
		if state == scanNone {
			cp.done = true
			break
		}
		r := scanCall(sp.tail[start:], sp.syn.argsKey())
		if !r.ok {
			cp.done = true
			break
		}
		if r.nameOK && !cp.named {
			out = append(out, Piece{Call: true, Index: cp.index, Name: r.name})
			cp.named, cp.called = true, true
		}
		if cp.named && r.argsStart >= 0 && !r.argsString {
			if frag := sp.tail[start+r.argsStart+cp.sentArgs : start+r.argsEnd]; frag != "" {
				if c := cp.args.compact(frag); c != "" {
					out = append(out, Piece{Call: true, Index: cp.index, Args: c})
				}
				cp.sentArgs += len(frag)
			}
		}
		if !r.complete {
			break
		}
		if !cp.named {
			cp.done = true // an object with no name is no call
			break
		}
		switch {
		case r.argsStart < 0:
			out = append(out, Piece{Call: true, Index: cp.index, Args: "{}"})
		case r.argsString:
			var s string
			_ = json.Unmarshal([]byte(sp.tail[start+r.argsStart:start+r.argsEnd]), &s)
			out = append(out, Piece{Call: true, Index: cp.index, Args: s})
		}
		cp.pos = start + r.objEnd
		cp.index++
		cp.sent++
		cp.named, cp.sentArgs, cp.args = false, 0, jsonCompactor{}
	}
	return out
}

// jsonCompactor drops the spaces outside strings from JSON text that
// arrives in fragments, as json.Compact does for whole text: streamed
// arguments then add up to what the whole answer carries.
type jsonCompactor struct {
	inString, escaped bool
}

func (c *jsonCompactor) compact(frag string) string {
	var b strings.Builder
	for i := 0; i < len(frag); i++ {
		ch := frag[i]
		switch {
		case c.inString:
			switch {
			case c.escaped:
				c.escaped = false
			case ch == '\\':
				c.escaped = true
			case ch == '"':
				c.inString = false
			}
		case ch == '"':
			c.inString = true
		case ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r':
			continue
		}
		b.WriteByte(ch)
	}
	return b.String()
}

type scanState int

const (
	scanFound scanState = iota
	scanMore            // the text so far may still lead to a call
	scanNone            // no further call
)

// nextObject finds where the next call's object begins in tail, past the
// syntax's markers and separators.
func (sp *Splitter) nextObject() (int, scanState) {
	cp := &sp.cp
	i := cp.pos
	s := sp.tail
	ws := func() {
		for i < len(s) && unicode.IsSpace(rune(s[i])) {
			i++
		}
	}
	// lit skips word at i: found, or the text ends inside it (more).
	lit := func(word string) (bool, bool) {
		rest := s[i:]
		if strings.HasPrefix(rest, word) {
			i += len(word)
			return true, false
		}
		return false, strings.HasPrefix(word, rest)
	}
	ws()
	switch sp.syn {
	case Hermes:
		if cp.index > 0 {
			if _, more := lit("</tool_call>"); more {
				return 0, scanMore
			}
			ws()
		}
		ok, more := lit("<tool_call>")
		switch {
		case more:
			return 0, scanMore
		case !ok:
			return 0, scanNone
		}
	case Llama3:
		if _, more := lit("<|python_tag|>"); more {
			return 0, scanMore
		}
		for i < len(s) && (s[i] == ';' || unicode.IsSpace(rune(s[i]))) {
			i++
		}
	case Mistral:
		if !cp.inArray {
			if _, more := lit("[TOOL_CALLS]"); more {
				return 0, scanMore
			}
			ws()
			if i == len(s) {
				return 0, scanMore
			}
			if s[i] != '[' {
				return 0, scanNone
			}
			i++
			cp.inArray = true
			cp.pos = i
		}
		for i < len(s) && (s[i] == ',' || unicode.IsSpace(rune(s[i]))) {
			i++
		}
	}
	ws()
	switch {
	case i == len(s):
		return 0, scanMore
	case s[i] == '{':
		return i, scanFound
	}
	return 0, scanNone
}

// callScan is what scanCall read of a call object.
type callScan struct {
	ok       bool // no syntax error so far
	complete bool // the object closed, at objEnd
	objEnd   int
	nameOK   bool
	name     string
	// argsStart..argsEnd is the arguments' text read so far (-1: none
	// yet); argsString when they are a JSON string.
	argsStart, argsEnd int
	argsString         bool
}

// scanCall reads the call object at the start of s as far as s goes.
func scanCall(s, argsKey string) callScan {
	r := callScan{ok: true, argsStart: -1}
	i := 0
	ws := func() {
		for i < len(s) && unicode.IsSpace(rune(s[i])) {
			i++
		}
	}
	i++ // '{'
	for {
		ws()
		if i == len(s) {
			return r
		}
		if s[i] == '}' {
			r.complete, r.objEnd = true, i+1
			return r
		}
		if s[i] == ',' {
			i++
			continue
		}
		if s[i] != '"' {
			r.ok = false
			return r
		}
		end, done := scanValue(s, i)
		if !done {
			return r
		}
		var key string
		if json.Unmarshal([]byte(s[i:end]), &key) != nil {
			r.ok = false
			return r
		}
		i = end
		ws()
		if i == len(s) {
			return r
		}
		if s[i] != ':' {
			r.ok = false
			return r
		}
		i++
		ws()
		if i == len(s) {
			return r
		}
		vs := i
		end, done = scanValue(s, i)
		switch key {
		case "name":
			if done {
				r.nameOK = json.Unmarshal([]byte(s[vs:end]), &r.name) == nil && r.name != ""
			}
		case argsKey, "arguments", "parameters":
			r.argsStart, r.argsEnd, r.argsString = vs, end, s[vs] == '"'
			if !done && r.argsString {
				r.argsEnd = vs // a string is sent once whole
			}
		}
		if !done {
			return r
		}
		i = end
	}
}

// scanValue reads the JSON value at s[i:]: its end, and whether it is
// complete (a number or word is complete only once something follows).
func scanValue(s string, i int) (int, bool) {
	switch s[i] {
	case '"':
		for j := i + 1; j < len(s); j++ {
			switch s[j] {
			case '\\':
				j++
			case '"':
				return j + 1, true
			}
		}
		return len(s), false
	case '{', '[':
		depth, inStr := 0, false
		for j := i; j < len(s); j++ {
			c := s[j]
			switch {
			case inStr && c == '\\':
				j++
			case c == '"':
				inStr = !inStr
			case inStr:
			case c == '{' || c == '[':
				depth++
			case c == '}' || c == ']':
				depth--
				if depth == 0 {
					return j + 1, true
				}
			}
		}
		return len(s), false
	}
	j := i
	for j < len(s) && !strings.ContainsRune(",}] \t\r\n", rune(s[j])) {
		j++
	}
	return j, j < len(s)
}
