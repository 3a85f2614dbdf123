package localnode

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/virtual-kubelet/virtual-kubelet/node/api"
)

// openLog opens a container log for reading with opts: tail (last lines),
// limitBytes, and follow (keep reading until done is closed). Timestamps,
// since and previous are not kept by the stand-in node and are ignored.
func openLog(ctx context.Context, path string, done <-chan struct{}, opts api.ContainerLogOpts) (io.ReadCloser, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return io.NopCloser(bytes.NewReader(nil)), nil // not started yet: no output
	}
	if err != nil {
		return nil, fmt.Errorf("open the container log: %w", err)
	}
	if opts.Tail > 0 {
		off, err := tailOffset(f, opts.Tail)
		if err == nil {
			_, err = f.Seek(off, io.SeekStart)
		}
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("read the container log: %w", err)
		}
	}
	var rd io.Reader = f
	if opts.Follow {
		rd = &followReader{ctx: ctx, f: f, done: done}
	}
	if opts.LimitBytes > 0 {
		rd = io.LimitReader(rd, int64(opts.LimitBytes))
	}
	return struct {
		io.Reader
		io.Closer
	}{rd, f}, nil
}

// tailOffset is where the last n lines of f begin.
func tailOffset(f *os.File, n int) (int64, error) {
	b, err := io.ReadAll(f)
	if err != nil {
		return 0, err
	}
	end := len(b)
	if end > 0 && b[end-1] == '\n' {
		end--
	}
	for i := end - 1; i >= 0; i-- {
		if b[i] == '\n' {
			if n--; n == 0 {
				return int64(i + 1), nil
			}
		}
	}
	return 0, nil
}

// followReader reads a growing file until the process writing it is gone.
type followReader struct {
	ctx  context.Context
	f    *os.File
	done <-chan struct{}
}

func (r *followReader) Read(p []byte) (int, error) {
	for {
		n, err := r.f.Read(p)
		if n > 0 || !errors.Is(err, io.EOF) {
			return n, err
		}
		select {
		case <-r.done:
			return r.f.Read(p) // what was written last, then EOF
		case <-r.ctx.Done():
			return 0, io.EOF
		case <-time.After(200 * time.Millisecond):
		}
	}
}
