package queen

import (
	"io"
	"strings"
	"time"

	"github.com/apiary-llm/apiary/internal/config"
	"github.com/apiary-llm/apiary/internal/fleet"
	"github.com/apiary-llm/apiary/internal/sshnode"
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
	// LocalHive starts a hive on this machine as the queen's child (pool
	// LocalPoolID), with its data in DataDir/local-hive.
	LocalHive bool
	// HiveArgs are added to the command line of every hive the queen
	// starts (e.g. --worker-threads=1, --models-dir=DIR); they come after
	// the queen's own flags, so they override them.
	HiveArgs []string
	// Binary is the apiary the queen runs locally and copies to nodes;
	// default this executable.
	Binary string
	// SSH runs the system ssh client (ConfigFile is --ssh-config).
	SSH sshnode.Client
	// HiveStopTimeout bounds the wait for one hive's cascade when the
	// queen stops it; then its process (or SSH session) is killed.
	HiveStopTimeout time.Duration
	// RestartMin and RestartMax bound the pause before the queen starts a
	// hive of its own again after it ended or could not start.
	RestartMin, RestartMax time.Duration
	// ProbeTimeout bounds each SSH probe and copy.
	ProbeTimeout time.Duration
}

// Defaults of the ownership settings.
const (
	DefaultHiveStopTimeout = 60 * time.Second
	DefaultRestartMin      = time.Second
	DefaultRestartMax      = 30 * time.Second
	DefaultProbeTimeout    = 2 * time.Minute
	DefaultHivePort        = fleet.DefaultHivePort
	// LocalPoolID is the pool id (and node name) of the queen's local hive.
	LocalPoolID = fleet.LocalPoolID
)

func (c OwnershipConfig) withDefaults() OwnershipConfig {
	if c.Owner == "" {
		c.Owner = QueenOwnerOperator
	}
	if c.HiveStopTimeout == 0 {
		c.HiveStopTimeout = DefaultHiveStopTimeout
	}
	if c.RestartMin == 0 {
		c.RestartMin = DefaultRestartMin
	}
	if c.RestartMax == 0 {
		c.RestartMax = DefaultRestartMax
	}
	if c.ProbeTimeout == 0 {
		c.ProbeTimeout = DefaultProbeTimeout
	}
	return c
}

// Validate reports every problem with c (after defaults), by field.
func (c OwnershipConfig) Validate() error {
	var p config.Problems
	if c.Owner != QueenOwnerOperator && c.Owner != QueenOwnerKeeper {
		p.Add("Owner", "%q: want %s or %s", c.Owner, QueenOwnerOperator, QueenOwnerKeeper)
	}
	for _, a := range c.HiveArgs {
		if !strings.HasPrefix(a, "--") || strings.ContainsAny(a, "\x00\r\n") {
			p.Add("HiveArgs", "%q: want one --flag or --flag=value", a)
		}
	}
	for _, d := range []struct {
		field string
		v     time.Duration
	}{{"HiveStopTimeout", c.HiveStopTimeout}, {"RestartMin", c.RestartMin}, {"ProbeTimeout", c.ProbeTimeout}} {
		if d.v <= 0 {
			p.Add(d.field, "must be positive, got %s", d.v)
		}
	}
	if c.RestartMax < c.RestartMin {
		p.Add("RestartMax", "%s is shorter than {RestartMin} %s", c.RestartMax, c.RestartMin)
	}
	return p.Err()
}
