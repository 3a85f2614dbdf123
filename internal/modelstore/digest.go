package modelstore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"sync"
	"time"
)

// Digests knows the sha256 of model files: what Ollama's clients list as
// a model's digest ("sha256:…"). Hashing a model reads all of it (seconds
// for gigabytes), so Lookup never waits: it answers what is known and
// queues the rest, which Run hashes one file at a time. A digest is kept
// by path with the size and modification time it was taken at; a file
// that changes is hashed again. Bounded by the files looked up: Forget
// drops those no longer listed.
type Digests struct {
	mu     sync.Mutex
	known  map[string]digest // guarded by mu; by path
	queued map[string]bool   // guarded by mu; paths Run has yet to hash
	wake   chan struct{}
	// inlineMax is InlineDigestMax (0 in tests: every file is queued).
	inlineMax int64
}

type digest struct {
	size  int64
	mtime time.Time
	sum   string // "sha256:<hex>"
}

// NewDigests returns an empty set; Run hashes what Lookup queues.
func NewDigests() *Digests {
	return &Digests{known: map[string]digest{}, queued: map[string]bool{}, wake: make(chan struct{}, 1), inlineMax: InlineDigestMax}
}

// InlineDigestMax is the largest model Lookup hashes itself rather than
// queue for Run: a few milliseconds of reading.
const InlineDigestMax = 16 << 20

// Lookup returns m's digest ("sha256:<hex>" of its bytes; of all its
// parts in order for a split model), or "" while it is not known yet (it
// is queued for Run then). A model of at most InlineDigestMax bytes is
// hashed at once.
func (d *Digests) Lookup(m Model) string {
	d.mu.Lock()
	if k, ok := d.known[m.Path]; ok && k.size == m.Size && k.mtime.Equal(m.ModTime) {
		d.mu.Unlock()
		return k.sum
	}
	d.mu.Unlock()
	if m.Size > 0 && m.Size <= d.inlineMax {
		if dg, err := hashModel(context.Background(), m.Path); err == nil && dg.size == m.Size && dg.mtime.Equal(m.ModTime) {
			d.mu.Lock()
			d.known[m.Path] = dg
			d.mu.Unlock()
			return dg.sum
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.queued[m.Path] {
		d.queued[m.Path] = true
		select {
		case d.wake <- struct{}{}:
		default:
		}
	}
	return ""
}

// Forget drops every path but those of models (the files listed now).
func (d *Digests) Forget(models []Model) {
	keep := map[string]bool{}
	for _, m := range models {
		keep[m.Path] = true
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for p := range d.known {
		if !keep[p] {
			delete(d.known, p)
		}
	}
	for p := range d.queued {
		if !keep[p] {
			delete(d.queued, p)
		}
	}
}

// Run hashes the queued files, one at a time, until ctx ends. A file
// that cannot be read is left out (listed without a digest) until it is
// looked up again.
func (d *Digests) Run(ctx context.Context) {
	for {
		d.mu.Lock()
		var path string
		for p := range d.queued {
			path = p
			break
		}
		d.mu.Unlock()
		if path == "" {
			select {
			case <-ctx.Done():
				return
			case <-d.wake:
				continue
			}
		}
		dg, err := hashModel(ctx, path)
		d.mu.Lock()
		if d.queued[path] {
			delete(d.queued, path)
			if err == nil {
				d.known[path] = dg
			}
		}
		d.mu.Unlock()
		if ctx.Err() != nil {
			return
		}
	}
}

// hashModel is the digest of the model whose (first) file is path: the
// size and modification time of that file as it was before the read.
func hashModel(ctx context.Context, path string) (digest, error) {
	st, err := os.Stat(path)
	if err != nil {
		return digest{}, err
	}
	paths := append([]string{path}, laterParts(path)...)
	h := sha256.New()
	var size int64
	for _, p := range paths {
		n, err := hashFile(ctx, h, p)
		if err != nil {
			return digest{}, err
		}
		size += n
	}
	return digest{size: size, mtime: st.ModTime(), sum: "sha256:" + hex.EncodeToString(h.Sum(nil))}, nil
}

// hashFile adds the bytes of path to h, a MiB at a time, stopping when ctx
// ends.
func hashFile(ctx context.Context, h io.Writer, path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	var n int64
	for {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		k, err := f.Read(buf)
		h.Write(buf[:k])
		n += int64(k)
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}
