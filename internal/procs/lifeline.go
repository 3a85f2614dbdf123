package procs

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
)

// A lifeline is a pipe on a child's stdin whose write end only the parent
// holds: when the parent closes it, or dies (over SSH: when the session
// ends), the child reads EOF and shuts down. The parent first writes a
// preamble, lines KEY=VALUE ended by an empty line, to hand over secrets
// that must not appear on a command line.

// maxPreamble bounds a lifeline's preamble.
const maxPreamble = 64 << 10

// WritePreamble writes env (KEY=VALUE entries) and the empty line that
// ends the preamble.
func WritePreamble(w io.Writer, env []string) error {
	var b strings.Builder
	for _, kv := range env {
		if strings.ContainsAny(kv, "\r\n") || !strings.Contains(kv, "=") {
			return fmt.Errorf("lifeline preamble entry must be one KEY=VALUE line")
		}
		b.WriteString(kv)
		b.WriteByte('\n')
	}
	b.WriteByte('\n')
	if _, err := io.WriteString(w, b.String()); err != nil {
		return fmt.Errorf("write lifeline preamble: %w", err)
	}
	return nil
}

// ReadPreamble reads the preamble from r and returns its entries; keys not
// in allowed are refused. It reads byte by byte so that nothing after the
// preamble is consumed.
func ReadPreamble(r io.Reader, allowed []string) (map[string]string, error) {
	out := map[string]string{}
	var line strings.Builder
	var b [1]byte
	for total := 0; ; {
		n, err := r.Read(b[:])
		if n == 1 {
			if total++; total > maxPreamble {
				return nil, errors.New("lifeline preamble too long")
			}
			if b[0] != '\n' {
				line.WriteByte(b[0])
				continue
			}
			s := strings.TrimSuffix(line.String(), "\r")
			line.Reset()
			if s == "" {
				return out, nil
			}
			k, v, ok := strings.Cut(s, "=")
			if !ok || !slices.Contains(allowed, k) {
				return nil, fmt.Errorf("lifeline preamble: unexpected entry (want KEY=VALUE, KEY one of %v)", allowed)
			}
			out[k] = v
			continue
		}
		if errors.Is(err, io.EOF) {
			return nil, errors.New("lifeline closed before its preamble ended; the parent is gone")
		}
		if err != nil {
			return nil, fmt.Errorf("read lifeline preamble: %w", err)
		}
	}
}

// StdinLifeline turns this process's stdin into a lifeline: it reads the
// preamble and returns the rest as a reader that Close unblocks (stdin is
// switched to non-blocking mode so Go's poller owns it). SIGPIPE is
// ignored from then on: the parent's end of stdout and stderr goes away
// with the lifeline, and a log line written then must fail, not kill the
// process before it has stopped its children.
func StdinLifeline(allowed []string) (io.ReadCloser, map[string]string, error) {
	if err := syscall.SetNonblock(0, true); err != nil {
		return nil, nil, fmt.Errorf("stdin lifeline: %w", err)
	}
	f := os.NewFile(0, "lifeline")
	env, err := ReadPreamble(f, allowed)
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	signal.Ignore(syscall.SIGPIPE)
	return f, env, nil
}

// Lifeline is the parent's end of a child's lifeline.
type Lifeline struct {
	// Child is the read end, for Spec.Stdin; the parent closes its copy
	// once the child has started (CloseChildEnd).
	Child *os.File
	w     *os.File
}

// NewLifeline makes the pipe and writes the preamble (env entries).
func NewLifeline(env []string) (*Lifeline, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("lifeline pipe: %w", err)
	}
	if err := WritePreamble(w, env); err != nil {
		r.Close()
		w.Close()
		return nil, err
	}
	return &Lifeline{Child: r, w: w}, nil
}

// CloseChildEnd closes the parent's copy of the read end.
func (l *Lifeline) CloseChildEnd() { l.Child.Close() }

// stopLine is what Stop writes before it cuts the lifeline.
const stopLine = "stop\n"

// Stop asks the child to stop: it writes a stop line, then cuts the
// lifeline. A child reads the difference from a parent that died (EOF
// alone) with AwaitLifeline. It is idempotent, as Cut.
func (l *Lifeline) Stop() {
	_, _ = io.WriteString(l.w, stopLine) // a child already gone: nothing to tell
	l.Cut()
}

// AwaitLifeline reads a lifeline (after its preamble) until it ends, and
// says how: asked is true when the parent asked the child to stop
// (Lifeline.Stop), false when the lifeline just ended (the parent died,
// or cut it). What else comes on it is ignored, and only its last bytes
// kept.
func AwaitLifeline(r io.Reader) (asked bool, err error) {
	var tail []byte
	buf := make([]byte, 512)
	for {
		n, err := r.Read(buf)
		tail = append(tail, buf[:n]...)
		if len(tail) > len(stopLine) {
			tail = tail[len(tail)-len(stopLine):]
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = nil
			}
			return string(tail) == stopLine, err
		}
	}
}

// Cut closes the write end: the child reads EOF. It is idempotent.
func (l *Lifeline) Cut() {
	l.Child.Close()
	l.w.Close()
}
