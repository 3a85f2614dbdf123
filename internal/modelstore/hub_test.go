package modelstore_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/modelstore"
	"github.com/apiary-llm/apiary/internal/testmodel"
)

// fakeHub stands in for the Hugging Face Hub: the API serves a
// repository's file list (two entries a page, linked with rel="next"),
// resolve/main/FILE answers 302 to a second server (the CDN) with the
// X-Linked-Etag and X-Linked-Size the Hub sends, and the CDN serves the
// bytes, honouring Range.
type fakeHub struct {
	api, cdn *httptest.Server
	repo     string            // ORG/REPO
	files    map[string][]byte // by path in the repository
	token    string            // when set, the repository is gated: this token is needed

	mu        sync.Mutex
	sha       map[string]string // published sha256 by path, when not the content's
	noLFS     map[string]bool   // paths listed without lfs info
	cuts      map[string][]int  // by path: connections to cut after this many bytes, in order
	ranges    []string          // Range headers the CDN saw
	served    atomic.Int64      // file bytes the CDN sent
	listCalls atomic.Int64
}

func newFakeHub(t *testing.T, repo string, files map[string][]byte) *fakeHub {
	h := &fakeHub{repo: repo, files: files, sha: map[string]string{}, noLFS: map[string]bool{}, cuts: map[string][]int{}}
	h.cdn = httptest.NewServer(http.HandlerFunc(h.serveBlob))
	t.Cleanup(h.cdn.Close)
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
	h.api = httptest.NewServer(mux)
	t.Cleanup(h.api.Close)
	t.Setenv("HF_ENDPOINT", h.api.URL)
	t.Setenv("HF_TOKEN", "")
	return h
}

func (h *fakeHub) digest(p string) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	if s, ok := h.sha[p]; ok {
		return s
	}
	sum := sha256.Sum256(h.files[p])
	return hex.EncodeToString(sum[:])
}

// refuse answers as the Hub does for a missing or gated repository.
func (h *fakeHub) refuse(w http.ResponseWriter, r *http.Request) bool {
	if r.PathValue("org")+"/"+r.PathValue("repo") != h.repo {
		w.Header().Set("X-Error-Code", "RepoNotFound")
		http.Error(w, "Repository not found", http.StatusUnauthorized)
		return true
	}
	if h.token != "" && r.Header.Get("Authorization") != "Bearer "+h.token {
		w.Header().Set("X-Error-Code", "GatedRepo")
		http.Error(w, "Access to this model is restricted", http.StatusUnauthorized)
		return true
	}
	return false
}

func (h *fakeHub) serveTree(w http.ResponseWriter, r *http.Request) {
	h.listCalls.Add(1)
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
		w.Header().Set("Link", fmt.Sprintf(`<%s%s?recursive=true&cursor=%d>; rel="next"`, h.api.URL, r.URL.Path, page+1))
	}
	json.NewEncoder(w).Encode(out)
}

func (h *fakeHub) digestLocked(p string) string {
	if s, ok := h.sha[p]; ok {
		return s
	}
	sum := sha256.Sum256(h.files[p])
	return hex.EncodeToString(sum[:])
}

func (h *fakeHub) serveResolve(w http.ResponseWriter, r *http.Request) {
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
	w.Header().Set("Location", h.cdn.URL+"/blob/"+p)
	w.WriteHeader(http.StatusFound)
}

func (h *fakeHub) serveBlob(w http.ResponseWriter, r *http.Request) {
	p := strings.TrimPrefix(r.URL.Path, "/blob/")
	b, ok := h.files[p]
	if !ok {
		http.NotFound(w, r)
		return
	}
	h.mu.Lock()
	h.ranges = append(h.ranges, r.Header.Get("Range"))
	cut := -1
	if c := h.cuts[p]; len(c) > 0 {
		cut, h.cuts[p] = c[0], c[1:]
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
	n, _ := w.Write(body)
	h.served.Add(int64(n))
}

func (h *fakeHub) cutAfter(path string, n ...int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.cuts[path] = n
}

// fastRetries makes a broken download retry at once.
var fastRetries = modelstore.PullOptions{RetryDelay: time.Millisecond}

func model(t *testing.T, seed int64) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := testmodel.Write(&buf, testmodel.Options{Seed: seed}); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestPullHubByQuant(t *testing.T) {
	q4, q8 := model(t, 1), model(t, 2)
	h := newFakeHub(t, "org/tiny-GGUF", map[string][]byte{
		"tiny-Q4_K_M.gguf": q4, "tiny-Q8_0.gguf": q8, "README.md": []byte("# tiny"), "mmproj-tiny-f16.gguf": model(t, 3),
	})
	dir := t.TempDir()
	var last modelstore.Progress
	opts := fastRetries
	opts.Progress = func(p modelstore.Progress) { last = p }
	m, err := modelstore.Pull(t.Context(), dir, "hf://org/tiny-GGUF:q4_k_m", opts)
	if err != nil {
		t.Fatalf("Pull: %v", err)
	}
	if m.Ref != "tiny-Q4_K_M" || m.Size != int64(len(q4)) || m.Info == nil || m.Info.Architecture != "llama" {
		t.Errorf("Pull returned %+v", m)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "tiny-Q4_K_M.gguf")); !bytes.Equal(got, q4) {
		t.Error("the pulled file differs from the Hub's")
	}
	if want := (modelstore.Progress{File: last.File, Written: int64(len(q4)), Total: int64(len(q4))}); last != want {
		t.Errorf("last progress %+v, want %+v", last, want)
	}
	if n := h.listCalls.Load(); n != 2 {
		t.Errorf("the file list was read in %d pages, want 2 (two entries a page)", n)
	}
	// As Ollama users write it, with another name.
	opts.Ref = "tiny8"
	if m, err = modelstore.Pull(t.Context(), dir, "hf.co/org/tiny-GGUF:Q8_0", opts); err != nil || m.Ref != "tiny8" {
		t.Fatalf("Pull hf.co/…:Q8_0 = %+v, %v", m, err)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "tiny8.gguf")); !bytes.Equal(got, q8) {
		t.Error("the pulled Q8_0 file differs from the Hub's")
	}
	if diff := cmp.Diff([]string{"tiny-Q4_K_M.gguf", "tiny8.gguf"}, dirEntries(t, dir)); diff != "" {
		t.Errorf("directory entries (-want +got):\n%s", diff)
	}
}

func TestPullHubByFile(t *testing.T) {
	q8 := model(t, 2)
	h := newFakeHub(t, "org/tiny-GGUF", map[string][]byte{"sub/tiny-Q8_0.gguf": q8, "tiny-Q4_K_M.gguf": model(t, 1)})
	h.noLFS["sub/tiny-Q8_0.gguf"] = true // its sha256 comes from a HEAD's X-Linked-Etag
	src, err := modelstore.ResolveSource(t.Context(), nil, modelstore.HubFromEnv(), "hf://org/tiny-GGUF/sub/tiny-Q8_0.gguf")
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(q8)
	want := modelstore.Source{Ref: "hf://org/tiny-GGUF/sub/tiny-Q8_0.gguf", Name: "tiny-Q8_0", Files: []modelstore.RemoteFile{{
		URL: h.api.URL + "/org/tiny-GGUF/resolve/main/sub/tiny-Q8_0.gguf", Path: "sub/tiny-Q8_0.gguf", Size: int64(len(q8)), SHA256: hex.EncodeToString(sum[:]),
	}}}
	if diff := cmp.Diff(want, src); diff != "" {
		t.Errorf("ResolveSource (-want +got):\n%s", diff)
	}
	dir := t.TempDir()
	m, err := modelstore.Pull(t.Context(), dir, src.Ref, fastRetries)
	if err != nil || m.Ref != "tiny-Q8_0" {
		t.Fatalf("Pull = %+v, %v", m, err)
	}
	if got, _ := os.ReadFile(m.Path); !bytes.Equal(got, q8) {
		t.Error("the pulled file differs from the Hub's")
	}
	// The wrong digest in the HEAD's answer is refused too.
	h.sha["sub/tiny-Q8_0.gguf"] = strings.Repeat("ab", 32)
	_, err = modelstore.Pull(t.Context(), t.TempDir(), src.Ref, fastRetries)
	if !errors.Is(err, modelstore.ErrChecksum) {
		t.Errorf("Pull with a wrong X-Linked-Etag = %v, want ErrChecksum", err)
	}
}

func TestPullHubSplitModel(t *testing.T) {
	parts := [][]byte{model(t, 1), model(t, 2), model(t, 3)}
	files := map[string][]byte{"tiny-Q4_K_M.gguf": model(t, 4)}
	for i, p := range parts {
		files[fmt.Sprintf("Q8_0/tiny-Q8_0-%05d-of-00003.gguf", i+1)] = p
	}
	newFakeHub(t, "org/tiny-GGUF", files)
	dir := t.TempDir()
	m, err := modelstore.Pull(t.Context(), dir, "hf://org/tiny-GGUF:Q8_0", fastRetries)
	if err != nil {
		t.Fatalf("Pull: %v", err)
	}
	size := int64(len(parts[0]) + len(parts[1]) + len(parts[2]))
	if m.Ref != "tiny-Q8_0-00001-of-00003" || m.Size != size {
		t.Errorf("Pull returned %+v, want ref tiny-Q8_0-00001-of-00003 of %d bytes", m, size)
	}
	for i, p := range parts {
		if got, _ := os.ReadFile(filepath.Join(dir, fmt.Sprintf("tiny-Q8_0-%05d-of-00003.gguf", i+1))); !bytes.Equal(got, p) {
			t.Errorf("part %d differs from the Hub's", i+1)
		}
	}
	// Listed once, with the size of all parts; without a part, with why.
	list, err := modelstore.List(dir)
	if err != nil || len(list) != 1 || list[0].Ref != m.Ref || list[0].Size != size || list[0].Error != "" {
		t.Fatalf("List = %+v, %v; want the one split model of %d bytes", list, err, size)
	}
	os.Remove(filepath.Join(dir, "tiny-Q8_0-00002-of-00003.gguf"))
	list, _ = modelstore.List(dir)
	if len(list) != 1 || list[0].Info != nil || !strings.Contains(list[0].Error, "part 2 of 3 (tiny-Q8_0-00002-of-00003.gguf) is missing") {
		t.Errorf("List without part 2 = %+v", list)
	}
	// A file of a split model names all of it.
	src, err := modelstore.ResolveSource(t.Context(), nil, modelstore.HubFromEnv(), "hf://org/tiny-GGUF/Q8_0/tiny-Q8_0-00002-of-00003.gguf")
	if err != nil || len(src.Files) != 3 || !src.Split {
		t.Errorf("ResolveSource of part 2 = %+v, %v; want the three parts", src, err)
	}
}

func TestPullHubResumesABrokenConnection(t *testing.T) {
	tiny := model(t, 1)
	h := newFakeHub(t, "org/tiny-GGUF", map[string][]byte{"tiny-Q4_K_M.gguf": tiny})
	h.cutAfter("tiny-Q4_K_M.gguf", 1000, 2000)
	dir := t.TempDir()
	m, err := modelstore.Pull(t.Context(), dir, "hf://org/tiny-GGUF:Q4_K_M", fastRetries)
	if err != nil {
		t.Fatalf("Pull: %v", err)
	}
	if got, _ := os.ReadFile(m.Path); !bytes.Equal(got, tiny) {
		t.Error("the resumed file differs from the Hub's")
	}
	if diff := cmp.Diff([]string{"", "bytes=1000-", "bytes=3000-"}, h.ranges); diff != "" {
		t.Errorf("Range headers (-want +got):\n%s", diff)
	}
	if n := h.served.Load(); n != int64(len(tiny)) {
		t.Errorf("the CDN served %d bytes, want %d: the download was restarted, not resumed", n, len(tiny))
	}
}

func TestPullHubResumesAcrossRuns(t *testing.T) {
	tiny := model(t, 1)
	h := newFakeHub(t, "org/tiny-GGUF", map[string][]byte{"tiny-Q4_K_M.gguf": tiny})
	h.cutAfter("tiny-Q4_K_M.gguf", 1500, 0)
	dir := t.TempDir()
	opts := fastRetries
	opts.Retries = 1
	_, err := modelstore.Pull(t.Context(), dir, "hf://org/tiny-GGUF:Q4_K_M", opts)
	if !errors.Is(err, modelstore.ErrDownload) {
		t.Fatalf("Pull with the connection cut twice = %v, want ErrDownload", err)
	}
	if diff := cmp.Diff([]string{"tiny-Q4_K_M.gguf.partial"}, dirEntries(t, dir)); diff != "" {
		t.Fatalf("after the failed pull (-want +got):\n%s", diff)
	}
	if list, _ := modelstore.List(dir); len(list) != 0 {
		t.Errorf("List offers %+v, a partial download", list)
	}
	h.served.Store(0)
	var last modelstore.Progress
	opts.Progress = func(p modelstore.Progress) { last = p }
	m, err := modelstore.Pull(t.Context(), dir, "hf://org/tiny-GGUF:Q4_K_M", opts)
	if err != nil {
		t.Fatalf("second Pull: %v", err)
	}
	if got, _ := os.ReadFile(m.Path); !bytes.Equal(got, tiny) {
		t.Error("the resumed file differs from the Hub's")
	}
	if n := h.served.Load(); n != int64(len(tiny))-1500 {
		t.Errorf("the second pull was served %d bytes, want %d (the rest)", n, len(tiny)-1500)
	}
	if last.Resumed != 1500 || last.Written != int64(len(tiny)) {
		t.Errorf("last progress %+v, want 1500 resumed", last)
	}
	if diff := cmp.Diff([]string{"tiny-Q4_K_M.gguf"}, dirEntries(t, dir)); diff != "" {
		t.Errorf("directory entries (-want +got):\n%s", diff)
	}
}

func TestPullHubRefusals(t *testing.T) {
	tiny := model(t, 1)
	files := map[string][]byte{"tiny-Q4_K_M.gguf": tiny, "tiny-Q8_0.gguf": model(t, 2), "other-Q8_0.gguf": model(t, 3)}
	tests := []struct {
		name  string
		ref   string
		setup func(h *fakeHub, opts *modelstore.PullOptions)
		err   error
		msg   string
	}{
		{"checksum", "hf://org/tiny-GGUF:Q4_K_M", func(h *fakeHub, _ *modelstore.PullOptions) { h.sha["tiny-Q4_K_M.gguf"] = strings.Repeat("0", 64) },
			modelstore.ErrChecksum, "has sha256 " + hex.EncodeToString(sha256sum(tiny)) + ", the Hub publishes " + strings.Repeat("0", 64) + "; the download was deleted"},
		{"unknown repository", "hf://org/nothing:Q4_K_M", nil, modelstore.ErrNoModel, "no repository org/nothing at http://"},
		{"unknown quant", "hf://org/tiny-GGUF:Q5_K_S", nil, modelstore.ErrNoModel,
			"org/tiny-GGUF has no GGUF file of quantization Q5_K_S; available: Q8_0 (other-Q8_0.gguf), Q4_K_M (tiny-Q4_K_M.gguf), Q8_0 (tiny-Q8_0.gguf)"},
		{"several match", "hf://org/tiny-GGUF:q8_0", nil, modelstore.ErrNoModel,
			"quantization q8_0 of org/tiny-GGUF matches several files (other-Q8_0.gguf, tiny-Q8_0.gguf); name one as hf://org/tiny-GGUF/FILE.gguf"},
		{"no quant", "hf://org/tiny-GGUF", nil, modelstore.ErrNoModel, "has several GGUF models; name one as hf://org/tiny-GGUF:QUANT"},
		{"unknown file", "hf://org/tiny-GGUF/tiny-Q2_K.gguf", nil, modelstore.ErrNoModel, "org/tiny-GGUF has no file tiny-Q2_K.gguf; available: "},
		{"gated", "hf://org/tiny-GGUF:Q4_K_M", func(h *fakeHub, _ *modelstore.PullOptions) { h.token = "secret" },
			modelstore.ErrGated, "401 Unauthorized for org/tiny-GGUF: the repository is gated or private; accept its terms on the Hub and set HF_TOKEN"},
		{"token refused", "hf://org/tiny-GGUF:Q4_K_M", func(h *fakeHub, o *modelstore.PullOptions) {
			h.token = "secret"
			o.Hub = modelstore.Hub{Endpoint: h.api.URL, Token: "wrong"}
		}, modelstore.ErrGated, "HF_TOKEN was refused"},
		{"bad ref", "hf://org", nil, modelstore.ErrBadURL, "no repository"},
		{"disk full", "hf://org/tiny-GGUF:Q4_K_M", func(_ *fakeHub, o *modelstore.PullOptions) {
			o.FreeSpace = func(string) (uint64, error) { return 1000, nil }
		}, modelstore.ErrNoSpace, "the download needs " + api.FormatBytes(uint64(len(tiny))) + ", "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newFakeHub(t, "org/tiny-GGUF", files)
			opts := fastRetries
			if tt.setup != nil {
				tt.setup(h, &opts)
			}
			dir := t.TempDir()
			_, err := modelstore.Pull(t.Context(), dir, tt.ref, opts)
			if !errors.Is(err, tt.err) || !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("Pull = %v, want %v saying %q", err, tt.err, tt.msg)
			}
			if entries := dirEntries(t, dir); len(entries) != 0 {
				t.Errorf("the models dir holds %v after a refused pull, want nothing", entries)
			}
			if tt.err == modelstore.ErrNoSpace && h.served.Load() != 0 {
				t.Errorf("%d bytes were downloaded before the refusal", h.served.Load())
			}
		})
	}
}

func TestPullHubGatedWithToken(t *testing.T) {
	tiny := model(t, 1)
	h := newFakeHub(t, "org/tiny-GGUF", map[string][]byte{"tiny-Q4_K_M.gguf": tiny})
	h.token = "secret"
	t.Setenv("HF_TOKEN", "secret")
	if _, err := modelstore.Pull(t.Context(), t.TempDir(), "hf://org/tiny-GGUF:Q4_K_M", fastRetries); err != nil {
		t.Errorf("Pull with HF_TOKEN: %v", err)
	}
}

func sha256sum(b []byte) []byte {
	s := sha256.Sum256(b)
	return s[:]
}
