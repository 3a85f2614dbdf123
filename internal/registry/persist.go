package registry

import (
	"context"

	"github.com/apiary-llm/apiary/internal/store"
)

// Store is what the registry needs from the database. Each method is one
// transaction.
type Store interface {
	// LoadPools reads every pool.
	LoadPools(ctx context.Context) ([]store.Pool, error)
	// SavePool writes p whole, with its audit entries.
	SavePool(ctx context.Context, p store.Pool, audit ...store.AuditEntry) error
	// RemovePool deletes the pool id (gone already is not an error), with
	// its audit entry.
	RemovePool(ctx context.Context, id string, audit store.AuditEntry) error
	// SaveBeats records the latest heartbeat of each pool (time, GPUs,
	// workers) and leaves registration and status alone; pools that no
	// longer exist are skipped. audit are entries whose first write failed.
	SaveBeats(ctx context.Context, beats []store.Pool, audit []store.AuditEntry) error
}

// SQLStore is the registry's Store on a *store.Store.
func SQLStore(s *store.Store) Store { return sqlStore{s} }

type sqlStore struct{ s *store.Store }

func (s sqlStore) LoadPools(ctx context.Context) (ps []store.Pool, err error) {
	err = s.s.View(ctx, func(tx *store.Tx) error {
		ps, err = tx.Pools()
		return err
	})
	return ps, err
}

func (s sqlStore) SavePool(ctx context.Context, p store.Pool, audit ...store.AuditEntry) error {
	return s.s.Update(ctx, func(tx *store.Tx) error {
		if err := tx.PutPool(p); err != nil {
			return err
		}
		for _, e := range audit {
			if _, err := tx.Append(e); err != nil {
				return err
			}
		}
		return nil
	})
}

func (s sqlStore) RemovePool(ctx context.Context, id string, audit store.AuditEntry) error {
	return s.s.Update(ctx, func(tx *store.Tx) error {
		if err := tx.DeletePool(id); err != nil && !isNotFound(err) {
			return err
		}
		_, err := tx.Append(audit)
		return err
	})
}

func (s sqlStore) SaveBeats(ctx context.Context, beats []store.Pool, audit []store.AuditEntry) error {
	return s.s.Update(ctx, func(tx *store.Tx) error {
		if err := tx.TouchPools(beats); err != nil {
			return err
		}
		for _, e := range audit {
			if _, err := tx.Append(e); err != nil {
				return err
			}
		}
		return nil
	})
}
