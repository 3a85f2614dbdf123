package store

import "context"

// Setting reads a setting as the store's pooled connections see it.
func (s *Store) Setting(ctx context.Context, name string) (string, error) {
	var v string
	err := s.db.QueryRowContext(ctx, s.q("SELECT current_setting(?)"), name).Scan(&v)
	return v, err
}
