package modelstore

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path"
	"strings"

	"github.com/apiary-llm/apiary/internal/gguf"
)

// Sentinel errors of Pull.
var (
	// ErrBadURL means the URL cannot be pulled from: it does not parse, or
	// its scheme is not http or https.
	ErrBadURL = errors.New("modelstore: bad model URL")
	// ErrDownload means the server did not send the model: an HTTP error
	// status, or a connection that failed or broke off.
	ErrDownload = errors.New("modelstore: download failed")
)

// PullOptions tune Pull.
type PullOptions struct {
	// Ref names the model; by default the URL's file name without ".gguf".
	Ref string
	// Overwrite replaces a model of the same ref; without it that is ErrExists.
	Overwrite bool
	// Client makes the request; http.DefaultClient when nil.
	Client *http.Client
	// Progress, when set, is called after each chunk is written with the
	// bytes written so far and the total (-1 when the server does not say).
	Progress func(written, total int64)
}

// RefFromURL derives a model ref from a download URL: the last path element
// without ".gguf" (".../resolve/main/tiny-Q4_K_M.gguf?download=true" gives
// "tiny-Q4_K_M").
func RefFromURL(rawURL string) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrBadURL, err)
	}
	base := path.Base(u.Path)
	ref, _ := strings.CutSuffix(base, Ext)
	if err := CheckRef(ref); err != nil {
		return "", fmt.Errorf("cannot name the model after the URL's file name %q: %w", base, err)
	}
	return ref, nil
}

// Pull downloads the GGUF model at rawURL (http or https) into dir as
// <ref>.gguf. The download goes to a temporary file in dir and is moved into
// place only once complete and accepted by the GGUF reader (see WriteFile),
// so an interrupted or foreign download leaves nothing behind. A body that
// does not start with the GGUF magic stops the download at once. It returns
// the placed model.
func Pull(ctx context.Context, dir, rawURL string, opts PullOptions) (Model, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return Model{}, fmt.Errorf("%w: %w", ErrBadURL, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return Model{}, fmt.Errorf("%w %s: only http and https URLs can be pulled", ErrBadURL, rawURL)
	}
	ref := opts.Ref
	if ref == "" {
		if ref, err = RefFromURL(rawURL); err != nil {
			return Model{}, err
		}
	}
	dst, err := Path(dir, ref)
	if err != nil {
		return Model{}, err
	}
	client := opts.Client
	if client == nil {
		client = http.DefaultClient
	}

	download := func(w io.Writer) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, rawURL, nil)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrDownload, err)
		}
		resp, err := client.Do(req)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrDownload, err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%w: GET %s: %s", ErrDownload, rawURL, resp.Status)
		}
		body := bufio.NewReader(resp.Body)
		if err := checkMagic(body, rawURL, resp.Header.Get("Content-Type")); err != nil {
			return err
		}
		cw := &countingWriter{w: w, total: resp.ContentLength, progress: opts.Progress}
		if _, err := body.WriteTo(cw); err != nil {
			if cw.err != nil {
				return fmt.Errorf("modelstore: writing %s: %w", dst, cw.err)
			}
			return fmt.Errorf("%w: GET %s: after %d bytes: %w", ErrDownload, rawURL, cw.n, err)
		}
		if resp.ContentLength >= 0 && cw.n != resp.ContentLength {
			return fmt.Errorf("%w: GET %s: got %d of %d bytes", ErrDownload, rawURL, cw.n, resp.ContentLength)
		}
		return nil
	}
	f, err := WriteFile(dst, opts.Overwrite, download)
	if err != nil {
		if e, ok := errors.AsType[*gguf.Error](err); ok {
			// The reader names the temporary file; name what was pulled.
			e.Name = rawURL
		}
		return Model{}, err
	}
	st, err := os.Stat(dst)
	if err != nil {
		return Model{}, fmt.Errorf("modelstore: %w", err)
	}
	info := f.Info()
	return Model{Ref: ref, Path: dst, Size: st.Size(), ModTime: st.ModTime(), Info: &info}, nil
}

// checkMagic fails fast when the body is not a GGUF file, e.g. an HTML
// page, instead of downloading it whole.
func checkMagic(body *bufio.Reader, rawURL, contentType string) error {
	b, err := body.Peek(len(gguf.Magic))
	if string(b) == gguf.Magic {
		return nil
	}
	if err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("%w: GET %s: %w", ErrDownload, rawURL, err)
	}
	msg := fmt.Sprintf("not a GGUF file (magic %q)", b)
	if contentType != "" {
		msg += fmt.Sprintf("; the server sent %s", contentType)
	}
	return &gguf.Error{Name: rawURL, Msg: msg, Err: gguf.ErrNotGGUF}
}

// countingWriter counts the bytes written, reports progress and remembers
// a write error (to tell disk errors from network ones).
type countingWriter struct {
	w        io.Writer
	n, total int64
	progress func(written, total int64)
	err      error
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	if err != nil {
		c.err = err
		return n, err
	}
	if c.progress != nil {
		c.progress(c.n, c.total)
	}
	return n, nil
}
