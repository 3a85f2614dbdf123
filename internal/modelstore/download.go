package modelstore

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/gguf"
)

// Sentinel errors of a download.
var (
	// ErrChecksum means a download's sha256 is not the one the Hub
	// publishes; its partial file was deleted.
	ErrChecksum = errors.New("checksum mismatch")
	// ErrNoSpace means the models directory's file system has not the
	// room for the download; nothing was downloaded.
	ErrNoSpace = errors.New("not enough free disk space")
	// ErrBusy means another pull is writing the same file.
	ErrBusy = errors.New("another pull of this file is under way")
)

// PartialExt ends the name of a file being downloaded, kept beside the
// model's file (tiny.gguf.partial) so that the next pull resumes it.
const PartialExt = ".partial"

// copyBuffer is the size of the reads from the network and the writes to
// disk.
const copyBuffer = 1 << 20

// FreeSpace returns the bytes an unprivileged process may still write to
// the file system of dir (statfs).
func FreeSpace(dir string) (uint64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, fmt.Errorf("statfs %s: %w", dir, err)
	}
	return st.Bavail * uint64(st.Bsize), nil
}

// download is one file being fetched into its partial file, resumed where
// an earlier attempt or run stopped.
type download struct {
	file    RemoteFile
	partial string
	opts    *PullOptions
	dir     string
	token   string // sent to the Hub ("" for a plain URL)
	// report is called after every write with the bytes of this file on
	// disk and its size (-1: unknown).
	report func(written, size int64)

	f    *os.File
	h    hash.Hash
	off  int64 // bytes in the partial file, all hashed
	size int64 // -1 until known
}

// open opens (or creates) and locks the partial file and hashes what it
// holds, reading it once. A partial file longer than the file is started
// over.
func (d *download) open() error {
	f, err := os.OpenFile(d.partial, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return fmt.Errorf("%w: %s is locked", ErrBusy, d.partial)
		}
		return fmt.Errorf("lock %s: %w", d.partial, err)
	}
	d.f, d.h, d.size = f, sha256.New(), d.file.Size
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if d.size >= 0 && st.Size() > d.size {
		return d.restart()
	}
	n, err := io.CopyBuffer(d.h, io.NewSectionReader(f, 0, st.Size()), make([]byte, copyBuffer))
	if err != nil {
		return fmt.Errorf("reading %s: %w", d.partial, err)
	}
	d.off = n
	if _, err := f.Seek(n, io.SeekStart); err != nil {
		return err
	}
	return nil
}

// restart empties the partial file.
func (d *download) restart() error {
	if err := d.f.Truncate(0); err != nil {
		return err
	}
	if _, err := d.f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	d.h.Reset()
	d.off = 0
	return nil
}

// close closes the partial file; remove deletes it too.
func (d *download) close(remove bool) {
	if d.f != nil {
		d.f.Close()
	}
	if remove {
		os.Remove(d.partial)
	}
}

// run fetches the rest of the file, retrying after a broken or stalled
// connection or a server error with a back-off, each time from the bytes
// written so far. It gives up after opts.Retries attempts in a row that
// wrote nothing.
func (d *download) run(ctx context.Context) error {
	client := d.opts.Client
	if client == nil {
		client = http.DefaultClient
	}
	buf := make([]byte, copyBuffer)
	d.report(d.off, d.size)
	failures := 0
	for {
		before := d.off
		done, err := d.attempt(ctx, client, buf)
		if done {
			return err
		}
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		if d.off > before {
			failures = 0
		}
		failures++
		if failures > d.opts.retries() {
			return err
		}
		delay := d.opts.retryDelay() << min(failures-1, 5)
		if d.opts.Retrying != nil {
			d.opts.Retrying(Retry{File: d.file.URL, Err: err, Resume: d.off, Delay: delay})
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return context.Cause(ctx)
		case <-t.C:
		}
	}
}

// errStalled cancels an attempt that received no byte for the stall
// timeout.
var errStalled = errors.New("no bytes within the stall timeout")

// attempt is one GET of the rest of the file (Range: bytes=off-). done
// reports that err is final: nil when the file is complete, or a refusal
// that trying again would not change. An attempt that receives no byte
// for the stall timeout (no answer, or a body that stops coming while the
// connection stays open) is canceled and fails with a *StallError, to be
// resumed as a broken connection is.
func (d *download) attempt(ctx context.Context, client *http.Client, buf []byte) (done bool, err error) {
	u := d.file.URL
	if d.size >= 0 && d.off == d.size {
		return true, nil
	}
	stall := d.opts.stallTimeout()
	actx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	watch := time.AfterFunc(stall, func() { cancel(errStalled) })
	defer watch.Stop()
	defer func() {
		if err != nil && ctx.Err() == nil && errors.Is(context.Cause(actx), errStalled) {
			done, err = false, fmt.Errorf("%w: %w", ErrDownload, &StallError{URL: u, Timeout: stall, At: d.off})
		}
	}()
	req, err := http.NewRequestWithContext(actx, http.MethodGet, u, nil)
	if err != nil {
		return true, fmt.Errorf("%w: %w", ErrDownload, err)
	}
	if d.token != "" {
		req.Header.Set("Authorization", "Bearer "+d.token)
	}
	if d.off > 0 {
		req.Header.Set("Range", "bytes="+strconv.FormatInt(d.off, 10)+"-")
	}
	resp, err := client.Do(req)
	if err != nil {
		return ctx.Err() != nil, fmt.Errorf("%w: GET %s: %w", ErrDownload, u, err)
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusPartialContent && d.off > 0:
		start, total, ok := contentRange(resp.Header.Get("Content-Range"))
		if !ok || start != d.off {
			return true, fmt.Errorf("%w: GET %s: asked from byte %d, got Content-Range %q", ErrDownload, u, d.off, resp.Header.Get("Content-Range"))
		}
		if total >= 0 {
			if d.size >= 0 && total != d.size {
				return true, fmt.Errorf("%w: GET %s: the file is %d bytes now, %d before", ErrDownload, u, total, d.size)
			}
			d.size = total
		}
	case resp.StatusCode == http.StatusOK:
		if d.off > 0 { // the server ignored the range: start over
			if err := d.restart(); err != nil {
				return true, err
			}
		}
		if resp.ContentLength >= 0 {
			if d.size >= 0 && resp.ContentLength != d.size {
				return true, fmt.Errorf("%w: GET %s: %d bytes, the Hub lists %d", ErrDownload, u, resp.ContentLength, d.size)
			}
			d.size = resp.ContentLength
		}
	case resp.StatusCode == http.StatusRequestedRangeNotSatisfiable && d.off > 0:
		// The partial file holds the whole file, or more than it.
		start, total, _ := contentRange(resp.Header.Get("Content-Range"))
		if start < 0 && total == d.off {
			d.size = total
			return true, nil
		}
		return false, d.restart()
	case resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden:
		return true, fmt.Errorf("%w: GET %s: %s; set HF_TOKEN for a gated or private repository", ErrGated, u, resp.Status)
	case resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusRequestTimeout:
		return false, fmt.Errorf("%w: GET %s: %s", ErrDownload, u, resp.Status)
	default:
		return true, fmt.Errorf("%w: GET %s: %s", ErrDownload, u, resp.Status)
	}
	if err := d.checkSpace(); err != nil {
		return true, err
	}
	body := io.Reader(&watchedReader{r: resp.Body, watch: watch, stall: stall})
	if d.off == 0 {
		br := bufio.NewReaderSize(body, 64<<10)
		if err := checkMagic(br, u, resp.Header.Get("Content-Type")); err != nil {
			return true, err
		}
		body = br
	}
	if done, err := d.copy(ctx, body, u); err != nil {
		return done, err
	}
	if d.size >= 0 && d.off != d.size {
		return false, fmt.Errorf("%w: GET %s: got %d of %d bytes", ErrDownload, u, d.off, d.size)
	}
	d.size = d.off
	return true, nil
}

// watchedReader re-arms an attempt's stall watch at every read that
// brings bytes.
type watchedReader struct {
	r     io.Reader
	watch *time.Timer
	stall time.Duration
}

func (w *watchedReader) Read(p []byte) (int, error) {
	n, err := w.r.Read(p)
	if n > 0 {
		w.watch.Reset(w.stall)
	}
	return n, err
}

// copyBuffers is how many buffers of copyBuffer bytes a download uses:
// while one is hashed, the next ones are read and written.
const copyBuffers = 4

// writeback is how many written bytes the kernel is asked to start
// writing to disk at a time, so that the fsync at the end has little left.
const writeback = 32 << 20

// copy writes body to the partial file. The sha256 is computed by a
// second goroutine from the same buffers, so hashing overlaps the network
// and the disk; copy returns once it has hashed every written byte.
func (d *download) copy(ctx context.Context, body io.Reader, u string) (done bool, err error) {
	free := make(chan []byte, copyBuffers)
	for range copyBuffers {
		free <- make([]byte, copyBuffer)
	}
	full := make(chan []byte, copyBuffers)
	hashed := make(chan struct{})
	go func() {
		defer close(hashed)
		for b := range full {
			d.h.Write(b)
			free <- b[:cap(b)]
		}
	}()
	defer func() {
		close(full)
		<-hashed
	}()
	synced := d.off
	for {
		buf := <-free
		n, rerr := fill(body, buf)
		if n > 0 {
			if d.size >= 0 && d.off+int64(n) > d.size {
				return true, fmt.Errorf("%w: GET %s: the server sent more than the file's %d bytes", ErrDownload, u, d.size)
			}
			if _, err := d.f.Write(buf[:n]); err != nil {
				return true, fmt.Errorf("writing %s: %w", d.partial, err)
			}
			full <- buf[:n]
			d.off += int64(n)
			if d.off-synced >= writeback {
				// Start the write-back of what is written; errors show at the fsync.
				_ = unix.SyncFileRange(int(d.f.Fd()), synced, d.off-synced, unix.SYNC_FILE_RANGE_WRITE)
				synced = d.off
			}
			d.report(d.off, d.size)
		}
		if rerr == io.EOF {
			return false, nil
		}
		if rerr != nil {
			return ctx.Err() != nil, fmt.Errorf("%w: GET %s: after %d bytes: %w", ErrDownload, u, d.off, rerr)
		}
	}
}

// fill reads into buf until it is full or r fails; unlike io.ReadFull it
// returns r's error as it is (io.EOF for the body's end, whatever ended it
// early otherwise).
func fill(r io.Reader, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		m, err := r.Read(buf[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// checkSpace refuses a download of a size first known from the server's
// answer that the disk cannot hold.
func (d *download) checkSpace() error {
	if d.file.Size >= 0 || d.size < 0 {
		return nil // checked before the download, or unknown
	}
	return checkSpace(d.opts, d.dir, d.size-d.off)
}

// checkSpace refuses need bytes in dir beyond its free space.
func checkSpace(opts *PullOptions, dir string, need int64) error {
	free := opts.FreeSpace
	if free == nil {
		free = FreeSpace
	}
	n, err := free(dir)
	if err != nil {
		return err
	}
	if need > 0 && uint64(need) > n {
		return fmt.Errorf("%w: the download needs %s, %s has %s free", ErrNoSpace, api.FormatBytes(uint64(need)), dir, api.FormatBytes(n))
	}
	return nil
}

// verify compares the sha256 of the complete file with the published one;
// a mismatch deletes the partial file.
func (d *download) verify() error {
	if d.file.SHA256 == "" {
		return nil
	}
	got := hex.EncodeToString(d.h.Sum(nil))
	if got != d.file.SHA256 {
		d.close(true)
		return fmt.Errorf("%w: %s has sha256 %s, the Hub publishes %s; the download was deleted", ErrChecksum, d.file.URL, got, d.file.SHA256)
	}
	return nil
}

// contentRange parses "bytes START-END/TOTAL" (TOTAL may be "*": -1) and
// "bytes */TOTAL" (START -1).
func contentRange(s string) (start, total int64, ok bool) {
	rest, found := strings.CutPrefix(s, "bytes ")
	if !found {
		return -1, -1, false
	}
	rng, tot, found := strings.Cut(rest, "/")
	if !found {
		return -1, -1, false
	}
	total = -1
	if tot != "*" {
		t, err := strconv.ParseInt(tot, 10, 64)
		if err != nil {
			return -1, -1, false
		}
		total = t
	}
	if rng == "*" {
		return -1, total, true
	}
	first, _, found := strings.Cut(rng, "-")
	start, err := strconv.ParseInt(first, 10, 64)
	if !found || err != nil {
		return -1, -1, false
	}
	return start, total, true
}

// checkPart checks a downloaded file with the GGUF reader: the model's
// first (or only) file must name its architecture, as llama.cpp requires.
func checkPart(path string, first bool, name string) error {
	var err error
	if first {
		_, err = Check(path)
	} else {
		_, err = gguf.Open(path)
	}
	if e, ok := errors.AsType[*gguf.Error](err); ok {
		e.Name = name // the reader names the partial file; name what was pulled
	}
	return err
}
