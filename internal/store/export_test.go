package store

import (
	"context"
	"time"
)

// Setting reads a setting as the store's pooled connections see it.
func (s *Store) Setting(ctx context.Context, name string) (string, error) {
	var v string
	err := s.db.QueryRowContext(ctx, s.q("SELECT current_setting(?)"), name).Scan(&v)
	return v, err
}

// BlindToLease makes the store stop renewing its lease and act as if it
// held it for an hour more: a queen whose own clock misjudged, so that a
// test sees what the database's fence alone keeps out.
func (s *Store) BlindToLease() {
	s.bgCancel()
	s.bg.Wait()
	s.lease.until.Store(s.lease.now() + int64(time.Hour))
}
