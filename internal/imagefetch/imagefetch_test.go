package imagefetch

import (
	"bytes"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
)

var png = []byte("\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR fake but typed")

func server(t *testing.T) *httptest.Server {
	t.Helper()
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/pic.png":
			w.Write(png)
		case "/big.png":
			w.Write(append(png, bytes.Repeat([]byte{0}, 2<<10)...))
		case "/page":
			w.Header().Set("Content-Type", "text/html")
			w.Write([]byte("<html>no picture</html>"))
		case "/moved":
			http.Redirect(w, r, "/pic.png", http.StatusFound)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(s.Close)
	return s
}

// A loopback host (what a request could use to reach the queen's own
// network) is refused unless AllowPrivate, when the connection is made.
func TestFetchRefusesPrivateAddresses(t *testing.T) {
	s := server(t)
	_, _, err := New(Fetcher{}).Fetch(t.Context(), s.URL+"/pic.png")
	if !errors.Is(err, ErrFetch) || !strings.Contains(err.Error(), "not at a public address") {
		t.Errorf("a loopback URL: %v; want it refused as no public address", err)
	}
	for _, a := range []string{"10.1.2.3", "192.168.0.1", "169.254.169.254", "100.64.0.1", "::1", "fe80::1", "127.0.0.1", "0.0.0.0"} {
		if public(netip.MustParseAddr(a)) {
			t.Errorf("%s counted public", a)
		}
	}
	for _, a := range []string{"8.8.8.8", "2001:4860:4860::8888"} {
		if !public(netip.MustParseAddr(a)) {
			t.Errorf("%s not counted public", a)
		}
	}
}

// With AllowPrivate: the picture and its type; a redirect followed; a
// page that is no picture, a picture over MaxBytes, a 404 and a URL of
// another scheme refused, each saying why.
func TestFetch(t *testing.T) {
	s := server(t)
	f := New(Fetcher{AllowPrivate: true, MaxBytes: 1 << 10})
	for _, path := range []string{"/pic.png", "/moved"} {
		b, mt, err := f.Fetch(t.Context(), s.URL+path)
		if err != nil || mt != "image/png" || !bytes.Equal(b, png) {
			t.Errorf("%s: %q %q %v", path, b, mt, err)
		}
	}
	for url, want := range map[string]string{
		s.URL + "/page":    "not a PNG, JPEG, GIF or BMP",
		s.URL + "/big.png": "over",
		s.URL + "/none":    "404",
		"ftp://x/pic.png":  "only http and https",
		"http://u:p@x/y":   "user info",
	} {
		if _, _, err := f.Fetch(t.Context(), url); !errors.Is(err, ErrFetch) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v; want an ErrFetch saying %q", url, err, want)
		}
	}
}
