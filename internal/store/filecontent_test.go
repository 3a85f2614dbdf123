package store_test

import (
	"bytes"
	"errors"
	"io"
	"testing"
	"testing/iotest"

	"github.com/apiary-llm/apiary/internal/store"
)

// content is n bytes that differ from chunk to chunk and within one, so a
// chunk read twice, skipped or out of order shows.
func content(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i/store.FileChunkBytes)
	}
	return b
}

// A file of several chunks (the last one short) is written in one
// transaction with its row, read back whole a chunk at a time, written
// again in place (as a finalize cut short does), and removed with its row.
func TestBatchFileContentRoundTrip(t *testing.T) {
	eachBackend(t, func(t *testing.T, cfg store.Config) {
		s := open(t, cfg)
		ctx := t.Context()
		want := content(2*store.FileChunkBytes + 12345)
		f := store.BatchFile{ID: "file-1", Purpose: "batch", Filename: "in.jsonl", Bytes: int64(len(want)), CreatedAt: at(1)}
		put := func(data []byte) {
			t.Helper()
			err := s.Update(ctx, func(tx *store.Tx) error {
				if err := tx.DeleteBatchFile(f.ID); err != nil && !errors.Is(err, store.ErrNotFound) {
					return err
				}
				if err := tx.PutBatchFile(f); err != nil {
					return err
				}
				// One byte a Read: chunks are whole however the source
				// hands its bytes out.
				n, err := tx.PutBatchFileContent(f.ID, iotest.OneByteReader(bytes.NewReader(data)))
				if err == nil && n != int64(len(data)) {
					t.Errorf("PutBatchFileContent wrote %d bytes of %d", n, len(data))
				}
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
		}
		put(want)
		got, err := io.ReadAll(s.OpenBatchFileContent(ctx, f.ID, f.Bytes))
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("read back %d bytes (equal: %v), %v; want %d", len(got), bytes.Equal(got, want), err, len(want))
		}
		if err := iotest.TestReader(s.OpenBatchFileContent(ctx, f.ID, f.Bytes), want); err != nil {
			t.Fatal(err)
		}

		again := content(store.FileChunkBytes + 1)[1:] // shorter: no chunk of the first may stay
		f.Bytes = int64(len(again))
		put(again)
		if got, err := io.ReadAll(s.OpenBatchFileContent(ctx, f.ID, f.Bytes)); err != nil || !bytes.Equal(got, again) {
			t.Fatalf("read back the file written again: %d bytes, %v; want %d", len(got), err, len(again))
		}

		if err := s.Update(ctx, func(tx *store.Tx) error { return tx.DeleteBatchFile(f.ID) }); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadAll(s.OpenBatchFileContent(ctx, f.ID, f.Bytes)); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("read after the delete: got %v, want ErrNotFound", err)
		}
		// The row went with its chunks: a new file of the same id starts
		// empty.
		f.Bytes = 0
		put(nil)
		if got, err := io.ReadAll(s.OpenBatchFileContent(ctx, f.ID, 0)); err != nil || len(got) != 0 {
			t.Fatalf("empty file: %d bytes, %v", len(got), err)
		}
	})
}

// A queen that lost the database cannot write one chunk of a file: the
// content is fenced like every other write.
func TestPostgresBatchFileContentIsFenced(t *testing.T) {
	u := newPG(t)
	db := admin(t, u)
	a := open(t, shortLease(u))
	a.BlindToLease()
	terminate(t, db, lockHolder(t, db))
	takeOver(t, u)
	err := a.Update(t.Context(), func(tx *store.Tx) error {
		_, err := tx.PutBatchFileContent("file-old", bytes.NewReader(content(100)))
		return err
	})
	if !errors.Is(err, store.ErrLockLost) {
		t.Fatalf("content written by the queen that lost the lock: got %v, want ErrLockLost", err)
	}
	var n int
	if err := db.QueryRowContext(t.Context(), "SELECT count(*) FROM batch_file_chunks").Scan(&n); err != nil || n != 0 {
		t.Errorf("chunks of the fenced queen in the table: %d, %v", n, err)
	}
}
