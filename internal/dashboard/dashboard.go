// Package dashboard is the queen's live web page, /ui/: its files
// (hand-written HTML, JavaScript and CSS, embedded in the binary; no
// library, no build step), the headers they are served with, the stream
// of state changes the page follows (Hub: server-sent events, coalesced,
// deltas), and the per-model rates over the last minutes (Window).
//
// The page is one more admin client of the queen: it reads the state
// through the hub, and everything else (a worker's row, its log, the
// audit log, stop, drain, chat) through the queen's own endpoints, with
// the admin token the user typed, kept in the browser's sessionStorage
// and sent as the bearer. The package knows nothing of the queen: the
// queen builds the Snapshot.
package dashboard

import (
	"embed"
	"io/fs"
	"net/http"
	"path"
	"strings"
)

//go:embed assets
var assets embed.FS

// CSP is the Content-Security-Policy of every UI answer: scripts, styles
// and connections to the page's own origin only, no inline script or
// style, no frames, no forms posted anywhere.
const CSP = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; " +
	"base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// SetHeaders sets the security headers of a UI answer.
func SetHeaders(h http.Header) {
	h.Set("Content-Security-Policy", CSP)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-cache")
}

// types are the content types of the page's files.
var types = map[string]string{
	".html": "text/html; charset=utf-8",
	".js":   "text/javascript; charset=utf-8",
	".css":  "text/css; charset=utf-8",
	".svg":  "image/svg+xml",
}

// File returns the embedded file name ("" is index.html) and its content
// type; ok is false when there is no such file.
func File(name string) (data []byte, contentType string, ok bool) {
	if name == "" {
		name = "index.html"
	}
	if strings.Contains(name, "/") || strings.HasPrefix(name, ".") {
		return nil, "", false
	}
	ct, known := types[path.Ext(name)]
	if !known {
		return nil, "", false
	}
	data, err := fs.ReadFile(assets, "assets/"+name)
	if err != nil {
		return nil, "", false
	}
	return data, ct, true
}
