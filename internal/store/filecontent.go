package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
)

// FileChunkBytes is the most bytes of a file one row of batch_file_chunks
// holds: writing or reading a file holds one chunk in memory, whatever
// the file's size.
const FileChunkBytes = 1 << 20

// PutBatchFileContent writes r's bytes, to its end, as the content of
// file id in chunks of FileChunkBytes, after removing any content id had
// (a finalize cut short writes the same file again), and returns how many
// bytes it wrote. It holds one chunk in memory. The file's row is the
// caller's (PutBatchFile), in the same transaction.
func (t *Tx) PutBatchFileContent(id string, r io.Reader) (int64, error) {
	if _, err := t.exec("DELETE FROM batch_file_chunks WHERE file_id = ?", id); err != nil {
		return 0, fmt.Errorf("replace the content of file %s: %w", id, err)
	}
	stmt, err := t.prepare("INSERT INTO batch_file_chunks (file_id, seq, data) VALUES (?, ?, ?)")
	if err != nil {
		return 0, fmt.Errorf("write the content of file %s: %w", id, err)
	}
	defer stmt.Close()
	buf := make([]byte, FileChunkBytes)
	var total int64
	for seq := 0; ; seq++ {
		n, rerr := io.ReadFull(r, buf)
		if n > 0 {
			if _, err := stmt.ExecContext(t.ctx, id, seq, buf[:n]); err != nil {
				return total, fmt.Errorf("write chunk %d of file %s: %w", seq, id, err)
			}
			total += int64(n)
		}
		switch {
		case rerr == nil:
		case errors.Is(rerr, io.EOF), errors.Is(rerr, io.ErrUnexpectedEOF):
			return total, nil
		default:
			return total, fmt.Errorf("read the content of file %s: %w", id, rerr)
		}
	}
}

// batchFileChunk reads chunk seq of file id; ErrNotFound when it has none.
func (t *Tx) batchFileChunk(id string, seq int) ([]byte, error) {
	var data []byte
	err := t.queryRow("SELECT data FROM batch_file_chunks WHERE file_id = ? AND seq = ?", id, seq).Scan(&data)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("%w: chunk %d of file %s", ErrNotFound, seq, id)
	}
	if err != nil {
		return nil, fmt.Errorf("read chunk %d of file %s: %w", seq, id, err)
	}
	return data, nil
}

// OpenBatchFileContent reads the size bytes of file id's content (written
// by PutBatchFileContent) a chunk at a time, each chunk in a read
// transaction of its own: no transaction stays open while the reader's
// caller writes what it read (to a client, to the jobs' rows). A chunk
// missing before size bytes were read (the file was deleted meanwhile) is
// an error wrapping ErrNotFound.
func (s *Store) OpenBatchFileContent(ctx context.Context, id string, size int64) io.Reader {
	return &fileContent{ctx: ctx, s: s, id: id, left: size}
}

// fileContent is OpenBatchFileContent's reader.
type fileContent struct {
	ctx  context.Context
	s    *Store
	id   string
	seq  int
	left int64  // bytes of the file not yet returned
	buf  []byte // the rest of the chunk read last
}

func (f *fileContent) Read(p []byte) (int, error) {
	if len(f.buf) == 0 {
		if f.left <= 0 {
			return 0, io.EOF
		}
		err := f.s.View(f.ctx, func(tx *Tx) (err error) {
			f.buf, err = tx.batchFileChunk(f.id, f.seq)
			return err
		})
		if err != nil {
			return 0, fmt.Errorf("the content of file %s: %w", f.id, err)
		}
		if len(f.buf) == 0 || int64(len(f.buf)) > f.left {
			return 0, fmt.Errorf("the content of file %s: chunk %d has %d bytes, %d were left to read", f.id, f.seq, len(f.buf), f.left)
		}
		f.seq++
	}
	n := copy(p, f.buf)
	f.buf = f.buf[n:]
	f.left -= int64(n)
	return n, nil
}
