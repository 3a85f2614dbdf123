// Package datadir says where apiary keeps its files unless told
// otherwise: $XDG_DATA_HOME/apiary, or ~/.local/share/apiary. The queen's
// database, the hive's records and the models directory (models/) live
// there.
package datadir

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// ErrUnusable marks a data directory that cannot be created, locked or
// written (a file in its path, no permission, a read-only file system):
// the daemons wrap it with the cause, and cmd/apiary adds which flag
// chooses another.
var ErrUnusable = errors.New("cannot use the data directory")

// Home is apiary's data directory; it fails only when neither
// $XDG_DATA_HOME nor a home directory is known.
func Home() (string, error) {
	if d := os.Getenv("XDG_DATA_HOME"); d != "" {
		return filepath.Join(d, "apiary"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("no default data directory: %w", err)
	}
	return filepath.Join(home, ".local", "share", "apiary"), nil
}

// Default is Home, or $TMPDIR/apiary when it has none: what a daemon's
// flag defaults to.
func Default() string {
	if d, err := Home(); err == nil {
		return d
	}
	return filepath.Join(os.TempDir(), "apiary")
}

// Models is the default models directory, Default's models/.
func Models() string { return filepath.Join(Default(), "models") }
