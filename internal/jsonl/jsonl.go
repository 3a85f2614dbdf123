// Package jsonl reads a stream of JSON values one a line (JSON Lines) with
// a bound on each line, so that a peer cannot make the reader hold more
// than that bound: the hive's heartbeat stream and its answers.
package jsonl

import (
	"bufio"
	"errors"
	"fmt"
	"io"
)

// ErrTooLong is a line over the reader's bound; the stream cannot be read
// on after it.
var ErrTooLong = errors.New("line too long")

// Reader reads lines of at most max bytes (the newline included).
type Reader struct {
	br   *bufio.Reader
	max  int
	line []byte
}

// NewReader reads r through a buffer of size bytes; a longer line (up to
// max) is gathered in a slice the reader keeps for the next one.
func NewReader(r io.Reader, size, max int) *Reader {
	return &Reader{br: bufio.NewReaderSize(r, min(size, max)), max: max}
}

// Next returns the next line without its newline, valid until the next
// call. A stream that ends inside a line gives that line's bytes as
// io.ErrUnexpectedEOF; one that ends between lines gives io.EOF.
func (r *Reader) Next() ([]byte, error) {
	r.line = r.line[:0]
	for {
		frag, err := r.br.ReadSlice('\n')
		if len(r.line)+len(frag) > r.max {
			return nil, fmt.Errorf("%w: over %d bytes", ErrTooLong, r.max)
		}
		switch {
		case err == nil && len(r.line) == 0:
			return frag[:len(frag)-1], nil // the common case: no copy
		case err == nil:
			r.line = append(r.line, frag...)
			return r.line[:len(r.line)-1], nil
		case errors.Is(err, bufio.ErrBufferFull):
			r.line = append(r.line, frag...)
		case errors.Is(err, io.EOF) && len(r.line)+len(frag) > 0:
			return nil, io.ErrUnexpectedEOF
		default:
			return nil, err
		}
	}
}
