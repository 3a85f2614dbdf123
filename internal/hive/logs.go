package hive

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"

	"github.com/apiary-llm/apiary/internal/api"
)

// workerLog keeps a worker's interleaved stdout and stderr: the last
// ringSize bytes in memory (crash reports, and what a follower of the log
// reads as it grows), and its most recent output on disk, in its file
// <id>.log under the data dir and the one before it, <id>.log.1 (what a
// reader of the log's history gets, also once the registry forgot the
// worker or after a restart of the hive).
//
// A file holds at most maxLogFile bytes of the log: a write that would
// take it past that renames it to <id>.log.1 (the older <id>.log.1 and
// what it held are dropped) and starts a new <id>.log, whose first line,
// a header, says at which byte of the log it starts. So a worker's log
// takes at most about 2 × maxLogFile on disk, and once rotated its files
// hold at least its last maxLogFile bytes less one write. (A single write
// larger than maxLogFile gets a file to itself; the worker's output comes
// in writes of at most 32 KiB.) When the files cannot be written, the log
// goes on in the ring only.
type workerLog struct {
	path string // the current file; also set when it could not be created

	// wmu serializes the writers and is held across their file I/O; no
	// reader takes it, so a slow disk never holds a reader up.
	wmu   sync.Mutex
	file  *os.File // guarded by wmu; nil when it could not be created, after a failed rotation, and after close
	fileN int64    // guarded by wmu; log bytes in file (its header not counted)
	// maxFile, when positive, replaces maxLogFile (tests).
	maxFile int64

	mu    sync.Mutex    // what readers see; never held across I/O
	buf   []byte        // guarded by mu; the last size bytes written, oldest first
	size  int           // the ring's bound
	total int64         // guarded by mu; bytes written since the start
	grew  chan struct{} // guarded by mu; made by a follower (since), closed by the next write or close
	ended bool          // guarded by mu; set by close: nothing more comes
	// gen counts the rotations' starts and ends: odd while the files are
	// being renamed. A reader that opened the files under an even gen it
	// still sees after has the files its segments describe.
	gen  uint64  // guarded by mu
	cur  segment // guarded by mu; the current file <id>.log
	prev segment // guarded by mu; the rotated file <id>.log.1
}

// segment is the part of the log one file holds: bytes from to to of the
// log, after hdr bytes of header. ok is false when the file does not
// hold them (it was not made, or a write to it failed).
type segment struct {
	path          string
	from, to, hdr int64
	ok            bool
}

const ringSize = 64 << 10

// maxLogFile bounds each of a worker's two log files: a worker that logs
// without end must not fill the disk, and its most recent output must
// stay. Past it the file is rotated (see workerLog).
const maxLogFile = 32 << 20

// rotatedHeader begins a file started by a rotation; %s is the file's
// name, %d the log's byte at which the file starts.
const rotatedHeader = "[apiary: this file continues %s.1; it starts at byte %d of the log]\n"

var rotatedHeaderRE = regexp.MustCompile(`^\[apiary: this file continues \S+\.1; it starts at byte (\d+) of the log\]\n`)

// errRotated: the files were rotated while a reader opened them.
var errRotated = errors.New("the log files were rotated while being read")

func newWorkerLog(path string) *workerLog {
	l := &workerLog{path: path, size: ringSize, cur: segment{path: path}, prev: segment{path: path + ".1"}}
	if f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); err == nil {
		l.file = f
		if st, err := f.Stat(); err == nil {
			l.fileN = st.Size()
			l.cur.ok = st.Size() == 0 // a file that held something is not this log's
		}
	}
	return l
}

// endedLog is the log of a worker that ended before (an earlier hive's,
// or one the registry no longer remembers): its files alone. It is nil
// when there is no such file.
func endedLog(path string) *workerLog {
	cur, err := fileSegment(path)
	prev, perr := fileSegment(path + ".1")
	switch {
	case err != nil && perr != nil:
		return nil
	case err != nil: // a rotation did not make the new file
		cur, prev = prev, segment{}
	}
	return &workerLog{path: path, total: cur.to, cur: cur, prev: prev, ended: true}
}

// fileSegment is what the log file at path holds: the log from the byte
// its header names (a file without one starts the log) to its end.
func fileSegment(path string) (segment, error) {
	if st, err := os.Stat(path); err != nil || !st.Mode().IsRegular() {
		return segment{}, fmt.Errorf("%s is not a log file (%v)", path, err) // opening a FIFO would block
	}
	f, err := os.Open(path)
	if err != nil {
		return segment{}, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return segment{}, err
	}
	s := segment{path: path, to: st.Size(), ok: true}
	first := make([]byte, 256)
	n, _ := f.ReadAt(first, 0)
	if m := rotatedHeaderRE.FindSubmatch(first[:n]); m != nil {
		from, err := strconv.ParseInt(string(m[1]), 10, 64)
		if err == nil {
			s.from, s.hdr = from, int64(len(m[0]))
			s.to = from + st.Size() - s.hdr
		}
	}
	return s, nil
}

// Write keeps p; it never fails, so a full disk cannot stall a worker.
func (l *workerLog) Write(p []byte) (int, error) {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	if l.file != nil && l.fileN > 0 && l.fileN+int64(len(p)) > l.fileMax() {
		l.rotateW()
	}
	whole := false // the file got p
	if l.file != nil {
		n, err := l.file.Write(p)
		l.fileN += int64(n)
		whole = err == nil && n == len(p)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf = append(l.buf, p...)
	if over := len(l.buf) - l.size; over > 0 {
		l.buf = append(l.buf[:0], l.buf[over:]...)
	}
	l.total += int64(len(p))
	l.cur.to = l.total
	l.cur.ok = l.cur.ok && whole
	l.wakeLocked()
	return len(p), nil
}

// rotateW renames the current file to <path>.1, over the older one, and
// starts a new one with its header. When that fails the log goes on in
// the ring only. wmu is held.
func (l *workerLog) rotateW() {
	l.mu.Lock()
	l.gen++ // odd: readers leave the files alone
	from := l.total
	l.mu.Unlock()

	l.file.Close()
	l.file = nil
	hdr := fmt.Sprintf(rotatedHeader, filepath.Base(l.path), from)
	err := os.Rename(l.path, l.path+".1")
	var f *os.File
	if err == nil {
		f, err = os.OpenFile(l.path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	}
	if err == nil {
		if _, err = io.WriteString(f, hdr); err != nil {
			f.Close()
		}
	}

	l.mu.Lock()
	defer l.mu.Unlock()
	l.gen++
	if err != nil {
		l.cur.ok = false
		return
	}
	l.file, l.fileN = f, 0
	l.prev = l.cur
	l.prev.path = l.path + ".1"
	l.cur = segment{path: l.path, from: from, to: from, hdr: int64(len(hdr)), ok: true}
}

// fileMax is maxLogFile, or the test's bound.
func (l *workerLog) fileMax() int64 {
	if l.maxFile > 0 {
		return l.maxFile
	}
	return maxLogFile
}

// wakeLocked tells the followers waiting that the log changed.
func (l *workerLog) wakeLocked() {
	if l.grew != nil {
		close(l.grew)
		l.grew = nil
	}
}

// Bytes is a copy of what the ring holds.
func (l *workerLog) Bytes() []byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	return bytes.Clone(l.buf)
}

// Tail is the last n lines the ring holds.
func (l *workerLog) Tail(n int) string {
	return string(lastLines(bytes.TrimRight(l.Bytes(), "\n"), false, n))
}

// close ends the log: its file is closed and followers finish. It is
// called once the worker's output is gone (its process group ended).
func (l *workerLog) close() {
	l.wmu.Lock()
	if l.file != nil {
		l.file.Close()
		l.file = nil
	}
	l.wmu.Unlock()
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.ended {
		l.ended = true
		l.wakeLocked()
	}
}

// since is what was written from offset pos on: the part the ring still
// holds, how many bytes after pos the ring lost before it, the offset
// after it, a channel closed at the next write (or at the end), and
// whether the log has ended (then nothing follows data).
func (l *workerLog) since(pos int64) (data []byte, lost, next int64, grew <-chan struct{}, ended bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	first := l.total - int64(len(l.buf)) // offset of the ring's first byte
	if pos < first {
		lost, pos = first-pos, first
	}
	if pos < l.total {
		data = bytes.Clone(l.buf[pos-first:])
	}
	if l.grew == nil {
		l.grew = make(chan struct{})
	}
	return data, lost, l.total, l.grew, l.ended
}

// logView is what a reader saw of a log at one moment.
type logView struct {
	ring      []byte
	end       int64  // the log's length
	gen       uint64 // the files' generation (workerLog.gen)
	cur, prev segment
}

func (l *workerLog) view() logView {
	l.mu.Lock()
	defer l.mu.Unlock()
	return logView{ring: bytes.Clone(l.buf), end: l.total, gen: l.gen, cur: l.cur, prev: l.prev}
}

// ringFrom is the offset of the ring's first byte.
func (v logView) ringFrom() int64 { return v.end - int64(len(v.ring)) }

// diskFrom is the offset of the first byte the files hold, and false when
// they do not hold the log up to its end (a write failed, or they are
// being rotated).
func (v logView) diskFrom() (int64, bool) {
	if !v.cur.ok || v.cur.to != v.end || v.gen%2 == 1 {
		return 0, false
	}
	if v.prev.ok && v.prev.to == v.cur.from {
		return v.prev.from, true
	}
	return v.cur.from, true
}

// readFiles is the log from offset from (at least v's diskFrom) to v.end,
// read from the files. It fails with errRotated when they were rotated
// after v was taken, or when a file is shorter than v says.
func (l *workerLog) readFiles(v logView, from int64) ([]byte, error) {
	var files []*os.File
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	segs := []segment{v.cur}
	if from < v.cur.from {
		segs = []segment{v.prev, v.cur}
	}
	for _, s := range segs {
		f, err := os.Open(s.path)
		if err != nil {
			return nil, err
		}
		files = append(files, f)
	}
	l.mu.Lock()
	same := l.gen == v.gen
	l.mu.Unlock()
	if !same {
		return nil, errRotated
	}
	// The files opened are those of v's segments; a rotation from now on
	// renames them, which their open descriptors do not see.
	b := make([]byte, 0, v.end-from)
	for i, s := range segs {
		lo, hi := max64(from, s.from), s.to
		if hi <= lo {
			continue
		}
		part := make([]byte, hi-lo)
		if n, err := files[i].ReadAt(part, s.hdr+lo-s.from); n < len(part) {
			return nil, fmt.Errorf("log file %s: %w", s.path, err) // io.EOF: shorter than the log it held
		}
		b = append(b, part...)
	}
	return b, nil
}

// head is the end of the log, at most max bytes, from its files, or from
// the ring when they hold less of it (or cannot be read), and the log's
// length. When the hive still has more of the log than max, b begins at
// the start of a line; otherwise b is all it has, and dropped is how many
// bytes before it it no longer has.
func (l *workerLog) head(max int64) (b []byte, dropped, end int64) {
	for range 3 { // the files were rotated while being opened: again
		v := l.view()
		df, ok := v.diskFrom()
		if !ok || df > v.ringFrom() {
			break
		}
		from := df
		if v.end-max > df {
			from = v.end - max - 1 // and the byte before, to see if a line starts
		}
		b, err := l.readFiles(v, from)
		if errors.Is(err, errRotated) {
			continue
		}
		if err != nil {
			break
		}
		if from > df {
			return lastLines(b, true, 0), 0, v.end
		}
		return b, df, v.end
	}
	v := l.view()
	return v.ring, v.ringFrom(), v.end
}

func max64(a, b int64) int64 {
	if a > b {
		return a
	}
	return b
}

// lastLines is b without a first line cut in the middle (when cut), and of
// the rest the last n lines (all when n <= 0); an unfinished last line
// counts as one.
func lastLines(b []byte, cut bool, n int) []byte {
	if cut {
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		} else {
			b = nil
		}
	}
	if n <= 0 {
		return b
	}
	end := len(b)
	if end > 0 && b[end-1] == '\n' {
		end-- // the last line's own newline
	}
	for i := end - 1; i >= 0; i-- {
		if b[i] == '\n' {
			n--
			if n == 0 {
				return b[i+1:]
			}
		}
	}
	return b
}

// getWorkerLogs serves a worker's log (api.LogQuery): a live or recently
// ended worker's from its log, an older one's from the files it left. With
// follow it streams what the worker writes until the worker ends or the
// client goes away.
func (h *Hive) getWorkerLogs(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	q, err := api.ParseLogQuery(r.URL.Query().Get("tail"), r.URL.Query().Get("follow"))
	if err != nil {
		return err
	}
	var l *workerLog
	if wk, ok := h.reg.get(id, true); ok {
		l = wk.out
	} else if api.CheckID("worker_id", id) == nil {
		l = endedLog(filepath.Join(h.data.logsDir(), id+".log"))
	}
	if l == nil {
		return fmt.Errorf("%w: %s (and no log file of it in %s)", ErrWorkerNotFound, id, h.data.logsDir())
	}
	streamLog(r.Context(), w, l, q)
	return nil
}

// streamLog writes the end of l as q asks (bounded by api.MaxLogBytes and
// api.MaxLogTail), then with q.Follow what l gets until it ends or ctx
// does. An answer that reaches back to the oldest byte the hive still has
// of a log that lost older ones (rotated out of its files, or out of the
// ring) begins with a line that says how many. A follower that falls more
// than the ring behind is told how much it missed.
func streamLog(ctx context.Context, w http.ResponseWriter, l *workerLog, q api.LogQuery) {
	all, dropped, end := l.head(api.MaxLogBytes)
	head := lastLines(all, false, q.Tail)
	if dropped > 0 && len(head) == len(all) {
		// The answer goes back as far as the hive keeps: say what it lost.
		head = append(fmt.Appendf(nil, "[apiary: the first %d bytes of this log are no longer kept]\n", dropped), head...)
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	if _, err := w.Write(head); err != nil {
		return
	}
	if !q.Follow {
		if len(head) > 0 && head[len(head)-1] != '\n' {
			_, _ = io.WriteString(w, "\n")
		}
		return
	}
	rc := http.NewResponseController(w)
	pos := end
	for {
		data, lost, next, grew, ended := l.since(pos)
		if lost > 0 {
			if _, err := fmt.Fprintf(w, "\n[apiary: %d bytes of output skipped: this reader fell behind]\n", lost); err != nil {
				return
			}
		}
		if _, err := w.Write(data); err != nil {
			return
		}
		if err := rc.Flush(); err != nil {
			return
		}
		pos = next
		if ended {
			return
		}
		select {
		case <-grew:
		case <-ctx.Done():
			return
		}
	}
}
