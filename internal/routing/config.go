package routing

import (
	"context"
	"log/slog"
	"sort"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/config"
	"github.com/apiary-llm/apiary/internal/imagefetch"
	"github.com/apiary-llm/apiary/internal/store"
	"github.com/prometheus/client_golang/prometheus"
)

// Routing defaults (the contract's --affinity-ttl, and apiary's own).
const (
	DefaultAffinityTTL  = 5 * time.Minute
	DefaultQueueSize    = 256
	DefaultQueueTimeout = 90 * time.Second
	DefaultEvictWait    = 60 * time.Second
	DefaultSwapWait     = 30 * time.Second
	// DefaultMinResidency is the queen's --min-residency: see
	// Config.MinResidency (0: a worker's own load time alone).
	DefaultMinResidency  = 0
	DefaultScaleUpAfter  = 2 * time.Second
	DefaultMaxWorkers    = 1
	DefaultWorkerSlots   = 1
	DefaultModelsRefresh = 30 * time.Second
	DefaultMaxBodyBytes  = 1 << 20
	DefaultHiveTimeout   = 30 * time.Second
	DefaultStrikeLimit   = 3
	// Replicas (models with min_workers): a crash loop is
	// DefaultCrashLoopFailures failures within DefaultCrashLoopWindow;
	// it is replaced every DefaultCrashLoopBackoff until a worker serves
	// for DefaultStableAfter.
	DefaultCrashLoopFailures = 5
	DefaultCrashLoopWindow   = 10 * time.Minute
	DefaultCrashLoopBackoff  = 5 * time.Minute
	DefaultStableAfter       = time.Minute
	// catalogTimeout bounds one read of a hive's model list.
	catalogTimeout = 5 * time.Second
	// maxAttempts bounds the workers one request is tried on (retries
	// happen only before its first byte reached the client).
	maxAttempts = 3
	// maxSessions bounds the affinity table; past it new sessions are not
	// pinned (and count as misses).
	maxSessions = 100_000
)

// Config is how the queen routes inference and turns demand into
// workers. Zero fields take the defaults above.
type Config struct {
	// Images fetches the pictures requests name by URL (images.go); nil
	// fetches none (the worker refuses such a request 400).
	Images *imagefetch.Fetcher
	// Routing is how a worker is chosen among those of a model with a
	// free slot: RoutePrefix (default) or RouteLeastLoaded (--routing).
	Routing string
	// AffinityTTL is how long an X-Session-Id stays pinned to its worker
	// after its last request (--affinity-ttl).
	AffinityTTL time.Duration
	// QueueSize bounds the requests waiting for a worker of one model; one
	// more is refused with 429 and Retry-After (--queue-size).
	QueueSize int
	// QueueTimeout is the longest a request waits for a worker; then it is
	// answered 504 (--queue-timeout).
	QueueTimeout time.Duration
	// SwapWait is how long a request waits for busy workers of other
	// models to finish when only they hold the memory its model needs;
	// then it is refused 503 with why (--swap-wait).
	SwapWait time.Duration
	// MinResidency keeps a device from thrashing between models asked for
	// in turn: once the queen has evicted workers on a device
	// ThrashEvictions times within a minute, a worker there is not evicted
	// until it has been ready as long as it took to load (started to
	// ready), and at least MinResidency; never more than half of SwapWait.
	// The other model's requests wait for it as for a busy one. Under
	// alternating demand a device then spends at most about half its time
	// loading, and swaps at most ThrashEvictions + 60s/max(load time,
	// MinResidency) times a minute (--min-residency; default
	// DefaultMinResidency).
	MinResidency time.Duration
	// EvictWait bounds how long a placement that evicted idle workers
	// waits for their memory to be reported back (DefaultEvictWait).
	EvictWait time.Duration
	// ScaleUpAfter: when the oldest waiting request of a model has waited
	// this long, the controller places one more worker of it, up to its
	// max workers (--scale-up-after).
	ScaleUpAfter time.Duration
	// MaxWorkers bounds the live workers of each model that the queen
	// places (--max-workers); ModelMaxWorkers overrides it per model
	// (--model-max-workers m=n; 0: the queen never places that model, only
	// operators start its workers). Operators' workers count too.
	MaxWorkers      int
	ModelMaxWorkers map[string]int
	// WorkerSlots is how many requests the queen sends to one worker at
	// once: the workers' --slots, which hives set with --worker-slots
	// (--worker-slots). More requests wait in the queen's queue, where the
	// controller sees them.
	WorkerSlots int
	// ModelsRefresh is how often the queen re-reads each hive's model list
	// (--models-refresh); a request for a model no list has re-reads them
	// at once.
	ModelsRefresh time.Duration
	// StrikeLimit is how many requests in a row a worker may fail (a
	// refused or broken connection, a 5xx other than 503) before the
	// queen degrades it: no new requests until its health check answers
	// or a request succeeds; at 3 × StrikeLimit the queen stops it
	// (--strike-limit; default 3).
	StrikeLimit int
	// CrashLoopFailures, CrashLoopWindow: a model with min_workers whose
	// workers fail (or whose placements give no worker) CrashLoopFailures
	// times within CrashLoopWindow is in a crash loop (audited once,
	// worker.crashloop); it is then replaced only every CrashLoopBackoff,
	// until one of its workers serves for StableAfter, which also ends its
	// replacement backoff (1s, 2s … 30s). Defaults 5, 10m, 5m, 1m
	// (--crashloop-failures, --crashloop-window, --crashloop-backoff,
	// --stable-after).
	CrashLoopFailures int
	CrashLoopWindow   time.Duration
	CrashLoopBackoff  time.Duration
	StableAfter       time.Duration

	// What routing is wired to; set by the queen.

	// APIToken guards the OpenAI endpoints ("": open).
	APIToken string
	// CORSOrigins are the browser origins allowed (see transport.CORS).
	CORSOrigins []string
	// MaxBodyBytes bounds a request body (default 1 MiB). Embeddings and
	// reranks take up to their own larger bounds, and a chat to a model
	// that sees images up to openai.MaxImageBodyBytes, the worker's
	// bound; the larger of the two wins (bodyLimit).
	MaxBodyBytes int64
	// Models reads a hive's model list; HiveTimeout bounds one read.
	Models      HiveModels
	HiveTimeout time.Duration
	// Responses keeps the Responses API's answers (store: true) for
	// previous_response_id and GET /v1/responses/{id}; nil keeps none
	// (previous_response_id is refused).
	Responses ResponseStore
	// Finished, when set, learns of each request relayed to a worker (or
	// refused while it waited for one) once its answer ended, for the
	// dashboard's recent requests; it is called on the request's own
	// goroutine and must not block.
	Finished func(Finished)
	// Placer picks a pool for a worker placed on demand; default
	// MostFreeMemory.
	Placer  Placer
	Metrics prometheus.Registerer // default: a registry of its own
	Logger  *slog.Logger          // default slog.Default()
}

// WithDefaults fills the zero fields with the defaults above.
func (c Config) WithDefaults() Config {
	config.Default(&c.Routing, RoutePrefix)
	config.Default(&c.AffinityTTL, DefaultAffinityTTL)
	config.Default(&c.QueueTimeout, DefaultQueueTimeout)
	config.Default(&c.EvictWait, DefaultEvictWait)
	config.Default(&c.SwapWait, DefaultSwapWait)
	config.Default(&c.ScaleUpAfter, DefaultScaleUpAfter)
	config.Default(&c.ModelsRefresh, DefaultModelsRefresh)
	config.Default(&c.CrashLoopWindow, DefaultCrashLoopWindow)
	config.Default(&c.CrashLoopBackoff, DefaultCrashLoopBackoff)
	config.Default(&c.StableAfter, DefaultStableAfter)
	config.Default(&c.CrashLoopFailures, DefaultCrashLoopFailures)
	config.Default(&c.QueueSize, DefaultQueueSize)
	config.Default(&c.MaxWorkers, DefaultMaxWorkers)
	config.Default(&c.WorkerSlots, DefaultWorkerSlots)
	config.Default(&c.StrikeLimit, DefaultStrikeLimit)
	config.Default(&c.MaxBodyBytes, DefaultMaxBodyBytes)
	config.Default(&c.HiveTimeout, DefaultHiveTimeout)
	config.Default[Placer](&c.Placer, MostFreeMemory{})
	if c.Metrics == nil {
		c.Metrics = prometheus.NewRegistry()
	}
	config.Default(&c.Logger, slog.Default())
	return c
}

// Validate reports every problem with c (after defaults), by field.
func (c Config) Validate() error {
	var p config.Problems
	for _, d := range []struct {
		field string
		v     time.Duration
	}{{"AffinityTTL", c.AffinityTTL}, {"QueueTimeout", c.QueueTimeout}, {"ScaleUpAfter", c.ScaleUpAfter}, {"ModelsRefresh", c.ModelsRefresh},
		{"CrashLoopWindow", c.CrashLoopWindow}, {"CrashLoopBackoff", c.CrashLoopBackoff}, {"StableAfter", c.StableAfter}} {
		if d.v <= 0 {
			p.Add(d.field, "must be positive, got %s", d.v)
		}
	}
	for _, n := range []struct {
		field string
		v     int
	}{{"QueueSize", c.QueueSize}, {"MaxWorkers", c.MaxWorkers}, {"WorkerSlots", c.WorkerSlots}, {"StrikeLimit", c.StrikeLimit},
		{"CrashLoopFailures", c.CrashLoopFailures}} {
		if n.v < 1 {
			p.Add(n.field, "must be at least 1, got %d", n.v)
		}
	}
	if c.Routing != RoutePrefix && c.Routing != RouteLeastLoaded {
		p.Add("Routing", "must be %q or %q, got %q", RoutePrefix, RouteLeastLoaded, c.Routing)
	}
	if c.MaxBodyBytes < 1 {
		p.Add("MaxBodyBytes", "must be positive, got %d", c.MaxBodyBytes)
	}
	switch {
	case c.MinResidency < 0:
		p.Add("MinResidency", "must not be negative (0: no such rule), got %s", c.MinResidency)
	case c.MinResidency > c.SwapWait/2:
		p.Add("MinResidency", "is %s, more than half the swap wait (%s): a request waiting for a young worker would be refused before it may be evicted", c.MinResidency, c.SwapWait)
	}
	models := make([]string, 0, len(c.ModelMaxWorkers))
	for m := range c.ModelMaxWorkers {
		models = append(models, m)
	}
	sort.Strings(models)
	for _, m := range models {
		if err := api.CheckModel(m); err != nil {
			p.Add("ModelMaxWorkers", "%v", err)
		}
		if n := c.ModelMaxWorkers[m]; n < 0 {
			p.Add("ModelMaxWorkers", "%s=%d must not be negative (0: only operators start its workers)", m, n)
		}
	}
	return p.Err()
}

// maxWorkers is model's bound on live workers: its replica setting's max
// (r, when it has one), else the queen's; never below its min workers.
func (c Config) maxWorkers(model string, r Replica) int {
	n := c.MaxWorkers
	if m, ok := c.ModelMaxWorkers[model]; ok {
		n = m
	}
	if r.Max != nil {
		n = *r.Max
	}
	return max(n, r.Min)
}

// crashLoop is the crash loop policy of c.
func (c Config) crashLoop() crashLoopPolicy {
	return crashLoopPolicy{Failures: c.CrashLoopFailures, Window: c.CrashLoopWindow, Backoff: c.CrashLoopBackoff}
}

// ResponseStore keeps the Responses API's answers (the queen's store).
type ResponseStore interface {
	PutResponse(ctx context.Context, r store.StoredResponse) error
	// Response reads one; store.ErrNotFound when there is none.
	Response(ctx context.Context, id string) (store.StoredResponse, error)
	// DeleteResponse removes one; store.ErrNotFound when there is none.
	DeleteResponse(ctx context.Context, id string) error
}
