package api

import (
	"fmt"
	"strconv"
	"strings"
)

// PrefixReport is what a worker's generation answer says of its cache
// (the PrefixTrailer trailer): the slot that served the request now
// holds its prompt, of which Cached tokens were found there already, and
// the prompt took PromptMS to decode (its first token's time).
type PrefixReport struct {
	Slot, Slots    int
	Prompt, Cached int
	PromptMS       float64
}

// String is the trailer's value: "slot=1 slots=2 prompt=1034 cached=1010 prompt_ms=12.5".
func (p PrefixReport) String() string {
	return fmt.Sprintf("slot=%d slots=%d prompt=%d cached=%d prompt_ms=%s", p.Slot, p.Slots, p.Prompt, p.Cached,
		strconv.FormatFloat(p.PromptMS, 'f', -1, 64))
}

// ParsePrefixReport reads a PrefixTrailer value; ok is false for one
// that is missing or malformed (a worker of another kind).
func ParsePrefixReport(v string) (p PrefixReport, ok bool) {
	if v == "" || len(v) > 200 {
		return p, false
	}
	seen := 0
	for _, f := range strings.Fields(v) {
		k, val, found := strings.Cut(f, "=")
		if !found {
			return p, false
		}
		var err error
		switch k {
		case "slot":
			p.Slot, err = strconv.Atoi(val)
		case "slots":
			p.Slots, err = strconv.Atoi(val)
		case "prompt":
			p.Prompt, err = strconv.Atoi(val)
		case "cached":
			p.Cached, err = strconv.Atoi(val)
		case "prompt_ms":
			p.PromptMS, err = strconv.ParseFloat(val, 64)
		default:
			continue // a later worker's field
		}
		if err != nil {
			return p, false
		}
		seen++
	}
	ok = seen == 5 && p.Slots > 0 && p.Slot >= 0 && p.Slot < p.Slots && p.Prompt >= 0 && p.Cached >= 0 && p.Cached <= p.Prompt && p.PromptMS >= 0
	return p, ok
}
