package store_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/lifecycle"
	"github.com/apiary-llm/apiary/internal/store"
)

// BenchmarkFlush10000 is one flush of the queen's heartbeat data at
// 10,000 pools on SQLite: the pools' last heartbeat, devices and workers
// (TouchPools) and their rows' last heartbeat (TouchRows), one
// transaction each.
//
//	go test -run '^$' -bench Flush10000 -benchmem ./internal/store/
func BenchmarkFlush10000(b *testing.B) {
	const n = 10000
	ctx := context.Background()
	s, err := store.Open(ctx, store.Config{Path: filepath.Join(b.TempDir(), store.SQLiteFile)})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	gpus := []byte(`[{"id":0,"kind":"cuda","name":"sim","total_bytes":25769803776,"free_bytes":12884901888,"workers":[]}]`)
	workers := []byte(`[{"worker_id":"w-1","lifecycle_id":"wk-0000000000000001","model_ref":"m1","status":"ready"}]`)
	pools := make([]store.Pool, n)
	beats := make(map[string]time.Time, n)
	err = s.Update(ctx, func(tx *store.Tx) error {
		for i := range n {
			id := fmt.Sprintf("pool-%05d", i)
			pools[i] = store.Pool{ID: id, Endpoint: "http://127.0.0.1:1", Status: "healthy", RegisteredAt: time.Now(), StatusChangedAt: time.Now(), GPUs: gpus, Workers: workers}
			if err := tx.PutPool(pools[i]); err != nil {
				return err
			}
			row := store.Row{ID: fmt.Sprintf("wk-%016x", i), PoolID: id, ModelRef: "m1", Status: lifecycle.StatusRunning, CreatedAt: time.Now()}
			if err := tx.InsertRow(row); err != nil {
				return err
			}
			beats[row.ID] = time.Now()
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("pools", func(b *testing.B) {
		for b.Loop() {
			now := time.Now()
			for i := range pools {
				pools[i].LastHeartbeatAt = &now
			}
			if err := s.Update(ctx, func(tx *store.Tx) error { return tx.TouchPools(pools) }); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("rows", func(b *testing.B) {
		for b.Loop() {
			if err := s.Update(ctx, func(tx *store.Tx) error { return tx.TouchRows(beats) }); err != nil {
				b.Fatal(err)
			}
		}
	})
}
