package routing

import (
	"net/http"
	"regexp"
	"strings"

	"github.com/apiary-llm/apiary/internal/openai"
)

// Answers to API clients say why in words (openai.PublicText): errors
// carry their public words from where they are made, and the details
// (files, addresses, lifecycle ids) go to the queen's log and the audit.
// internalText is the backstop for an error that was not given them: it
// finds what an answer must not hold.

var (
	// an address: an IPv4 literal, IPv6 loopback, localhost with a port,
	// or a network URL (not a model source such as hf://ORG/REPO, which
	// names what the config asks for).
	addressRE = regexp.MustCompile(`\b(?:\d{1,3}\.){3}\d{1,3}\b|\[::1?\]|\blocalhost:\d+|(?i)\b(?:https?|wss?|tcp|udp|unix|postgres(?:ql)?|ssh)://`)
	// a lifecycle id (wk- and 16 hex digits).
	lifecycleRE = regexp.MustCompile(`\bwk-[0-9a-f]{8,}\b`)
	// an absolute path of two segments or more.
	pathRE = regexp.MustCompile(`(?:^|[\s"'(=,:\[])(/[^\s"'/),;\]]+(?:/[^\s"'/),;\]]*)+)`)
)

// apiPrefixes are the paths an answer may name: the APIs' own.
var apiPrefixes = []string{"/v1/", "/v2/", "/api/", "/ui/", "/health", "/metrics"}

// internalText returns what msg holds that an answer to r must not: an
// address, a lifecycle id or a file path that r did not send (its path,
// query and headers); "" when none.
func internalText(msg string, r *http.Request) string {
	sent := func(s string) bool {
		if strings.Contains(r.URL.RequestURI(), s) {
			return true
		}
		for _, vs := range r.Header {
			for _, v := range vs {
				if strings.Contains(v, s) {
					return true
				}
			}
		}
		return false
	}
	if m := addressRE.FindString(msg); m != "" {
		return m
	}
	for _, m := range lifecycleRE.FindAllString(msg, -1) {
		if !sent(m) {
			return m
		}
	}
	for _, sub := range pathRE.FindAllStringSubmatch(msg, -1) {
		p := sub[1]
		api := false
		for _, pre := range apiPrefixes {
			api = api || strings.HasPrefix(p, pre) || p == strings.TrimSuffix(pre, "/")
		}
		if !api && !sent(p) {
			return p
		}
	}
	return ""
}

// guarded is e, or a copy of it that says only what failed when its
// message holds internal text (logged, so that the error that lacked its
// public words can be found).
func (s *Service) guarded(e *openai.Error, r *http.Request) *openai.Error {
	found := internalText(e.Message, r)
	if found == "" {
		return e
	}
	s.log.Warn("an answer to an API client held internal text; sent without it", "path", r.URL.Path, "found", found, "message", e.Message)
	c := *e
	c.Message = http.StatusText(c.HTTPStatus())
	if c.Code != "" {
		c.Message += " (" + c.Code + "); the queen's log has the details"
	}
	return &c
}
