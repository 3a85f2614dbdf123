package store

import (
	"database/sql"
	"fmt"
	"time"
)

// ModelSetting is an operator's setting of one model (apiary models
// scale): the queen keeps at least MinWorkers of it live, and places at
// most MaxWorkers of it (nil: the queen's own bound).
type ModelSetting struct {
	ModelRef   string
	MinWorkers int
	MaxWorkers *int
	Reason     string
	UpdatedAt  time.Time
}

// PutModelSetting writes s, replacing the model's setting if it has one.
func (t *Tx) PutModelSetting(s ModelSetting) error {
	_, err := t.exec(`INSERT INTO model_settings (model_ref, min_workers, max_workers, reason, updated_at) VALUES (?, ?, ?, ?, ?)
		ON CONFLICT (model_ref) DO UPDATE SET min_workers = excluded.min_workers, max_workers = excluded.max_workers,
		reason = excluded.reason, updated_at = excluded.updated_at`,
		s.ModelRef, s.MinWorkers, nullInt(s.MaxWorkers), s.Reason, micros(s.UpdatedAt))
	if err != nil {
		return fmt.Errorf("write the setting of model %s: %w", s.ModelRef, err)
	}
	return nil
}

// ModelSettings reads every model's setting, by model.
func (t *Tx) ModelSettings() ([]ModelSetting, error) {
	rows, err := t.query("SELECT model_ref, min_workers, max_workers, reason, updated_at FROM model_settings ORDER BY model_ref")
	if err != nil {
		return nil, fmt.Errorf("read model settings: %w", err)
	}
	defer rows.Close()
	var out []ModelSetting
	for rows.Next() {
		var s ModelSetting
		var maxW sql.NullInt64
		var updated int64
		if err := rows.Scan(&s.ModelRef, &s.MinWorkers, &maxW, &s.Reason, &updated); err != nil {
			return nil, fmt.Errorf("read model settings: %w", err)
		}
		s.MaxWorkers, s.UpdatedAt = intPtr(maxW), fromMicros(updated)
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read model settings: %w", err)
	}
	return out, nil
}
