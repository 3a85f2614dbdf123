package procs

import (
	"bytes"
	"sync"
)

// maxLine bounds an unfinished line: a child that writes without a line
// break is cut there rather than held without end.
const maxLine = 64 << 10

// Lines is an io.Writer that hands each complete line a child writes
// (without its "\n" and a trailing "\r") to its function, in order, one
// at a time; a line longer than 64 KiB is handed over in pieces. Give it
// as a child's Stdout or Stderr to read its log as it comes.
type Lines struct {
	mu   sync.Mutex
	buf  []byte // guarded by mu; an unfinished line
	line func(string)
}

// NewLines returns a Lines that calls line for each line.
func NewLines(line func(string)) *Lines { return &Lines{line: line} }

// Write never fails: a child must not stall on its parent's reading.
func (l *Lines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf = append(l.buf, p...)
	for {
		i := bytes.IndexByte(l.buf, '\n')
		if i < 0 {
			break
		}
		line := string(bytes.TrimRight(l.buf[:i], "\r"))
		l.buf = l.buf[i+1:]
		l.line(line)
	}
	if len(l.buf) > maxLine {
		l.line(string(l.buf))
		l.buf = l.buf[:0]
	}
	return len(p), nil
}
