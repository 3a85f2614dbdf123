package modelconfig

import (
	"fmt"
	"net/url"
	"regexp"
	"strings"
)

// SourceKind is where a model's GGUF comes from.
type SourceKind string

// The kinds of source.
const (
	SourceHF  SourceKind = "hf"  // a Hugging Face repository
	SourceURL SourceKind = "url" // a plain http(s) download
)

// Source is a model's source, parsed.
type Source struct {
	Raw  string
	Kind SourceKind
	// Repo is ORG/REPO (SourceHF).
	Repo string
	// Quant is the quantization asked for with :QUANT (SourceHF), e.g.
	// Q4_K_M; File is the file asked for instead, with its path in the
	// repository (…/FILE.gguf). One of the two is set.
	Quant string
	File  string
	// URL is the download (SourceURL).
	URL string
}

var (
	hfPart  = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)
	hfQuant = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)
)

// ParseSource parses a model's source: hf://ORG/REPO:QUANT,
// hf://ORG/REPO/FILE.gguf, hf.co/ORG/REPO:QUANT, hf.co/ORG/REPO/FILE.gguf,
// or an http:// or https:// URL.
func ParseSource(s string) (Source, error) {
	out := Source{Raw: s}
	var rest string
	switch {
	case strings.HasPrefix(s, "hf://"):
		rest = strings.TrimPrefix(s, "hf://")
	case strings.HasPrefix(s, "hf.co/"):
		rest = strings.TrimPrefix(s, "hf.co/")
	case strings.HasPrefix(s, "http://"), strings.HasPrefix(s, "https://"):
		u, err := url.Parse(s)
		if err != nil || u.Host == "" || u.User != nil {
			return out, fmt.Errorf("%q is not a download URL (http(s)://HOST/PATH, no user in it)", s)
		}
		out.Kind, out.URL = SourceURL, s
		return out, nil
	default:
		return out, fmt.Errorf("%q is not a source: hf://ORG/REPO:QUANT, hf://ORG/REPO/FILE.gguf, hf.co/ORG/REPO:QUANT or an http(s) URL", s)
	}
	out.Kind = SourceHF
	parts := strings.Split(rest, "/")
	bad := func() (Source, error) {
		return out, fmt.Errorf("%q is not a Hugging Face source: hf://ORG/REPO:QUANT or hf://ORG/REPO/FILE.gguf", s)
	}
	if len(parts) < 2 {
		return bad()
	}
	if len(parts) == 2 {
		repo, quant, hasQuant := strings.Cut(parts[1], ":")
		if !hfPart.MatchString(parts[0]) || !hfPart.MatchString(repo) || (hasQuant && !hfQuant.MatchString(quant)) {
			return bad()
		}
		out.Repo, out.Quant = parts[0]+"/"+repo, quant
		if !hasQuant {
			return out, fmt.Errorf("%q names no quantization: add :QUANT (e.g. :Q4_K_M) or the file (/FILE.gguf)", s)
		}
		return out, nil
	}
	for _, p := range parts {
		if !hfPart.MatchString(p) || strings.Contains(p, "..") {
			return bad()
		}
	}
	out.Repo, out.File = parts[0]+"/"+parts[1], strings.Join(parts[2:], "/")
	if !strings.HasSuffix(out.File, ".gguf") {
		return out, fmt.Errorf("%q names the file %q, which is not a .gguf", s, out.File)
	}
	return out, nil
}
