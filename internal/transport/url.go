// Package transport is what every connection between apiary's processes
// goes through: the check of a URL before anything calls it, the TLS
// settings of servers and clients (system roots plus APIARY_CA_FILE), the
// HTTP client that never follows a redirect, and the checks that refuse
// what a web browser can forge (cross-site requests, DNS rebinding).
package transport

import (
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
)

// CheckBaseURL checks s as the base URL of an apiary daemon or worker that
// something will call: CheckURL, and no path beyond "/". A '?' or '#' in
// a registered endpoint would otherwise turn the path appended to it into
// a query. what names the field in the error.
func CheckBaseURL(what, s string) (*url.URL, error) {
	u, err := CheckURL(what, s)
	if err != nil {
		return nil, err
	}
	if u.Path != "" && u.Path != "/" {
		return nil, fmt.Errorf("%s %q must not have a path", what, printable(s))
	}
	u.Path = ""
	return u, nil
}

// BaseURLs reads list, one base URL or several separated by commas (the
// queens sharing one PostgreSQL database that a hive or the keeper
// follows), each checked as CheckBaseURL does, with spaces around it and a
// trailing "/" dropped. An empty element, a bad URL or one given twice is
// an error naming it and its place. what names the field in the error.
func BaseURLs(what, list string) ([]string, error) {
	parts := strings.Split(list, ",")
	out := make([]string, 0, len(parts))
	for i, p := range parts {
		p = strings.TrimSpace(p)
		where := what
		if len(parts) > 1 {
			where = fmt.Sprintf("%s element %d", what, i+1)
		}
		if p == "" {
			if len(parts) == 1 {
				return nil, fmt.Errorf("%s is empty: give a URL, e.g. http://127.0.0.1:8080", what)
			}
			return nil, fmt.Errorf("%s %q: element %d is empty: give URLs separated by single commas, e.g. http://queen-a:8080,http://queen-b:8080",
				what, printable(list), i+1)
		}
		if _, err := CheckBaseURL(where, p); err != nil {
			return nil, err
		}
		p = strings.TrimSuffix(p, "/")
		for _, o := range out {
			if o == p {
				return nil, fmt.Errorf("%s %q: %s is given twice", what, printable(list), printable(p))
			}
		}
		out = append(out, p)
	}
	return out, nil
}

// CheckURL checks s as a URL that something will call: http or https, a
// host and a port (explicit or the scheme's), no user info, query or
// fragment; a path is allowed. what names the field in the error.
func CheckURL(what, s string) (*url.URL, error) {
	u, err := url.Parse(s)
	switch {
	case err != nil:
		return nil, fmt.Errorf("%s %q is not a URL: %v", what, printable(s), err)
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, fmt.Errorf("%s %q: scheme must be http or https", what, printable(s))
	case u.Opaque != "" || u.Host == "":
		return nil, fmt.Errorf("%s %q has no host", what, printable(s))
	case u.User != nil:
		return nil, fmt.Errorf("%s %q must not carry user info", what, printable(s))
	case u.RawQuery != "" || u.ForceQuery:
		return nil, fmt.Errorf("%s %q must not have a query", what, printable(s))
	case u.Fragment != "" || strings.Contains(s, "#"):
		return nil, fmt.Errorf("%s %q must not have a fragment", what, printable(s))
	}
	host, port := u.Hostname(), u.Port()
	if host == "" || strings.ContainsAny(host, " %") {
		return nil, fmt.Errorf("%s %q has no valid host", what, printable(s))
	}
	if port != "" {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("%s %q: port must be 1-65535", what, printable(s))
		}
	}
	if ip := net.ParseIP(host); ip == nil && !validHostname(host) {
		return nil, fmt.Errorf("%s %q: %q is neither an IP address nor a host name", what, printable(s), printable(host))
	}
	return u, nil
}

// validHostname reports whether s is a DNS name: labels of letters,
// digits and '-' (and '_', which some internal names carry), dot-separated.
func validHostname(s string) bool {
	if len(s) > 253 {
		return false
	}
	for _, label := range strings.Split(strings.TrimSuffix(s, "."), ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, c := range label {
			ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_'
			if !ok {
				return false
			}
		}
	}
	return true
}

// printable quotes nothing and keeps only printable ASCII of s (others as
// '?'), bounded to 200 bytes, for error messages about untrusted input.
func printable(s string) string {
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) {
			return '?'
		}
		return r
	}, s)
}

// IsLoopback reports whether host (a name or an IP, no port) is this
// machine's loopback: "localhost", a name under .localhost, 127.0.0.0/8 or
// ::1.
func IsLoopback(host string) bool {
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsLoopback()
}
