// Package testhub stands in for the Hugging Face Hub in tests and
// benchmarks: a repository's file list with the sha256 of each file, and
// its files behind a redirect to a second server, with Range, as the Hub
// and its CDN serve them.
package testhub

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// Hub stands in for the Hugging Face Hub: the API serves a
// repository's file list (two entries a page, linked with rel="next"),
// resolve/main/FILE answers 302 to a second server (the CDN) with the
// X-Linked-Etag and X-Linked-Size the Hub sends, and the CDN serves the
// bytes, honouring Range.
type Hub struct {
	API, CDN *httptest.Server
	repo     string            // ORG/REPO
	files    map[string][]byte // by path in the repository

	// Served counts the file bytes the CDN sent; ListCalls the pages of
	// file lists the API answered.
	Served, ListCalls atomic.Int64

	mu     sync.Mutex
	token  string            // guarded by mu; when set, the repository is gated: this token is needed
	sha    map[string]string // guarded by mu; published sha256 by path
	noLFS  map[string]bool   // guarded by mu; paths listed without lfs info
	cuts   map[string][]int  // guarded by mu; by path: connections to cut after this many bytes, in order
	stalls map[string][]int  // guarded by mu; by path: connections that stop sending after this many bytes, in order
	ranges []string          // guarded by mu; Range headers the CDN saw
	done   chan struct{}     // closed when the test ends
}

// New serves repo (ORG/REPO) holding files (by path) until the test ends,
// and points HF_ENDPOINT at it (HF_TOKEN is emptied).
func New(t testing.TB, repo string, files map[string][]byte) *Hub {
	h := &Hub{repo: repo, files: files, sha: map[string]string{}, noLFS: map[string]bool{}, cuts: map[string][]int{},
		stalls: map[string][]int{}}
	for p, b := range files { // the Hub publishes each file's sha256: computed once
		sum := sha256.Sum256(b)
		h.sha[p] = hex.EncodeToString(sum[:])
	}
	h.CDN = httptest.NewServer(http.HandlerFunc(h.serveBlob))
	t.Cleanup(h.CDN.Close)
	h.done = make(chan struct{})
	t.Cleanup(func() { close(h.done) }) // before the CDN closes: stalled answers end

	// The Hub's two routes overlap as ServeMux patterns: split by hand.
	mux := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if rest, ok := strings.CutPrefix(r.URL.Path, "/api/models/"); ok {
			org, rest, _ := strings.Cut(rest, "/")
			repo, _, _ := strings.Cut(rest, "/")
			r.SetPathValue("org", org)
			r.SetPathValue("repo", repo)
			h.serveTree(w, r)
			return
		}
		parts := strings.SplitN(strings.TrimPrefix(r.URL.Path, "/"), "/", 5) // ORG/REPO/resolve/main/PATH
		if len(parts) < 5 || parts[2] != "resolve" || parts[3] != "main" {
			http.NotFound(w, r)
			return
		}
		r.SetPathValue("org", parts[0])
		r.SetPathValue("repo", parts[1])
		r.SetPathValue("path", parts[4])
		h.serveResolve(w, r)
	})
	h.API = httptest.NewServer(mux)
	t.Cleanup(h.API.Close)
	t.Setenv("HF_ENDPOINT", h.API.URL)
	t.Setenv("HF_TOKEN", "")
	return h
}

func (h *Hub) digest(p string) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.sha[p]
}

// refuse answers as the Hub does for a missing or gated repository.
func (h *Hub) refuse(w http.ResponseWriter, r *http.Request) bool {
	if r.PathValue("org")+"/"+r.PathValue("repo") != h.repo {
		w.Header().Set("X-Error-Code", "RepoNotFound")
		http.Error(w, "Repository not found", http.StatusUnauthorized)
		return true
	}
	h.mu.Lock()
	token := h.token
	h.mu.Unlock()
	if token != "" && r.Header.Get("Authorization") != "Bearer "+token {
		w.Header().Set("X-Error-Code", "GatedRepo")
		http.Error(w, "Access to this model is restricted", http.StatusUnauthorized)
		return true
	}
	return false
}

func (h *Hub) serveTree(w http.ResponseWriter, r *http.Request) {
	h.ListCalls.Add(1)
	if h.refuse(w, r) {
		return
	}
	paths := make([]string, 0, len(h.files))
	for p := range h.files {
		paths = append(paths, p)
	}
	slices.Sort(paths)
	page, _ := strconv.Atoi(r.URL.Query().Get("cursor"))
	var out []map[string]any
	for _, p := range paths[min(page*2, len(paths)):min(page*2+2, len(paths))] {
		e := map[string]any{"type": "file", "path": p, "size": len(h.files[p]), "oid": "0123456789abcdef0123456789abcdef01234567"}
		h.mu.Lock()
		if !h.noLFS[p] {
			e["lfs"] = map[string]any{"oid": h.digestLocked(p), "size": len(h.files[p]), "pointerSize": 134}
		}
		h.mu.Unlock()
		out = append(out, e)
	}
	if (page+1)*2 < len(paths) {
		w.Header().Set("Link", fmt.Sprintf(`<%s%s?recursive=true&cursor=%d>; rel="next"`, h.API.URL, r.URL.Path, page+1))
	}
	json.NewEncoder(w).Encode(out)
}

func (h *Hub) digestLocked(p string) string { return h.sha[p] }

func (h *Hub) serveResolve(w http.ResponseWriter, r *http.Request) {
	if h.refuse(w, r) {
		return
	}
	p := r.PathValue("path")
	b, ok := h.files[p]
	if !ok {
		w.Header().Set("X-Error-Code", "EntryNotFound")
		http.Error(w, "Entry not found", http.StatusNotFound)
		return
	}
	w.Header().Set("X-Linked-Etag", `"`+h.digest(p)+`"`)
	w.Header().Set("X-Linked-Size", strconv.Itoa(len(b)))
	w.Header().Set("ETag", `"`+h.digest(p)+`"`)
	w.Header().Set("Location", h.CDN.URL+"/blob/"+p)
	w.WriteHeader(http.StatusFound)
}

func (h *Hub) serveBlob(w http.ResponseWriter, r *http.Request) {
	p := strings.TrimPrefix(r.URL.Path, "/blob/")
	b, ok := h.files[p]
	if !ok {
		http.NotFound(w, r)
		return
	}
	h.mu.Lock()
	h.ranges = append(h.ranges, r.Header.Get("Range"))
	cut, stall := -1, -1
	if c := h.cuts[p]; len(c) > 0 {
		cut, h.cuts[p] = c[0], c[1:]
	}
	if c := h.stalls[p]; len(c) > 0 {
		stall, h.stalls[p] = c[0], c[1:]
	}
	h.mu.Unlock()
	start := 0
	if rg := r.Header.Get("Range"); rg != "" {
		n, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(rg, "bytes="), "-"))
		if err != nil || n > len(b) {
			http.Error(w, "bad range", http.StatusBadRequest)
			return
		}
		if n == len(b) {
			w.Header().Set("Content-Range", fmt.Sprintf("bytes */%d", len(b)))
			w.WriteHeader(http.StatusRequestedRangeNotSatisfiable)
			return
		}
		start = n
		w.Header().Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", n, len(b)-1, len(b)))
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(b)-start))
	if start > 0 {
		w.WriteHeader(http.StatusPartialContent)
	}
	body := b[start:]
	if cut >= 0 && cut < len(body) {
		body = body[:cut] // the handler returns early: the connection is closed mid-body
	}
	if stall >= 0 && stall < len(body) {
		// The head and stall bytes go out, then nothing, on a connection
		// that stays open until the client gives up on it.
		n, _ := w.Write(body[:stall])
		h.Served.Add(int64(n))
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
		case <-h.done:
		}
		return
	}
	n, _ := w.Write(body)
	h.Served.Add(int64(n))
}

// StallAfter makes the next connections for path send n[0], n[1] … bytes
// of the body, then nothing, holding the connection open until the
// client closes it.
func (h *Hub) StallAfter(path string, n ...int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.stalls[path] = n
}

// CutAfter makes the next connections for path end after n[0], n[1] …
// bytes of the body.
func (h *Hub) CutAfter(path string, n ...int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.cuts[path] = n
}

// Gate makes the repository need token ("": open).
func (h *Hub) Gate(token string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.token = token
}

// Publish makes the Hub publish sha256 for path instead of its content's.
func (h *Hub) Publish(path, sha256 string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.sha[path] = sha256
}

// NoLFS lists path without its lfs info: its sha256 is in the X-Linked-Etag
// of resolve/main/PATH only.
func (h *Hub) NoLFS(path string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.noLFS[path] = true
}

// Ranges returns the Range headers of the CDN's requests so far.
func (h *Hub) Ranges() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.ranges)
}
