package modelstore

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Sentinel errors of ResolveSource.
var (
	// ErrNoModel means the Hub has no such repository, or the repository
	// no GGUF file that the ref names (none, or several).
	ErrNoModel = errors.New("no such model")
	// ErrGated means the Hub refused access: the repository is gated or
	// private and needs HF_TOKEN (or the token was refused).
	ErrGated = errors.New("repository is gated or private")
)

// DefaultHubEndpoint is the Hugging Face Hub, unless HF_ENDPOINT says
// otherwise.
const DefaultHubEndpoint = "https://huggingface.co"

// Hub is the Hugging Face Hub that hf:// refs are looked up at.
type Hub struct {
	// Endpoint is the Hub's base URL; default $HF_ENDPOINT, else
	// DefaultHubEndpoint.
	Endpoint string
	// Token is sent as "Authorization: Bearer" to the Hub, for gated and
	// private repositories; default $HF_TOKEN.
	Token string
}

// HubFromEnv returns the Hub that HF_ENDPOINT and HF_TOKEN name.
func HubFromEnv() Hub {
	return Hub{Endpoint: os.Getenv("HF_ENDPOINT"), Token: os.Getenv("HF_TOKEN")}
}

func (h Hub) endpoint() string {
	if h.Endpoint == "" {
		return DefaultHubEndpoint
	}
	return strings.TrimSuffix(h.Endpoint, "/")
}

// Source is what one pull fetches: a model of one file, or the parts of a
// split GGUF (NAME-00001-of-00003.gguf …), all of which are fetched.
type Source struct {
	// Ref is the ref pulled, as given.
	Ref string `json:"ref"`
	// Name is the model's default ref: the file name without ".gguf";
	// for a split model without the part suffix.
	Name string `json:"name"`
	// Files are the files to fetch, a split model's in part order.
	Files []RemoteFile `json:"files"`
	// Split is true for a split model: its files are saved as
	// NAME-0000i-of-0000N.gguf, and its ref is the first part's name.
	Split bool `json:"split,omitempty"`
	// Projector is the repository's vision projector (mmproj*.gguf), saved
	// beside the model as mmproj-REF.gguf; nil when it offers none.
	Projector *RemoteFile `json:"projector,omitempty"`
}

// RemoteFile is one file of a Source.
type RemoteFile struct {
	URL    string `json:"url"`
	Path   string `json:"path,omitempty"` // in the repository
	Size   int64  `json:"size_bytes"`     // -1: unknown until the download starts
	SHA256 string `json:"sha256,omitempty"`
}

// Size returns the total size of the files, -1 when one is unknown.
func (s Source) Size() int64 {
	var n int64
	for _, f := range s.all() {
		if f.Size < 0 {
			return -1
		}
		n += f.Size
	}
	return n
}

// all is the files a pull of s fetches: the model's, then its projector.
func (s Source) all() []RemoteFile {
	if s.Projector == nil {
		return s.Files
	}
	return append(slices.Clone(s.Files), *s.Projector)
}

// fileNames returns the names the files of s take in the models
// directory when the model is called name. For a split model, name may
// be the model's ref itself (NAME-00001-of-0000N, N its parts): its parts
// are then NAME-0000i-of-0000N.gguf, not NAME-00001-of-0000N-0000i-….
func (s Source) fileNames(name string) []string {
	if !s.Split {
		return []string{name + Ext}
	}
	if base, ok := strings.CutSuffix(name, fmt.Sprintf("-%05d-of-%05d", 1, len(s.Files))); ok && base != "" {
		name = base
	}
	out := make([]string, len(s.Files))
	for i := range s.Files {
		out[i] = fmt.Sprintf("%s-%05d-of-%05d%s", name, i+1, len(s.Files), Ext)
	}
	return out
}

// ModelRef returns the ref the model of s has when called name: name, or
// for a split model its first part's file name without ".gguf" (name
// itself when it is that already).
func (s Source) ModelRef(name string) string {
	return strings.TrimSuffix(s.fileNames(name)[0], Ext)
}

// hfRef is a parsed hf:// ref.
type hfRef struct {
	repo  string // ORG/REPO
	quant string // or
	file  string // a path in the repository
}

var (
	hfPrefixes = []string{"hf://", "hf.co/", "huggingface.co/", "https://hf.co/", "https://huggingface.co/"}
	repoPart   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$`)
	splitName  = regexp.MustCompile(`(?i)^(.*)-(\d{5})-of-(\d{5})\.gguf$`)
)

// IsHubRef reports whether ref names a model on the Hub (hf://ORG/REPO…,
// hf.co/ORG/REPO…) rather than a URL.
func IsHubRef(ref string) bool {
	_, ok := cutHubPrefix(ref)
	return ok && !strings.Contains(ref, "/resolve/")
}

func cutHubPrefix(ref string) (string, bool) {
	for _, p := range hfPrefixes {
		if rest, ok := strings.CutPrefix(ref, p); ok {
			return rest, true
		}
	}
	return "", false
}

// parseHubRef parses ORG/REPO[:QUANT] and ORG/REPO/PATH.gguf after its
// prefix.
func parseHubRef(ref string) (hfRef, error) {
	rest, _ := cutHubPrefix(ref)
	bad := func(why string) error {
		return fmt.Errorf("%w %q: %s (want hf://ORG/REPO:QUANT or hf://ORG/REPO/FILE.gguf)", ErrBadURL, ref, why)
	}
	parts := strings.SplitN(rest, "/", 3)
	if len(parts) < 2 {
		return hfRef{}, bad("no repository")
	}
	r := hfRef{}
	repo := parts[1]
	if len(parts) == 2 {
		repo, r.quant, _ = strings.Cut(parts[1], ":")
	} else {
		r.file = parts[2]
		if !strings.HasSuffix(strings.ToLower(r.file), Ext) {
			return hfRef{}, bad("the file must be a .gguf")
		}
		if slices.Contains(strings.Split(r.file, "/"), "..") {
			return hfRef{}, bad("'..' in the file's path")
		}
	}
	if !repoPart.MatchString(parts[0]) || !repoPart.MatchString(repo) {
		return hfRef{}, bad("not a repository name")
	}
	r.repo = parts[0] + "/" + repo
	return r, nil
}

// treeEntry is one entry of the Hub's GET /api/models/{repo}/tree/{rev}:
// lfs.oid is the sha256 of an LFS file's content.
type treeEntry struct {
	Type string `json:"type"`
	Path string `json:"path"`
	Size int64  `json:"size"`
	LFS  *struct {
		OID  string `json:"oid"`
		Size int64  `json:"size"`
	} `json:"lfs"`
}

// maxTreePages bounds the pages of a repository's file list read.
const maxTreePages = 100

// ResolveSource finds what ref names: an http(s) URL is one file of
// unknown size and checksum; hf://ORG/REPO:QUANT (also hf.co/ORG/REPO:QUANT)
// is the GGUF of the repository whose file name holds QUANT (any case),
// and hf://ORG/REPO/FILE.gguf that file; both with every part of a split
// model, their sizes and the sha256 the Hub publishes. Errors: ErrBadURL,
// ErrNoModel (listing what the repository has), ErrGated, ErrDownload.
func ResolveSource(ctx context.Context, client *http.Client, hub Hub, ref string) (Source, error) {
	if client == nil {
		client = http.DefaultClient
	}
	if !IsHubRef(ref) {
		u, err := url.Parse(ref)
		if err != nil {
			return Source{}, fmt.Errorf("%w: %w", ErrBadURL, err)
		}
		if u.Scheme != "http" && u.Scheme != "https" {
			return Source{}, fmt.Errorf("%w %s: only http and https URLs and hf://ORG/REPO:QUANT refs can be pulled", ErrBadURL, ref)
		}
		name, err := RefFromURL(ref)
		if err != nil {
			return Source{}, err
		}
		return Source{Ref: ref, Name: name, Files: []RemoteFile{{URL: ref, Size: -1}}}, nil
	}
	hr, err := parseHubRef(ref)
	if err != nil {
		return Source{}, err
	}
	entries, err := hub.tree(ctx, client, hr.repo)
	if err != nil {
		return Source{}, err
	}
	groups := ggufGroups(entries)
	var g *ggufGroup
	if hr.file != "" {
		for i := range groups {
			if slices.ContainsFunc(groups[i].files, func(e treeEntry) bool { return e.Path == hr.file }) {
				g = &groups[i]
			}
		}
		if g == nil {
			return Source{}, fmt.Errorf("%w: %s has no file %s; %s", ErrNoModel, hr.repo, hr.file, available(groups))
		}
	} else {
		var matches []*ggufGroup
		for i := range groups {
			if hr.quant == "" || groups[i].hasQuant(hr.quant) {
				matches = append(matches, &groups[i])
			}
		}
		switch {
		case len(matches) == 1:
			g = matches[0]
		case len(groups) == 0:
			return Source{}, fmt.Errorf("%w: %s has no GGUF file", ErrNoModel, hr.repo)
		case hr.quant == "":
			return Source{}, fmt.Errorf("%w: %s has several GGUF models; name one as hf://%s:QUANT; %s", ErrNoModel, hr.repo, hr.repo, available(groups))
		case len(matches) == 0:
			return Source{}, fmt.Errorf("%w: %s has no GGUF file of quantization %s; %s", ErrNoModel, hr.repo, hr.quant, available(groups))
		default:
			var names []string
			for _, m := range matches {
				names = append(names, m.files[0].Path)
			}
			return Source{}, fmt.Errorf("%w: quantization %s of %s matches several files (%s); name one as hf://%s/FILE.gguf",
				ErrNoModel, hr.quant, hr.repo, strings.Join(names, ", "), hr.repo)
		}
	}
	if g.missing != "" {
		return Source{}, fmt.Errorf("%w: %s: split model %s lacks %s", ErrNoModel, hr.repo, g.base, g.missing)
	}
	src := Source{Ref: ref, Name: g.base, Split: len(g.files) > 1 || g.split}
	remote := func(e treeEntry) (RemoteFile, error) {
		rf := RemoteFile{URL: hub.resolveURL(hr.repo, e.Path), Path: e.Path, Size: e.Size}
		if e.LFS != nil {
			rf.Size = e.LFS.Size
			if isSHA256(e.LFS.OID) {
				rf.SHA256 = strings.ToLower(e.LFS.OID)
			}
		}
		if rf.SHA256 == "" {
			var err error
			if rf.SHA256, err = hub.linkedEtag(ctx, client, rf.URL); err != nil {
				return rf, err
			}
		}
		return rf, nil
	}
	for _, e := range g.files {
		rf, err := remote(e)
		if err != nil {
			return Source{}, err
		}
		src.Files = append(src.Files, rf)
	}
	if e, ok := projectorOf(entries, path.Dir(g.files[0].Path)); ok {
		rf, err := remote(e)
		if err != nil {
			return Source{}, err
		}
		src.Projector = &rf
	}
	if err := CheckRef(src.ModelRef(src.Name)); err != nil {
		return Source{}, fmt.Errorf("cannot name the model after the file name %q: %w", g.files[0].Path, err)
	}
	return src, nil
}

func (h Hub) resolveURL(repo, file string) string {
	segs := strings.Split(file, "/")
	for i, s := range segs {
		segs[i] = url.PathEscape(s)
	}
	return h.endpoint() + "/" + repo + "/resolve/main/" + strings.Join(segs, "/")
}

func (h Hub) request(ctx context.Context, method, u string) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, method, u, nil)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrDownload, err)
	}
	if h.Token != "" {
		req.Header.Set("Authorization", "Bearer "+h.Token)
	}
	return req, nil
}

// tree reads the repository's file list, every page of it.
func (h Hub) tree(ctx context.Context, client *http.Client, repo string) ([]treeEntry, error) {
	next := h.endpoint() + "/api/models/" + repo + "/tree/main?recursive=true"
	var all []treeEntry
	for page := 0; next != ""; page++ {
		if page == maxTreePages {
			return nil, fmt.Errorf("%w: the file list of %s has more than %d pages", ErrDownload, repo, maxTreePages)
		}
		req, err := h.request(ctx, http.MethodGet, next)
		if err != nil {
			return nil, err
		}
		resp, err := client.Do(req)
		if err != nil {
			return nil, fmt.Errorf("%w: the file list of %s: %w", ErrDownload, repo, err)
		}
		var entries []treeEntry
		err = h.answer(resp, repo, &entries)
		if err != nil {
			return nil, err
		}
		all = append(all, entries...)
		next = nextLink(resp.Header.Get("Link"))
		if next != "" && strings.HasPrefix(next, "/") {
			next = h.endpoint() + next
		}
	}
	return all, nil
}

// answer decodes a Hub API answer into out, or turns its status into the
// error it means.
func (h Hub) answer(resp *http.Response, repo string, out any) error {
	defer resp.Body.Close()
	if err := h.statusError(resp, repo); err != nil {
		return err
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(out); err != nil {
		return fmt.Errorf("%w: the file list of %s: %w", ErrDownload, repo, err)
	}
	return nil
}

// statusError is the error an answer of the Hub about repo means, nil for
// a 2xx. The Hub answers 401 for a repository that does not exist when
// asked without a token, with X-Error-Code RepoNotFound.
func (h Hub) statusError(resp *http.Response, repo string) error {
	code := resp.Header.Get("X-Error-Code")
	switch {
	case resp.StatusCode/100 == 2:
		return nil
	case resp.StatusCode == http.StatusNotFound || code == "RepoNotFound":
		return fmt.Errorf("%w: no repository %s at %s (%s)", ErrNoModel, repo, h.endpoint(), resp.Status)
	case resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden:
		if h.Token == "" {
			return fmt.Errorf("%w: %s answered %s for %s: the repository is gated or private; accept its terms on the Hub and set HF_TOKEN",
				ErrGated, h.endpoint(), resp.Status, repo)
		}
		return fmt.Errorf("%w: %s answered %s for %s: HF_TOKEN was refused, or its account has not accepted the repository's terms",
			ErrGated, h.endpoint(), resp.Status, repo)
	}
	return fmt.Errorf("%w: %s %s: %s", ErrDownload, resp.Request.Method, resp.Request.URL.Redacted(), resp.Status)
}

// linkedEtag asks the Hub for a file's sha256 when its file list does not
// say: a HEAD of resolve/main/FILE, not followed, whose X-Linked-Etag
// (or ETag) is the sha256 of an LFS file. "" when it is not one.
func (h Hub) linkedEtag(ctx context.Context, client *http.Client, u string) (string, error) {
	req, err := h.request(ctx, http.MethodHead, u)
	if err != nil {
		return "", err
	}
	noFollow := *client
	noFollow.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err := noFollow.Do(req)
	if err != nil {
		return "", fmt.Errorf("%w: HEAD %s: %w", ErrDownload, u, err)
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 && resp.StatusCode/100 != 3 {
		return "", fmt.Errorf("%w: HEAD %s: %s", ErrDownload, u, resp.Status)
	}
	for _, k := range []string{"X-Linked-Etag", "ETag"} {
		v := strings.TrimPrefix(resp.Header.Get(k), "W/")
		if v = strings.Trim(v, `"`); isSHA256(v) {
			return strings.ToLower(v), nil
		}
	}
	return "", nil
}

func isSHA256(s string) bool {
	b, err := hex.DecodeString(s)
	return err == nil && len(b) == 32
}

// nextLink returns the rel="next" URL of a Link header, "" without one.
func nextLink(link string) string {
	for part := range strings.SplitSeq(link, ",") {
		u, params, ok := strings.Cut(part, ";")
		if ok && strings.Contains(params, `rel="next"`) {
			return strings.Trim(strings.TrimSpace(u), "<>")
		}
	}
	return ""
}

// ggufGroup is one GGUF model of a repository: one file, or the parts of
// a split one in order.
type ggufGroup struct {
	base    string // file name without ".gguf" and the part suffix
	split   bool
	files   []treeEntry
	missing string // a part the repository lacks
}

// hasQuant reports whether quant is a token of the group's name: after a
// '-' or '.', and at its end or before a '-' or '.' (Q4_K matches
// "x-Q4_K.gguf", not "x-Q4_K_M.gguf").
func (g ggufGroup) hasQuant(quant string) bool {
	name, q := strings.ToLower(g.base), strings.ToLower(quant)
	for i := 0; ; {
		j := strings.Index(name[i:], q)
		if j < 0 {
			return false
		}
		j += i
		end := j + len(q)
		before := j == 0 || name[j-1] == '-' || name[j-1] == '.'
		after := end == len(name) || name[end] == '-' || name[end] == '.'
		if before && after {
			return true
		}
		i = j + 1
	}
}

// quant guesses the group's quantization: its name's last '-' or '.'
// separated token.
func (g ggufGroup) quant() string {
	return g.base[strings.LastIndexAny(g.base, "-.")+1:]
}

// projectorOf picks the vision projector (mmproj*.gguf) of a model in
// folder dir of a repository: of several, the F16 one, else BF16, else
// Q8_0, else the first by name.
func projectorOf(entries []treeEntry, dir string) (treeEntry, bool) {
	var found []treeEntry
	for _, e := range entries {
		name := path.Base(e.Path)
		if e.Type == "file" && path.Dir(e.Path) == dir && isProjector(name) && strings.HasSuffix(strings.ToLower(name), Ext) {
			found = append(found, e)
		}
	}
	if len(found) == 0 {
		return treeEntry{}, false
	}
	slices.SortFunc(found, func(a, b treeEntry) int { return strings.Compare(a.Path, b.Path) })
	for _, q := range []string{"f16", "bf16", "q8_0"} {
		for _, e := range found {
			if (ggufGroup{base: strings.TrimSuffix(path.Base(e.Path), path.Ext(e.Path))}).hasQuant(q) {
				return e, true
			}
		}
	}
	return found[0], true
}

// ggufGroups groups the GGUF files of a repository's list into models,
// leaving out multimodal projectors (mmproj*), sorted by name.
func ggufGroups(entries []treeEntry) []ggufGroup {
	byBase := map[string]*ggufGroup{}
	parts := map[string]map[int]treeEntry{}
	counts := map[string]int{}
	for _, e := range entries {
		name := path.Base(e.Path)
		if e.Type != "file" || !strings.HasSuffix(strings.ToLower(name), Ext) || strings.HasPrefix(strings.ToLower(name), "mmproj") {
			continue
		}
		base, no, count := name[:len(name)-len(Ext)], 0, 0
		dirBase := e.Path[:len(e.Path)-len(name)] + base
		if m := splitName.FindStringSubmatch(name); m != nil {
			base, dirBase = m[1], e.Path[:len(e.Path)-len(name)]+m[1]
			no, _ = strconv.Atoi(m[2])
			count, _ = strconv.Atoi(m[3])
		}
		g := byBase[dirBase]
		if g == nil {
			g = &ggufGroup{base: base, split: count > 0}
			byBase[dirBase] = g
			parts[dirBase] = map[int]treeEntry{}
		}
		parts[dirBase][no] = e
		counts[dirBase] = max(counts[dirBase], count)
	}
	out := make([]ggufGroup, 0, len(byBase))
	for k, g := range byBase {
		if n := counts[k]; n > 0 {
			for i := 1; i <= n; i++ {
				e, ok := parts[k][i]
				if !ok {
					if g.missing == "" {
						g.missing = fmt.Sprintf("part %d of %d", i, n)
					}
					continue
				}
				g.files = append(g.files, e)
			}
		} else {
			g.files = []treeEntry{parts[k][0]}
		}
		if len(g.files) > 0 {
			out = append(out, *g)
		}
	}
	slices.SortFunc(out, func(a, b ggufGroup) int { return strings.Compare(a.files[0].Path, b.files[0].Path) })
	return out
}

// available lists a repository's GGUF models for an error message.
func available(groups []ggufGroup) string {
	if len(groups) == 0 {
		return "it has no GGUF file"
	}
	var s []string
	for _, g := range groups {
		d := g.files[0].Path
		if len(g.files) > 1 {
			d += fmt.Sprintf(" and %d more parts", len(g.files)-1)
		}
		s = append(s, fmt.Sprintf("%s (%s)", g.quant(), d))
	}
	return "available: " + strings.Join(s, ", ")
}
