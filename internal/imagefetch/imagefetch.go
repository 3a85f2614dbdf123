// Package imagefetch fetches the pictures a request names by URL (an
// OpenAI image_url part, an Anthropic url source), so that the queen can
// hand them to a worker inline: over http or https only, from public
// addresses only unless told otherwise (a request must not make the queen
// reach its own network: the hives, a cloud's metadata service), checked
// when the connection is made (a name that resolves elsewhere later, DNS
// rebinding, is caught too), bounded in size and time, and only what
// llama.cpp decodes (PNG, JPEG, GIF, BMP, told from the bytes).
package imagefetch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"syscall"
	"time"
)

// Defaults of Config.
const (
	DefaultMaxBytes = 20 << 20
	DefaultTimeout  = 15 * time.Second
	maxRedirects    = 3
)

// ErrFetch is every failure of Fetch: the URL, the address, the answer or
// the bytes; its message says which, in words a client can act on.
var ErrFetch = errors.New("cannot fetch the image")

// refused is a connection or redirect the fetcher refused, in words of
// its own: the transport's wrapping (which names the address dialled)
// is dropped.
type refused struct{ msg string }

func (r *refused) Error() string        { return ErrFetch.Error() + ": " + r.msg }
func (r *refused) Is(target error) bool { return target == ErrFetch }

// Fetcher fetches pictures by URL.
type Fetcher struct {
	// AllowPrivate lets URLs reach loopback, private, link-local and other
	// non-public addresses (images on an intranet host). Off by default.
	AllowPrivate bool
	MaxBytes     int64         // default DefaultMaxBytes
	Timeout      time.Duration // the whole fetch; default DefaultTimeout
	client       *http.Client
}

// New returns a Fetcher with f's settings and its own HTTP client.
func New(f Fetcher) *Fetcher {
	if f.MaxBytes <= 0 {
		f.MaxBytes = DefaultMaxBytes
	}
	if f.Timeout <= 0 {
		f.Timeout = DefaultTimeout
	}
	allow := f.AllowPrivate
	dialer := &net.Dialer{Timeout: 10 * time.Second, Control: func(_, address string, _ syscall.RawConn) error {
		ap, err := netip.ParseAddrPort(address)
		if err != nil {
			return &refused{"a connection to an address that is no IP address"}
		}
		if !allow && !public(ap.Addr()) {
			// The address itself is not said: a client learns nothing
			// of the queen's network from the answer.
			return &refused{"its host is not at a public address (loopback, private, link-local …; the queen's --image-fetch-private allows them)"}
		}
		return nil
	}}
	f.client = &http.Client{
		Transport: &http.Transport{DialContext: dialer.DialContext, Proxy: nil, TLSHandshakeTimeout: 10 * time.Second,
			ResponseHeaderTimeout: f.Timeout, MaxIdleConns: 8, IdleConnTimeout: 30 * time.Second},
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if len(via) >= maxRedirects {
				return &refused{fmt.Sprintf("more than %d redirects", maxRedirects)}
			}
			return checkURL(req.URL)
		},
	}
	return &f
}

// public says whether a is a public unicast address.
func public(a netip.Addr) bool {
	a = a.Unmap()
	return a.IsValid() && a.IsGlobalUnicast() && !a.IsPrivate() && !a.IsLoopback() && !a.IsLinkLocalUnicast() &&
		!cgnat.Contains(a) && !a.IsMulticast()
}

// cgnat is the shared address space of carrier-grade NAT (RFC 6598),
// which IsPrivate leaves out.
var cgnat = netip.MustParsePrefix("100.64.0.0/10")

// checkURL refuses what is no http(s) URL of a host, or one with user
// info.
func checkURL(u *url.URL) error {
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Errorf("%w: only http and https URLs are fetched", ErrFetch)
	case u.Host == "" || u.Hostname() == "":
		return fmt.Errorf("%w: the URL has no host", ErrFetch)
	case u.User != nil:
		return fmt.Errorf("%w: the URL carries user info", ErrFetch)
	}
	return nil
}

// Fetch returns the picture at raw and its media type.
func (f *Fetcher) Fetch(ctx context.Context, raw string) ([]byte, string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, "", fmt.Errorf("%w: not a URL: %v", ErrFetch, err)
	}
	if err := checkURL(u); err != nil {
		return nil, "", err
	}
	ctx, cancel := context.WithTimeout(ctx, f.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, "", fmt.Errorf("%w: %v", ErrFetch, err)
	}
	req.Header.Set("Accept", "image/png, image/jpeg, image/gif, image/bmp")
	resp, err := f.client.Do(req)
	if err != nil {
		if r, ok := errors.AsType[*refused](err); ok {
			return nil, "", r
		}
		if errors.Is(err, ErrFetch) { // checkURL's, on a redirect
			if ue, ok := errors.AsType[*url.Error](err); ok {
				return nil, "", ue.Err
			}
			return nil, "", err
		}
		if ctx.Err() != nil {
			return nil, "", fmt.Errorf("%w: no answer within %s", ErrFetch, f.Timeout)
		}
		return nil, "", fmt.Errorf("%w: %v", ErrFetch, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, "", fmt.Errorf("%w: the server answered %s", ErrFetch, resp.Status)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, f.MaxBytes+1))
	switch {
	case err != nil:
		return nil, "", fmt.Errorf("%w: reading it: %v", ErrFetch, err)
	case int64(len(b)) > f.MaxBytes:
		return nil, "", fmt.Errorf("%w: it is over %s", ErrFetch, size(f.MaxBytes))
	}
	mt := PictureType(b)
	if mt == "" {
		return nil, "", fmt.Errorf("%w: it is not a PNG, JPEG, GIF or BMP picture (the server sent %q)", ErrFetch, resp.Header.Get("Content-Type"))
	}
	return b, mt, nil
}

// PictureType is the media type of a picture from its first bytes: PNG,
// JPEG, GIF or BMP, what llama.cpp's decoder (stb_image) reads; "" for
// any other bytes (which never reach the decoder, nor its detection of
// audio and video).
func PictureType(b []byte) string {
	switch t := http.DetectContentType(b); t {
	case "image/png", "image/jpeg", "image/gif", "image/bmp":
		return t
	}
	return ""
}

// size says n bytes in MiB when it is a whole number of them.
func size(n int64) string {
	if n >= 1<<20 && n%(1<<20) == 0 {
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%d bytes", n)
}
