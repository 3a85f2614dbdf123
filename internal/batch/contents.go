package batch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/apiary-llm/apiary/internal/store"
)

// contents is where the bytes of the Batch API's files live. On SQLite,
// where one queen serves its database, in the queen's data dir (Dir), a
// file an id. On PostgreSQL, where several queens share the database and
// the one that takes over goes on with the batches of the one before, in
// the database (store.PutBatchFileContent, 1 MiB chunks), so that no
// directory has to be shared.
//
// Either way a file is first written whole to a temporary file in Dir
// (an upload, to be checked; results, a line at a time), then kept: on
// disk renamed into place before the transaction that writes its row
// (place), in the database copied into chunks by that transaction (put).
// Neither holds more than a chunk in memory.
type contents struct {
	dir  string
	st   *store.Store
	inDB bool
}

// path is where file id's bytes live on disk.
func (c contents) path(id string) string { return filepath.Join(c.dir, id+".jsonl") }

// temp is the temporary file that file id is written to before it is
// kept.
func (c contents) temp(id string) string { return c.path(id) + ".tmp" }

// place moves file id's finished temporary file into place, before the
// transaction that writes its row; in the database it does nothing (put
// does it). unplace undoes it when that transaction fails.
func (c contents) place(id string) error {
	if c.inDB {
		return nil
	}
	if err := os.Rename(c.temp(id), c.path(id)); err != nil {
		return fmt.Errorf("keep file %s: %w", id, err)
	}
	return nil
}

func (c contents) unplace(id string) {
	if !c.inDB {
		os.Remove(c.path(id))
	}
}

// put copies file id's temporary file into the database in tx, the
// transaction that writes its row; on disk it does nothing.
func (c contents) put(tx *store.Tx, id string) error {
	if !c.inDB {
		return nil
	}
	f, err := os.Open(c.temp(id))
	if err != nil {
		return fmt.Errorf("keep file %s: %w", id, err)
	}
	defer f.Close()
	_, err = tx.PutBatchFileContent(id, f)
	return err
}

// open reads file f's bytes. In the database, a file of a queen before
// the database kept them is read from the data dir, where it was left.
func (c contents) open(ctx context.Context, f store.BatchFile) (io.ReadCloser, error) {
	if c.inDB {
		if old, err := os.Open(c.path(f.ID)); err == nil {
			return old, nil
		}
		return io.NopCloser(c.st.OpenBatchFileContent(ctx, f.ID, f.Bytes)), nil
	}
	data, err := os.Open(c.path(f.ID))
	if err != nil {
		return nil, fmt.Errorf("the bytes of file %s: %w", f.ID, err)
	}
	return data, nil
}

// removed removes the bytes of file id, whose row was deleted: on disk;
// in the database they went with the row (store.DeleteBatchFile), and
// only a file of a queen before that is left in the data dir.
func (c contents) removed(id string) error {
	if err := os.Remove(c.path(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}
