package hive

import (
	"bytes"
	"os"
	"sync"
)

// workerLog keeps a worker's interleaved stdout and stderr: the last
// ringSize bytes in memory for GET /v2/workers/{id}/logs and crash reports,
// and everything in a file under the data dir.
type workerLog struct {
	mu   sync.Mutex
	buf  []byte // guarded by mu; at most size bytes, oldest first
	size int
	file *os.File // nil when the file could not be created
}

const ringSize = 64 << 10

func newWorkerLog(path string) *workerLog {
	l := &workerLog{size: ringSize}
	if f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); err == nil {
		l.file = f
	}
	return l
}

// Write keeps p; it never fails, so a full disk cannot stall a worker.
func (l *workerLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.file != nil {
		_, _ = l.file.Write(p)
	}
	l.buf = append(l.buf, p...)
	if over := len(l.buf) - l.size; over > 0 {
		l.buf = append(l.buf[:0], l.buf[over:]...)
	}
	return len(p), nil
}

// Bytes is a copy of what the ring holds.
func (l *workerLog) Bytes() []byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	return bytes.Clone(l.buf)
}

// Tail is the last n lines the ring holds.
func (l *workerLog) Tail(n int) string {
	b := bytes.TrimRight(l.Bytes(), "\n")
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] == '\n' {
			n--
			if n == 0 {
				return string(b[i+1:])
			}
		}
	}
	return string(b)
}

func (l *workerLog) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.file != nil {
		l.file.Close()
		l.file = nil
	}
}
