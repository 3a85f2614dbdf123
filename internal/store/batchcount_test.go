package store_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/store"
)

// Two transactions that each lock the batches' count, add a batch and
// count: the second counts the first's batch, because it runs after the
// first has committed. (On PostgreSQL, without the lock, the second
// counted only its own batch while the first was still open, and both
// could take a bound's last place.)
func TestLockBatchCountSerializesCreations(t *testing.T) {
	eachBackend(t, func(t *testing.T, cfg store.Config) {
		s := open(t, cfg)
		now := time.Now()
		if err := s.Update(t.Context(), func(tx *store.Tx) error {
			return tx.PutBatchFile(store.BatchFile{ID: "file-1", Purpose: "batch", Filename: "in.jsonl", Bytes: 1, CreatedAt: now})
		}); err != nil {
			t.Fatal(err)
		}
		create := func(id string, added chan<- struct{}, hold <-chan struct{}) (int, error) {
			var n int
			err := s.Update(t.Context(), func(tx *store.Tx) error {
				if err := tx.LockBatchCount(); err != nil {
					return err
				}
				if err := tx.PutBatch(store.Batch{ID: id, Endpoint: "/v1/chat/completions", InputFileID: "file-1",
					CompletionWindow: "24h", Status: "validating", CreatedAt: now, ExpiresAt: now.Add(time.Hour)}); err != nil {
					return err
				}
				if added != nil {
					close(added)
				}
				if hold != nil {
					<-hold
				}
				var err error
				n, err = tx.CountBatches("validating")
				return err
			})
			return n, err
		}
		added, hold := make(chan struct{}), make(chan struct{})
		first := make(chan error, 1)
		go func() {
			n, err := create("batch-1", added, hold)
			if err == nil && n != 1 {
				err = fmt.Errorf("the first counted %d", n)
			}
			first <- err
		}()
		<-added
		second := make(chan int, 1)
		secondErr := make(chan error, 1)
		go func() {
			n, err := create("batch-2", nil, nil)
			second <- n
			secondErr <- err
		}()
		// The second runs up to its lock (or, without one, to its end)
		// while the first holds its transaction open; what it counts is
		// the check, not how long anything took.
		time.Sleep(100 * time.Millisecond)
		close(hold)
		if err := <-first; err != nil {
			t.Fatal(err)
		}
		if n, err := <-second, <-secondErr; err != nil || n != 2 {
			t.Errorf("the second creation counted %d batches (err %v), want 2: it ran beside the first", n, err)
		}
	})
}
