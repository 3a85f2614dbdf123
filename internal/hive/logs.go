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
	"sync"

	"github.com/apiary-llm/apiary/internal/api"
)

// workerLog keeps a worker's interleaved stdout and stderr: the last
// ringSize bytes in memory (crash reports, and what a follower of the log
// reads as it grows), and everything in a file under the data dir (what a
// reader of the log's history gets, also once the registry forgot the
// worker or after a restart of the hive).
type workerLog struct {
	path string // the file; also set when it could not be created

	mu    sync.Mutex
	buf   []byte        // guarded by mu; the last size bytes written, oldest first
	size  int           // the ring's bound
	total int64         // guarded by mu; bytes written since the start
	grew  chan struct{} // guarded by mu; made by a follower (since), closed by the next write or close
	ended bool          // guarded by mu; set by close: nothing more comes
	file  *os.File      // guarded by mu; nil when it could not be created, when full, and after close
	fileN int64         // guarded by mu; bytes in the file
	// maxFile, when positive, replaces maxLogFile (tests).
	maxFile int64
}

const ringSize = 64 << 10

// maxLogFile bounds a worker's log file: a worker that logs without end
// must not fill the disk. Past it the log goes on in the ring only, and
// the file ends with a line that says so.
const maxLogFile = 64 << 20

func newWorkerLog(path string) *workerLog {
	l := &workerLog{path: path, size: ringSize}
	if f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); err == nil {
		l.file = f
		if st, err := f.Stat(); err == nil {
			l.fileN = st.Size()
		}
	}
	return l
}

// endedLog is the log of a worker that ended before (an earlier hive's,
// or one the registry no longer remembers): its file alone. It is nil when
// there is no such file.
func endedLog(path string) *workerLog {
	st, err := os.Stat(path)
	if err != nil || !st.Mode().IsRegular() {
		return nil
	}
	return &workerLog{path: path, total: st.Size(), fileN: st.Size(), ended: true}
}

// Write keeps p; it never fails, so a full disk cannot stall a worker.
func (l *workerLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.file != nil {
		if l.fileN+int64(len(p)) > l.fileMax() {
			_, _ = fmt.Fprintf(l.file, "\n[apiary: this log file reached %d bytes; the rest of the log is kept in memory only (its last %d bytes)]\n",
				l.fileN, l.size)
			l.file.Close()
			l.file = nil
		} else {
			n, _ := l.file.Write(p)
			l.fileN += int64(n)
		}
	}
	l.buf = append(l.buf, p...)
	if over := len(l.buf) - l.size; over > 0 {
		l.buf = append(l.buf[:0], l.buf[over:]...)
	}
	l.total += int64(len(p))
	l.wakeLocked()
	return len(p), nil
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
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.file != nil {
		l.file.Close()
		l.file = nil
	}
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

// snapshot is what the ring holds, how many bytes before it it lost, the
// log's length, and whether the file holds the whole log (every write,
// nothing else: then its offsets are the log's).
func (l *workerLog) snapshot() (ring []byte, lost, end int64, whole bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return bytes.Clone(l.buf), l.total - int64(len(l.buf)), l.total, l.fileN == l.total
}

// head is the end of the log up to offset end, at most max bytes, from
// its file, and whether it begins after the start of the log. It fails
// when the file is gone or shorter than end (a write to it failed): the
// caller then has the ring.
func (l *workerLog) head(end int64, max int64) ([]byte, bool, error) {
	f, err := os.Open(l.path)
	if err != nil {
		return nil, false, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, false, err
	}
	if st.Size() < end {
		return nil, false, fmt.Errorf("hive: log file %s has %d bytes, the log %d", l.path, st.Size(), end)
	}
	start := max64(0, end-max)
	b := make([]byte, end-start)
	if _, err := f.ReadAt(b, start); err != nil && !errors.Is(err, io.EOF) {
		return nil, false, err
	}
	return b, start > 0, nil
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
// ended worker's from its log, an older one's from the file it left. With
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
// does. A follower that falls more than the ring behind is told how much
// it missed.
func streamLog(ctx context.Context, w http.ResponseWriter, l *workerLog, q api.LogQuery) {
	ring, lost, end, whole := l.snapshot()
	head, cut, err := l.head(end, api.MaxLogBytes)
	if !whole || err != nil {
		head, cut = ring, lost > 0 // no file, a full one, or one that missed writes
	}
	head = lastLines(head, cut, q.Tail)
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
