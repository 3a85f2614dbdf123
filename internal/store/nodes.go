package store

import (
	"encoding/json"
	"fmt"
	"time"
)

// Node is a machine the queen may start a hive on over SSH.
type Node struct {
	Name       string
	SSHTarget  string // USER@HOST[:PORT]
	InstallDir string
	CreatedAt  time.Time
	Metadata   json.RawMessage
}

// InsertNode adds n; ErrExists when its name is taken.
func (t *Tx) InsertNode(n Node) error {
	var one int
	if err := t.queryRow("SELECT 1 FROM nodes WHERE name = ?", n.Name).Scan(&one); err == nil {
		return fmt.Errorf("%w: node %s", ErrExists, n.Name)
	}
	if _, err := t.exec("INSERT INTO nodes (name, ssh_target, install_dir, created_at, metadata) VALUES (?, ?, ?, ?, ?)",
		n.Name, n.SSHTarget, n.InstallDir, micros(n.CreatedAt), jsonOr(n.Metadata, "{}")); err != nil {
		return fmt.Errorf("insert node %s: %w", n.Name, err)
	}
	return nil
}

// DeleteNode removes the node name; ErrNotFound when there is none.
func (t *Tx) DeleteNode(name string) error {
	res, err := t.exec("DELETE FROM nodes WHERE name = ?", name)
	if err != nil {
		return fmt.Errorf("delete node %s: %w", name, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("%w: node %s", ErrNotFound, name)
	}
	return nil
}

// Nodes reads every node, by name.
func (t *Tx) Nodes() ([]Node, error) {
	rows, err := t.query("SELECT name, ssh_target, install_dir, created_at, metadata FROM nodes ORDER BY name")
	if err != nil {
		return nil, fmt.Errorf("read nodes: %w", err)
	}
	defer rows.Close()
	var out []Node
	for rows.Next() {
		var n Node
		var created int64
		var meta string
		if err := rows.Scan(&n.Name, &n.SSHTarget, &n.InstallDir, &created, &meta); err != nil {
			return nil, fmt.Errorf("read nodes: %w", err)
		}
		n.CreatedAt, n.Metadata = fromMicros(created), json.RawMessage(meta)
		out = append(out, n)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read nodes: %w", err)
	}
	return out, nil
}
