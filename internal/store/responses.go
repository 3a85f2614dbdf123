package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// StoredResponse is one kept answer of the Responses API.
type StoredResponse struct {
	ID        string
	CreatedAt time.Time
	Response  []byte // the response object, JSON
	Messages  []byte // the conversation up to and including it, chat messages as JSON
}

// PutResponse keeps r (a response id is new each time: an id taken is an error).
func (s *Store) PutResponse(ctx context.Context, r StoredResponse) error {
	return s.Update(ctx, func(tx *Tx) error {
		_, err := tx.exec("INSERT INTO responses (id, created_at, response, messages) VALUES (?, ?, ?, ?)",
			r.ID, micros(r.CreatedAt), string(r.Response), string(r.Messages))
		if err != nil {
			return fmt.Errorf("keep response %s: %w", r.ID, err)
		}
		return nil
	})
}

// Response reads a kept response; ErrNotFound when there is none.
func (s *Store) Response(ctx context.Context, id string) (StoredResponse, error) {
	var r StoredResponse
	err := s.View(ctx, func(tx *Tx) error {
		var created int64
		var resp, msgs string
		err := tx.queryRow("SELECT id, created_at, response, messages FROM responses WHERE id = ?", id).Scan(&r.ID, &created, &resp, &msgs)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("%w: response %s", ErrNotFound, id)
		}
		if err != nil {
			return fmt.Errorf("read response %s: %w", id, err)
		}
		r.CreatedAt, r.Response, r.Messages = fromMicros(created), []byte(resp), []byte(msgs)
		return nil
	})
	return r, err
}

// DeleteResponse removes a kept response; ErrNotFound when there is none.
func (s *Store) DeleteResponse(ctx context.Context, id string) error {
	return s.Update(ctx, func(tx *Tx) error {
		res, err := tx.exec("DELETE FROM responses WHERE id = ?", id)
		if err != nil {
			return fmt.Errorf("delete response %s: %w", id, err)
		}
		if n, err := res.RowsAffected(); err == nil && n == 0 {
			return fmt.Errorf("%w: response %s", ErrNotFound, id)
		}
		return nil
	})
}
