// Package secret names the secrets apiary knows and keeps them out of what
// others can read: the environment of child processes (ChildEnv, an
// allow-list, for the processes that serve; Scrub for the ones that act
// for the operator) and the text of flags' help, logs and errors
// (RedactURL, RedactError).
package secret

import (
	"fmt"
	"net/url"
	"os"
	"slices"
	"strings"
)

// The environment variables that hold a secret. DatabaseURLEnv holds a
// PostgreSQL URL that may carry a password; PGPasswordEnv is libpq's and
// pgx's own.
const (
	APITokenEnv     = "APIARY_API_TOKEN"
	AdminTokenEnv   = "APIARY_ADMIN_TOKEN"
	ClusterTokenEnv = "APIARY_CLUSTER_TOKEN"
	WorkerTokenEnv  = "APIARY_WORKER_TOKEN"
	DatabaseURLEnv  = "APIARY_DATABASE_URL"
	PGPasswordEnv   = "PGPASSWORD"
	// HFTokenEnv is the Hugging Face token a hive pulls gated or private
	// models with. No worker gets it; a hive the queen starts gets the
	// queen's on its lifeline.
	HFTokenEnv = "HF_TOKEN"
	// EngineKeyEnv is the key an external engine's front sends the
	// engine as its bearer (the engine's {api_key}); the hive hands it
	// to the front, which keeps it out of the engine's environment.
	EngineKeyEnv = "APIARY_ENGINE_KEY"
)

// EnvNames lists every environment variable that holds a secret; Scrub
// removes them all, and ChildEnv never passes one. A new secret variable
// is added here, and only here.
func EnvNames() []string {
	return []string{APITokenEnv, AdminTokenEnv, ClusterTokenEnv, WorkerTokenEnv, DatabaseURLEnv, PGPasswordEnv, HFTokenEnv, EngineKeyEnv}
}

// Scrub returns env ("KEY=value" entries, as os.Environ gives them)
// without any variable EnvNames lists. It is for the processes that act
// for the operator with the operator's environment: the ssh client (its
// agent's SSH_AUTH_SOCK, whatever a ProxyCommand reads) and the queen
// that apiary infer starts (which runs ssh for --node). The processes
// that serve get ChildEnv's allow-list instead. A child that needs one
// secret gets exactly that one added back by its parent.
func Scrub(env []string) []string {
	names := EnvNames()
	out := make([]string, 0, len(env))
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if slices.Contains(names, k) {
			continue
		}
		out = append(out, kv)
	}
	return out
}

// mask replaces a secret in what is shown.
const mask = "xxxxx"

// RedactURL returns u fit to show: the password of its user info and the
// values of password query parameters (password, sslpassword) masked. A
// string that does not parse as a URL keeps its scheme and host as far as
// they can be told apart, and loses everything between "://" and the last
// "@".
func RedactURL(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return redactUnparsed(u)
	}
	if _, ok := p.User.Password(); ok {
		p.User = url.UserPassword(p.User.Username(), mask)
	}
	if p.RawQuery != "" {
		q, qerr := url.ParseQuery(p.RawQuery)
		changed := qerr != nil
		for k := range q {
			if isPasswordKey(k) {
				q[k] = []string{mask}
				changed = true
			}
		}
		if qerr != nil {
			p.RawQuery = "" // a query that does not parse may hide a password
		} else if changed {
			p.RawQuery = q.Encode()
		}
	}
	return p.String()
}

// redactUnparsed masks the user info of a URL that url.Parse refuses.
func redactUnparsed(u string) string {
	scheme, rest, ok := strings.Cut(u, "://")
	if !ok {
		return mask
	}
	if at := strings.LastIndex(rest, "@"); at >= 0 {
		rest = mask + rest[at:]
	}
	if q := strings.IndexAny(rest, "?#"); q >= 0 {
		rest = rest[:q]
	}
	return scheme + "://" + rest
}

func isPasswordKey(k string) bool {
	k = strings.ToLower(k)
	return k == "password" || k == "sslpassword"
}

// RedactError returns err with every secret of the URL u (the URL itself,
// its password in any spelling) masked in its message; errors.Is and
// errors.As still see err. It returns nil for nil.
func RedactError(err error, u string) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	red := redactIn(msg, u)
	if red == msg {
		return err
	}
	return &redactedError{msg: red, err: err}
}

type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }

// redactIn masks u and its passwords wherever they occur in s.
func redactIn(s, u string) string {
	if u == "" {
		return s
	}
	s = strings.ReplaceAll(s, u, RedactURL(u))
	for _, pw := range passwords(u) {
		s = strings.ReplaceAll(s, pw, mask)
	}
	return s
}

// passwords are the passwords in u, each as written and decoded, longest
// first (so that no part of a longer one is left behind).
func passwords(u string) []string {
	var raw []string
	if p, err := url.Parse(u); err == nil {
		if pw, ok := p.User.Password(); ok {
			raw = append(raw, pw)
		}
		if q, err := url.ParseQuery(p.RawQuery); err == nil {
			for k, vs := range q {
				if isPasswordKey(k) {
					raw = append(raw, vs...)
				}
			}
		}
	}
	// As written, for a URL that does not parse too: after the user
	// name's ":" up to an "@", the first or the last (a password may hold
	// an unescaped "@").
	if _, rest, ok := strings.Cut(u, "://"); ok {
		if user, after, ok := strings.Cut(rest, ":"); ok && !strings.ContainsAny(user, "/?#@") {
			if i := strings.Index(after, "@"); i >= 0 {
				raw = append(raw, after[:i], after[:strings.LastIndex(after, "@")])
			}
		}
	}
	var out []string
	for _, pw := range raw {
		if pw == "" {
			continue
		}
		out = append(out, pw, url.QueryEscape(pw), url.PathEscape(pw), url.UserPassword("", pw).String()[1:])
		// What another redactor (pgx's) left of a password it cut at a
		// delimiter; pieces too short to tell from other words stay.
		for _, piece := range strings.FieldsFunc(pw, func(r rune) bool { return strings.ContainsRune("@/?#:", r) }) {
			if len(piece) >= 4 {
				out = append(out, piece)
			}
		}
	}
	slices.SortFunc(out, func(a, b string) int { return len(b) - len(a) })
	return slices.Compact(out)
}

// MinTokenLen is the shortest token the queen accepts for a role: 16
// bytes resist guessing over the network.
const MinTokenLen = 16

// CheckToken says what makes tok a token no request can carry, or nil.
// A token travels as "Authorization: Bearer <token>", so it must be
// printable ASCII without white space, the bytes '!' to '~': a blank
// one matches nothing a client sends (the spaces around a bearer are
// not part of it), and a newline, another control byte or a non-ASCII
// byte cannot be sent in a header at all. The error says what is wrong
// and where, never the token; the caller names the token (its variable,
// flag or file). It does not check the length: see MinTokenLen.
func CheckToken(tok string) error {
	if strings.TrimSpace(tok) == "" && tok != "" {
		return fmt.Errorf("is blank (only white space)%s", tokenForm)
	}
	for i := 0; i < len(tok); i++ {
		if c := tok[i]; c < '!' || c > '~' {
			return fmt.Errorf("has %s at byte %d%s", byteName(c), i+1, tokenForm)
		}
	}
	return nil
}

// tokenForm ends CheckToken's errors: what a token must be.
const tokenForm = "; a token must be printable ASCII without spaces, as it is sent in an HTTP header (e.g. openssl rand -hex 32)"

// byteName names a byte a token must not hold.
func byteName(c byte) string {
	switch {
	case c == ' ':
		return "a space"
	case c == '\t':
		return "a tab"
	case c == '\n':
		return "a newline"
	case c == '\r':
		return "a carriage return"
	case c >= 0x80:
		return "a non-ASCII byte"
	}
	return fmt.Sprintf("the control byte 0x%02x", c)
}

// Tokens are the three bearer tokens of a cluster, one per kind of
// caller: the daemons check them, the keeper sends them. An empty token
// leaves its endpoints open, which the daemons allow on loopback only.
type Tokens struct {
	API     string // APIARY_API_TOKEN: inference (/v1/…)
	Admin   string // APIARY_ADMIN_TOKEN: /api/admin/…, pool drain and removal
	Cluster string // APIARY_CLUSTER_TOKEN: hives (/v2/pools/…, /v2/internal/…)
}

// TokensFromEnv reads the three tokens from the environment.
func TokensFromEnv() Tokens {
	return Tokens{API: os.Getenv(APITokenEnv), Admin: os.Getenv(AdminTokenEnv), Cluster: os.Getenv(ClusterTokenEnv)}
}

// None reports whether no token is set: every endpoint admits anyone who
// reaches it.
func (t Tokens) None() bool { return t.API == "" && t.Admin == "" && t.Cluster == "" }
