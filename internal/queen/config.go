package queen

import (
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/apiary-llm/apiary/internal/batch"
	"github.com/apiary-llm/apiary/internal/config"
	"github.com/apiary-llm/apiary/internal/datadir"
	"github.com/apiary-llm/apiary/internal/registry"
	"github.com/apiary-llm/apiary/internal/routing"
	"github.com/apiary-llm/apiary/internal/secret"
	"github.com/apiary-llm/apiary/internal/store"
	"github.com/apiary-llm/apiary/internal/transport"
)

// Tokens authenticate the three kinds of callers (secret.Tokens).
type Tokens = secret.Tokens

// The environment variables the tokens come from.
const (
	APITokenEnv     = secret.APITokenEnv
	AdminTokenEnv   = secret.AdminTokenEnv
	ClusterTokenEnv = secret.ClusterTokenEnv
)

// Config is everything a queen needs. Zero values take the contract's
// defaults; Validate says what is wrong with the rest.
type Config struct {
	Addr        string // listen address, default 127.0.0.1:8080
	Advertise   string // URL others use to reach the queen; default http://Addr
	DataDir     string // holds the SQLite database when DatabaseURL is empty
	DatabaseURL string // postgres://… selects PostgreSQL
	// Standby: on PostgreSQL, when another queen holds the database, wait
	// as its standby and take over when it goes (standby.go); false: exit
	// with store.ErrLocked.
	Standby bool
	// LeaseDuration is how long a renewal of the PostgreSQL lease keeps
	// it: a standby takes over at most this long (plus StandbyPoll) after
	// the active queen's last renewal; default store.DefaultLeaseDuration.
	LeaseDuration time.Duration
	// LeaseRenew is how often the active queen renews its lease, at most
	// a third of LeaseDuration; it stops acting 3/4 of LeaseDuration after
	// its last renewal was sent; default store.DefaultLeaseRenew.
	LeaseRenew time.Duration

	HeartbeatTimeout time.Duration // a pool without a heartbeat this long is unhealthy
	UnhealthyGrace   time.Duration // unhealthy this long: its workers' rows become FAILED
	OfflineRetention time.Duration // offline pools are removed after this
	FlushInterval    time.Duration // heartbeat times reach the store this often
	HiveTimeout      time.Duration // budget of one call to a hive

	// ClaimTimeout: a row created for a worker run by hand (placement
	// operator) that no worker claimed this long after it was created is
	// FAILED with reason "unclaimed"; default DefaultClaimTimeout.
	ClaimTimeout time.Duration
	// ClaimHealthInterval is how often the queen checks GET /health of
	// every worker run by hand that claimed a row; ClaimHealthFailures
	// checks in a row that fail make its row FAILED (lost); default
	// DefaultClaimHealthInterval.
	ClaimHealthInterval time.Duration

	// AuditRetention: audit entries older than this are pruned, at start
	// and hourly; default DefaultRetention; negative keeps them forever.
	AuditRetention time.Duration
	// RowsRetention: ended lifecycle rows (STOPPED, FAILED) that ended
	// longer ago than this are pruned with the audit entries; live rows
	// never are; default DefaultRetention; negative keeps them forever.
	RowsRetention time.Duration

	// ModelsFile is the model config (YAML, see internal/modelconfig):
	// the cluster's models, their names and aliases, how their workers
	// start, their replicas and pools. New refuses a bad one; it is read
	// again on Reload (SIGHUP) and when it changes, looked at every
	// ModelsPoll (default DefaultModelsPoll). "": none.
	ModelsFile string
	ModelsPoll time.Duration

	Tokens       Tokens
	MaxBodyBytes int64 // request body limit, default 1 MiB (a chat to a model that sees: see routing.Config.MaxBodyBytes)

	// TLS, when its files are set, serves HTTPS only; default plain HTTP.
	TLS transport.ServerTLS
	// CORSOrigins are the browser origins allowed to call the OpenAI
	// endpoints (see transport.CORS); default none.
	CORSOrigins []string

	// Hives talks to the hives; default HTTP with the cluster token.
	Hives HiveClient
	// Placer picks a pool for a start without pool_id; default the
	// healthy pool with the most free device memory.
	Placer routing.Placer
	// Ownership is who owns the queen and how it runs the hives it owns
	// (SSH nodes, the local hive); see ownership.go.
	Ownership OwnershipConfig
	// Routing is how inference is routed and workers are placed on
	// demand; see routeconfig.go.
	Routing routing.Config
	// Batch is the OpenAI Batch API's settings (file size and retention,
	// attempts, concurrency); its files live in DataDir/files (see
	// batch.Config).
	Batch  batch.Config
	Logger *slog.Logger
}

// Defaults.
const (
	DefaultAddr        = "127.0.0.1:8080"
	DefaultHiveTimeout = 30 * time.Second
	// DefaultClaimTimeout is how long a row of placement operator waits
	// for its worker's claim.
	DefaultClaimTimeout = 10 * time.Minute
	// DefaultClaimHealthInterval is how often the workers run by hand are
	// checked.
	DefaultClaimHealthInterval = 5 * time.Second
	// ClaimHealthFailures is how many health checks in a row a worker run
	// by hand may fail before its row is FAILED.
	ClaimHealthFailures = 2
	DefaultMaxBodyBytes = 1 << 20
	// DefaultModelsPoll is how often the model config file is looked at.
	DefaultModelsPoll = 2 * time.Second
	// DefaultRetention keeps a month of audit entries and ended rows.
	DefaultRetention = 30 * 24 * time.Hour
	// KeepForever as a retention prunes nothing.
	KeepForever time.Duration = -1
	// minRetention is the shortest retention Validate takes.
	minRetention = time.Minute
)

// DefaultDataDir is $XDG_DATA_HOME/apiary, or ~/.local/share/apiary.
func DefaultDataDir() string { return datadir.Default() }

func (c Config) withDefaults() Config {
	config.Default(&c.Addr, DefaultAddr)
	if c.DataDir == "" && c.DatabaseURL == "" {
		c.DataDir = DefaultDataDir()
	}
	config.Default(&c.HeartbeatTimeout, registry.DefaultHeartbeatTimeout)
	config.Default(&c.UnhealthyGrace, c.HeartbeatTimeout)
	config.Default(&c.OfflineRetention, registry.DefaultOfflineRetention)
	config.Default(&c.FlushInterval, registry.DefaultFlushInterval)
	config.Default(&c.LeaseDuration, store.DefaultLeaseDuration)
	config.Default(&c.LeaseRenew, store.DefaultLeaseRenew)
	config.Default(&c.HiveTimeout, DefaultHiveTimeout)
	config.Default(&c.MaxBodyBytes, DefaultMaxBodyBytes)
	config.Default(&c.ModelsPoll, DefaultModelsPoll)
	config.Default(&c.ClaimTimeout, DefaultClaimTimeout)
	config.Default(&c.ClaimHealthInterval, DefaultClaimHealthInterval)
	config.Default(&c.AuditRetention, DefaultRetention)
	config.Default(&c.RowsRetention, DefaultRetention)
	config.Default(&c.Logger, slog.Default())
	if c.Hives == nil {
		c.Hives = NewHTTPHiveClient(c.Tokens.Cluster, c.HiveTimeout)
	}
	config.Default[routing.Placer](&c.Placer, routing.MostFreeMemory{})
	c.Ownership = c.Ownership.withDefaults()
	c.Routing = c.Routing.WithDefaults()
	// A request of a batch is bounded as any other request's body.
	config.Default(&c.Batch.MaxLineBytes, c.MaxBodyBytes)
	c.Batch = c.Batch.WithDefaults()
	return c
}

// Validate reports every problem with c (after defaults) at once, by
// field (config.FieldError).
func (c Config) Validate() error {
	var p config.Problems
	host, _, err := net.SplitHostPort(c.Addr)
	var missing []string
	for env, v := range map[string]string{APITokenEnv: c.Tokens.API, AdminTokenEnv: c.Tokens.Admin, ClusterTokenEnv: c.Tokens.Cluster} {
		if v == "" {
			missing = append(missing, env)
		}
	}
	switch {
	case err != nil:
		p.Add("Addr", "%q: %v", c.Addr, err)
	case len(missing) == 3 && !transport.IsLoopback(host):
		p.Add("Addr", "%q is not a loopback address: set %s to serve on it (without tokens the queen binds loopback only)", c.Addr, strings.Join(sortedStrings(missing), ", "))
	case len(missing) > 0 && len(missing) < 3:
		// A role whose token is missing would be open to anyone who
		// reaches the ones that are guarded.
		p.Add("Tokens", "are set but %v is not: set all three tokens, or none (then the queen serves loopback only)", sortedStrings(missing))
	}
	// Each token's problem is its own field's (Tokens.API, …), which
	// cmd/apiary names by its variable, once.
	for _, tok := range []struct{ field, v string }{{"Tokens.API", c.Tokens.API}, {"Tokens.Admin", c.Tokens.Admin}, {"Tokens.Cluster", c.Tokens.Cluster}} {
		if err := secret.CheckToken(tok.v); err != nil {
			p.Add(tok.field, "%v", err)
		} else if tok.v != "" && len(tok.v) < secret.MinTokenLen {
			p.Add(tok.field, "is %d bytes; a token needs at least %d (e.g. openssl rand -hex 32)", len(tok.v), secret.MinTokenLen)
		}
	}
	if err := c.TLS.Validate(); err != nil {
		p.Add("TLS", "%v", err)
	}
	if err := transport.CheckOrigins(c.CORSOrigins); err != nil {
		p.Add("CORSOrigins", "%v", err)
	}
	if c.Advertise != "" {
		if _, err := transport.CheckBaseURL("", c.Advertise); err != nil {
			p.Add("Advertise", "%s", strings.TrimSpace(err.Error()))
		}
	}
	if c.DatabaseURL != "" && !store.IsPostgresURL(c.DatabaseURL) {
		p.Add("DatabaseURL", "must be a postgres:// or postgresql:// URL")
	}
	for _, d := range []struct {
		field string
		v     time.Duration
	}{{"HeartbeatTimeout", c.HeartbeatTimeout}, {"UnhealthyGrace", c.UnhealthyGrace}, {"OfflineRetention", c.OfflineRetention},
		{"FlushInterval", c.FlushInterval}, {"HiveTimeout", c.HiveTimeout}, {"ClaimTimeout", c.ClaimTimeout},
		{"ClaimHealthInterval", c.ClaimHealthInterval}, {"ModelsPoll", c.ModelsPoll},
		{"LeaseDuration", c.LeaseDuration}, {"LeaseRenew", c.LeaseRenew}} {
		if d.v <= 0 {
			p.Add(d.field, "must be positive, got %s", d.v)
		}
	}
	for _, d := range []struct {
		field string
		v     time.Duration
	}{{"AuditRetention", c.AuditRetention}, {"RowsRetention", c.RowsRetention}} {
		if d.v > 0 && d.v < minRetention {
			p.Add(d.field, "%s is shorter than %s: give at least %s, or 0 to keep forever", d.v, minRetention, minRetention)
		}
	}
	if c.LeaseRenew > 0 && c.LeaseRenew*3 > c.LeaseDuration {
		p.Add("LeaseRenew", "%s must be at most a third of LeaseDuration %s", c.LeaseRenew, c.LeaseDuration)
	}
	if c.MaxBodyBytes < 1 {
		p.Add("MaxBodyBytes", "must be positive, got %d", c.MaxBodyBytes)
	}
	p.Nest("Ownership", c.Ownership.Validate())
	p.Nest("Routing", c.Routing.Validate())
	p.Nest("Batch", c.Batch.Validate())
	if c.Ownership.LocalHive && c.DataDir == "" {
		p.Add("DataDir", "is where the local hive keeps its data; give one")
	}
	return p.Err()
}
