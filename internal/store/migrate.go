package store

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"slices"
	"strconv"
	"strings"
	"time"
)

// migrations holds NNNN_name.sql files, applied in order of NNNN, each in
// its own transaction together with its row in schema_migrations. The
// statements of a file are separated by ";" at the end of a line. A step
// the two databases cannot share is a pair of files instead:
// NNNN_name.sqlite.sql and NNNN_name.postgres.sql.
//
//go:embed migrations/*.sql
var migrations embed.FS

type migration struct {
	version int
	name    string
	sql     map[Dialect]string // "" for both
}

// text is the migration's SQL for d.
func (m migration) text(d Dialect) string {
	if t, ok := m.sql[""]; ok {
		return t
	}
	return m.sql[d]
}

func loadMigrations() ([]migration, error) {
	ents, err := fs.ReadDir(migrations, "migrations")
	if err != nil {
		return nil, err
	}
	byVersion := map[int]*migration{}
	for _, e := range ents {
		num, name, ok := strings.Cut(strings.TrimSuffix(e.Name(), ".sql"), "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v < 1 {
			return nil, fmt.Errorf("migration %s: name must be NNNN_name.sql", e.Name())
		}
		var d Dialect
		for _, dd := range []Dialect{SQLite, Postgres} {
			if n, found := strings.CutSuffix(name, "."+string(dd)); found {
				name, d = n, dd
			}
		}
		b, err := migrations.ReadFile("migrations/" + e.Name())
		if err != nil {
			return nil, err
		}
		m := byVersion[v]
		if m == nil {
			m = &migration{version: v, name: name, sql: map[Dialect]string{}}
			byVersion[v] = m
		}
		if _, dup := m.sql[d]; dup || m.name != name {
			return nil, fmt.Errorf("migration %s: another file has version %d", e.Name(), v)
		}
		m.sql[d] = string(b)
	}
	var out []migration
	for _, m := range byVersion {
		_, both := m.sql[""]
		_, lite := m.sql[SQLite]
		_, post := m.sql[Postgres]
		if both == (lite || post) || lite != post {
			return nil, fmt.Errorf("migration %04d_%s: want one .sql file, or one .sqlite.sql and one .postgres.sql", m.version, m.name)
		}
		out = append(out, *m)
	}
	slices.SortFunc(out, func(a, b migration) int { return a.version - b.version })
	for i, m := range out {
		if m.version != i+1 {
			return nil, fmt.Errorf("migrations must be numbered 1, 2, …: found %d at position %d", m.version, i+1)
		}
	}
	return out, nil
}

// Version is the schema version this binary migrates to.
func Version() int {
	ms, err := loadMigrations()
	if err != nil {
		return 0
	}
	return len(ms)
}

// statements splits a migration file at semicolons that end a line;
// comment-only pieces are dropped.
func statements(src string) []string {
	var out []string
	var cur strings.Builder
	for line := range strings.Lines(src) {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "--") {
			continue
		}
		cur.WriteString(line)
		if strings.HasSuffix(trimmed, ";") {
			if st := strings.TrimSpace(cur.String()); st != ";" {
				out = append(out, strings.TrimSuffix(st, ";"))
			}
			cur.Reset()
		}
	}
	if st := strings.TrimSpace(cur.String()); st != "" {
		out = append(out, st)
	}
	return out
}

func (s *Store) migrate(ctx context.Context) error {
	ms, err := loadMigrations()
	if err != nil {
		return err
	}
	if _, err := s.db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version    INTEGER PRIMARY KEY,
		name       TEXT    NOT NULL,
		applied_at BIGINT  NOT NULL)`); err != nil {
		return fmt.Errorf("create schema_migrations: %w", err)
	}
	var current int
	if err := s.db.QueryRowContext(ctx, "SELECT COALESCE(MAX(version), 0) FROM schema_migrations").Scan(&current); err != nil {
		return fmt.Errorf("read schema version: %w", err)
	}
	if current > len(ms) {
		return fmt.Errorf("the database has schema version %d, newer than this binary's %d: upgrade apiary", current, len(ms))
	}
	for _, m := range ms[current:] {
		err := s.Update(ctx, func(tx *Tx) error {
			for _, st := range statements(m.text(s.dialect)) {
				if _, err := tx.tx.ExecContext(ctx, st); err != nil {
					return fmt.Errorf("%w in %q", err, firstLine(st))
				}
			}
			_, err := tx.exec("INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)",
				m.version, m.name, micros(time.Now()))
			return err
		})
		if err != nil {
			return fmt.Errorf("migration %04d_%s: %w", m.version, m.name, err)
		}
		s.log.Info("applied migration", "version", m.version, "name", m.name, "dialect", string(s.dialect))
	}
	return nil
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}
