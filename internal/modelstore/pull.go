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
	"path/filepath"
	"strings"
	"time"

	"github.com/apiary-llm/apiary/internal/gguf"
)

// Sentinel errors of Pull.
var (
	// ErrBadURL means the ref cannot be pulled from: it does not parse, or
	// it is neither an http(s) URL nor an hf:// ref.
	ErrBadURL = errors.New("bad model URL")
	// ErrDownload means the server did not send the model: an HTTP error
	// status, or a connection that failed or broke off.
	ErrDownload = errors.New("download failed")
)

// PullOptions tune Pull.
type PullOptions struct {
	// Ref names the model; by default the file name without ".gguf" (for
	// a split model without its part suffix: its parts are saved as
	// REF-00001-of-0000N.gguf …, and the model's ref is the first part's
	// name; a Ref that is that name already, REF-00001-of-0000N, saves
	// the same files).
	Ref string
	// Overwrite replaces a model of the same ref; without it that is ErrExists.
	Overwrite bool
	// Client makes the requests; http.DefaultClient when nil.
	Client *http.Client
	// Hub is where hf:// refs are looked up; HubFromEnv() when zero.
	Hub Hub
	// Source is what to fetch, when the caller resolved it already
	// (ResolveSource); nil: Pull resolves the ref.
	Source *Source
	// Progress, when set, is called after each chunk is written.
	Progress func(Progress)
	// Retries is how many attempts in a row that write nothing a file's
	// download makes before it gives up; default 5.
	Retries int
	// RetryDelay is the back-off after the first failed attempt, doubled
	// after each (at most 32 times); default 1s.
	RetryDelay time.Duration
	// StallTimeout aborts an attempt that receives no byte for this long
	// (a connection that stays open and sends nothing, before or during
	// the body), which is then retried as a broken one, resumed from the
	// bytes written; default DefaultStallTimeout.
	StallTimeout time.Duration
	// Retrying, when set, is called before each attempt after a failed
	// one, with why and where it resumes.
	Retrying func(Retry)
	// FreeSpace returns the bytes free for dir; FreeSpace (statfs) when nil.
	FreeSpace func(dir string) (uint64, error)
}

func (o *PullOptions) retries() int {
	if o.Retries <= 0 {
		return 5
	}
	return o.Retries
}

// DefaultStallTimeout is PullOptions.StallTimeout's default.
const DefaultStallTimeout = 60 * time.Second

func (o *PullOptions) stallTimeout() time.Duration {
	if o.StallTimeout <= 0 {
		return DefaultStallTimeout
	}
	return o.StallTimeout
}

// Retry is an attempt of a file's download that failed and is tried
// again.
type Retry struct {
	File   string        // the file's URL
	Err    error         // why the attempt failed (a *StallError for a stall)
	Resume int64         // the byte the next attempt starts from
	Delay  time.Duration // the pause before it
}

// String says why and where the download resumes, as a log line does:
// "no bytes for 60s; resuming at 41943040 bytes".
func (r Retry) String() string {
	why := r.Err.Error()
	if se, ok := errors.AsType[*StallError](r.Err); ok {
		why = fmt.Sprintf("no bytes for %s", se.Timeout)
	}
	return fmt.Sprintf("%s; resuming at %d bytes", why, r.Resume)
}

// StallError is an attempt that received no byte for Timeout (the
// connection stayed open); it wraps into ErrDownload.
type StallError struct {
	URL     string
	Timeout time.Duration
	At      int64 // the bytes of the file on disk when it stalled
}

func (e *StallError) Error() string {
	return fmt.Sprintf("GET %s: no bytes for %s after %d bytes", e.URL, e.Timeout, e.At)
}

func (o *PullOptions) retryDelay() time.Duration {
	if o.RetryDelay <= 0 {
		return time.Second
	}
	return o.RetryDelay
}

// Progress is how far a pull is.
type Progress struct {
	// File is the file being downloaded (its URL).
	File string
	// Written is the bytes of the model on disk, Resumed of them there
	// before this pull started (resumed from partial files).
	Written, Resumed int64
	// Total is the model's size, -1 while unknown.
	Total int64
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

// Pull downloads the GGUF model that ref names (an http(s) URL, or
// hf://ORG/REPO:QUANT, hf://ORG/REPO/FILE.gguf: see ResolveSource) into
// dir, and returns the placed model.
//
// Each file goes to FILE.gguf.partial beside its final name, which a
// broken or stalled connection (retried with a back-off) and a later pull
// resume with a Range request. Its sha256 is computed while it is written (from
// the partial file, read once, on resume) and must be the one the Hub
// publishes; a mismatch deletes the partial file. The download must fit
// in the free disk space, checked before it starts. Complete files are
// checked with the GGUF reader and only then renamed to their names, a
// split model's first part last: dir never holds a partial file under a
// model's name. A body that does not start with the GGUF magic stops the
// download at once. On an error the partial files are kept only when a
// later pull can resume them (a broken connection, a canceled pull).
func Pull(ctx context.Context, dir, ref string, opts PullOptions) (Model, error) {
	src := opts.Source
	if opts.Hub == (Hub{}) {
		opts.Hub = HubFromEnv()
	}
	if src == nil {
		s, err := ResolveSource(ctx, opts.Client, opts.Hub, ref)
		if err != nil {
			return Model{}, err
		}
		src = &s
	}
	if len(src.Files) == 0 {
		return Model{}, fmt.Errorf("%w: %s: no file to fetch", ErrNoModel, ref)
	}
	name := opts.Ref
	if name == "" {
		name = src.Name
	}
	if err := CheckRef(name); err != nil {
		return Model{}, err
	}
	modelRef := src.ModelRef(name)
	if err := CheckRef(modelRef); err != nil {
		return Model{}, err
	}
	var dsts []string
	for _, n := range src.fileNames(name) {
		dsts = append(dsts, filepath.Join(dir, n))
	}
	files := src.all()
	if src.Projector != nil {
		dsts = append(dsts, filepath.Join(dir, ProjectorPrefix+modelRef+Ext))
	}
	if !opts.Overwrite {
		for _, p := range dsts {
			if _, err := os.Lstat(p); err == nil {
				return Model{}, fmt.Errorf("%w: %s", ErrExists, p)
			}
		}
	}
	total := src.Size()
	if total >= 0 {
		need := total
		for _, p := range dsts {
			if st, err := os.Stat(p + PartialExt); err == nil {
				need -= st.Size()
			}
		}
		if err := checkSpace(&opts, dir, need); err != nil {
			return Model{}, err
		}
	}
	token := ""
	if IsHubRef(src.Ref) {
		token = opts.Hub.Token
	}
	downloads := make([]*download, len(files))
	var done, resumed int64 // bytes of the files before the current one; bytes on disk at their start
	keep := false
	defer func() {
		for _, d := range downloads {
			if d != nil {
				d.close(!keep || d.off == 0)
			}
		}
	}()
	for i, f := range files {
		d := &download{file: f, partial: dsts[i] + PartialExt, opts: &opts, dir: dir, token: token}
		downloads[i] = d
		if err := d.open(); err != nil {
			keep = errors.Is(err, ErrBusy) // the partial file is another pull's
			if keep {
				downloads[i] = nil
			}
			return Model{}, err
		}
		resumed += d.off
		d.report = func(written, size int64) {
			if opts.Progress == nil {
				return
			}
			t := total
			if t < 0 && len(src.Files) == 1 {
				t = size // a plain URL's, once the server said
			}
			opts.Progress(Progress{File: f.URL, Written: done + written, Resumed: resumed, Total: t})
		}
		if err := d.run(ctx); err != nil {
			keep = ctx.Err() != nil || errors.Is(err, ErrDownload)
			return Model{}, err
		}
		if err := d.verify(); err != nil {
			downloads[i] = nil // deleted
			return Model{}, err
		}
		done += d.off
	}
	var size int64
	for i, d := range downloads {
		if err := d.f.Sync(); err != nil {
			keep = true
			return Model{}, fmt.Errorf("writing %s: %w", d.partial, err)
		}
		if err := checkPart(d.partial, i == 0, files[i].URL); err != nil {
			return Model{}, err
		}
		if i < len(src.Files) {
			size += d.off
		}
	}
	// The first part last (a projector first): the model is listed once
	// all its parts are.
	for i := len(downloads) - 1; i >= 0; i-- {
		if err := place(downloads[i].partial, dsts[i], opts.Overwrite); err != nil {
			return Model{}, err
		}
	}
	st, err := os.Stat(dsts[0])
	if err != nil {
		return Model{}, err
	}
	info, err := ReadInfo(dsts[0])
	if err != nil {
		return Model{}, err
	}
	m := Model{Ref: modelRef, Path: dsts[0], Size: size, ModTime: st.ModTime(), Info: &info}
	if src.Projector != nil {
		m.Projector = dsts[len(dsts)-1]
	}
	return m, nil
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
