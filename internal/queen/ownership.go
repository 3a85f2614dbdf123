package queen

import (
	"io"

	"github.com/apiary-llm/apiary/internal/config"
	"github.com/apiary-llm/apiary/internal/fleet"
)

// Ownership (docs/ownership.md, "Who owns what"): a daemon stops only what
// it started. The queen records who started it (an operator, or a keeper in
// ephemeral mode) and which hives it started itself: one per SSH node and,
// when asked, one on this machine. Those hives hold a lifeline to the queen
// (their stdin, through the SSH session or a pipe) and a lease on it, so
// they stop their workers and exit when the queen stops them, when it dies,
// or when it can no longer be reached for its heartbeat timeout. Hives an
// operator started register like any other and are never stopped by the
// queen.

// Owners of a queen.
const (
	QueenOwnerOperator = "operator"
	QueenOwnerKeeper   = "keeper"
)

// OwnershipConfig is who owns the queen and how it runs the hives it owns.
type OwnershipConfig struct {
	// Owner is who started the queen: QueenOwnerOperator (default) or
	// QueenOwnerKeeper.
	Owner string
	// Lifeline, when set, is the parent's pipe: its end shuts the queen
	// down with everything it owns.
	Lifeline io.ReadCloser
	fleet.Hives
}

// Defaults of the ownership settings.
const (
	DefaultHiveStopTimeout = fleet.DefaultHiveStopTimeout
	DefaultHivePort        = fleet.DefaultHivePort
	// LocalPoolID is the pool id (and node name) of the queen's local hive.
	LocalPoolID = fleet.LocalPoolID
)

func (c OwnershipConfig) withDefaults() OwnershipConfig {
	config.Default(&c.Owner, QueenOwnerOperator)
	c.Hives = c.Hives.WithDefaults()
	return c
}

// Validate reports every problem with c (after defaults), by field.
func (c OwnershipConfig) Validate() error {
	var p config.Problems
	if c.Owner != QueenOwnerOperator && c.Owner != QueenOwnerKeeper {
		p.Add("Owner", "%q: want %s or %s", c.Owner, QueenOwnerOperator, QueenOwnerKeeper)
	}
	p.Nest("", c.Hives.Validate())
	return p.Err()
}
