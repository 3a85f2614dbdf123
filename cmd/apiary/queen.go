package main

import (
	"context"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/apiary-llm/apiary/internal/batch"
	"github.com/apiary-llm/apiary/internal/fleet"
	"github.com/apiary-llm/apiary/internal/openai"
	"github.com/apiary-llm/apiary/internal/procs"
	"github.com/apiary-llm/apiary/internal/queen"
	"github.com/apiary-llm/apiary/internal/registry"
	"github.com/apiary-llm/apiary/internal/sdnotify"
	"github.com/apiary-llm/apiary/internal/secret"
	"github.com/apiary-llm/apiary/internal/sshnode"
	"github.com/apiary-llm/apiary/internal/store"
	"github.com/apiary-llm/apiary/internal/transport"
)

// queenFlags are the flags of `apiary queen`; toConfig turns them into a
// queen.Config.
type queenFlags struct {
	tls                                   transport.ServerTLS
	corsOrigins                           []string
	addr, advertise, dataDir, databaseURL string
	heartbeatTimeout, unhealthyGrace      time.Duration
	offlineRetention, flushInterval       time.Duration
	hiveTimeout                           time.Duration
	claimTimeout, claimHealthInterval     time.Duration
	auditRetention, rowsRetention         time.Duration
	maxBody                               int64
	standby                               bool
	leaseDuration, leaseRenew             time.Duration
	log                                   logFlags
	owner, lifeline, sshConfig            string
	localHive                             bool
	hiveArgs                              []string
	passEnv                               []string
	hiveStopTimeout, sshTimeout           time.Duration
	routing                               routingFlags
	modelsFile                            string
	modelsPoll                            time.Duration
	batchMaxFile, batchMaxAnswer          int64
	batchRetention, batchAttemptTimeout   time.Duration
	batchAttempts, batchConcurrency       int
	batchMaxLines, batchMaxFiles          int
	batchMaxOpen                          int
	kube                                  kubeFlags
}

// databaseURLEnv gives --database-url's default, so that a password need
// not be on the command line. Its value is read when the queen starts,
// never shown: --help says only whether it is set.
const databaseURLEnv = secret.DatabaseURLEnv

func newQueenCmd() *cobra.Command {
	f := &queenFlags{}
	cmd := &cobra.Command{
		Use:   "queen",
		Short: "Run the orchestrator daemon",
		Long: `Run the orchestrator daemon: the registry of pools (hives register and
heartbeat here), the worker lifecycle rows and the audit log, and the admin API.

State lives in SQLite in --data-dir, or in PostgreSQL with --database-url
(default $` + databaseURLEnv + `). One queen owns a database at a time; on
PostgreSQL more queens started on the same database stand by (--standby):
they answer 503 with the active queen's URL and take over when it goes.

Tokens come from the environment: APIARY_API_TOKEN (inference),
APIARY_ADMIN_TOKEN (/api/admin/…, pool drain and removal) and
APIARY_CLUSTER_TOKEN (hives). Without all three the queen binds a loopback
address only.`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := f.toConfig(cmd)
			if err != nil {
				return err
			}
			lf, _, err := openLifeline(f.lifeline, nil)
			if err != nil {
				return err
			}
			cfg.Ownership.Lifeline = lf
			notifier, err := sdnotify.FromEnv()
			if err != nil {
				return err
			}
			q, err := queen.New(cfg)
			if err != nil {
				return configError(err, queenFields)
			}
			d := sdnotify.Daemon{Serving: q.Ready(), Done: q.Done(), Alive: q.Alive, Status: q.Summary}
			return notifying(cmd.Context(), notifier, d, cfg.Logger, func(ctx context.Context) error {
				if cfg.ModelsFile == "" {
					return q.Run(ctx) // context.Canceled is a clean exit (exitCode)
				}
				return runReloading(ctx, q)
			})
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.addr, "addr", queen.DefaultAddr, "address the queen listens on")
	fl.StringVar(&f.advertise, "advertise", "", "URL hives and clients use to reach this queen (default http://ADDR)")
	fl.StringVar(&f.dataDir, "data-dir", queen.DefaultDataDir(), "directory of the queen's SQLite database")
	fl.StringVar(&f.databaseURL, "database-url", "", "PostgreSQL URL (postgres://…) instead of SQLite "+envDefault(databaseURLEnv))
	fl.DurationVar(&f.leaseDuration, "lease-duration", store.DefaultLeaseDuration, "with --database-url: how long a renewal of the active queen's lease keeps it; a standby takes over at most this long after the active's last renewal (it died, froze or lost the database)")
	fl.DurationVar(&f.leaseRenew, "lease-renew", store.DefaultLeaseRenew, "with --database-url: how often the active queen renews its lease (at most a third of --lease-duration); it stops acting 3/4 of --lease-duration after its last renewal was sent")
	fl.BoolVar(&f.standby, "standby", true, "with --database-url: when another queen holds the database, stand by (503 with the active queen's URL) and take over when it goes; false: exit")
	fl.DurationVar(&f.heartbeatTimeout, "heartbeat-timeout", registry.DefaultHeartbeatTimeout, "a pool without a heartbeat this long is unhealthy")
	fl.DurationVar(&f.unhealthyGrace, "unhealthy-grace", 0, "a pool unhealthy this long has its workers' rows FAILED (default: --heartbeat-timeout)")
	fl.DurationVar(&f.offlineRetention, "offline-retention", registry.DefaultOfflineRetention, "offline (deregistered) pools are removed after this")
	fl.DurationVar(&f.flushInterval, "flush-interval", registry.DefaultFlushInterval, "heartbeat data reach the database this often: changed devices and workers at the next flush, a time alone once it is a minute old (all at shutdown)")
	fl.DurationVar(&f.hiveTimeout, "hive-timeout", queen.DefaultHiveTimeout, "time budget of one call to a hive")
	fl.DurationVar(&f.claimTimeout, "claim-timeout", queen.DefaultClaimTimeout, "a row created for a worker run by hand (placement operator) that no worker claims this long is FAILED (unclaimed)")
	fl.DurationVar(&f.claimHealthInterval, "claim-health-interval", queen.DefaultClaimHealthInterval, "how often the queen checks the health of workers run by hand; "+strconv.Itoa(queen.ClaimHealthFailures)+" failed checks in a row fail their row")
	fl.DurationVar(&f.auditRetention, "audit-retention", queen.DefaultRetention, "audit entries older than this are pruned (at start, then hourly); 0 keeps them forever")
	fl.DurationVar(&f.rowsRetention, "rows-retention", queen.DefaultRetention, "stopped and failed worker rows that ended longer ago than this are pruned, and kept Responses API answers this old; live rows never are; 0 keeps them forever")
	fl.Int64Var(&f.maxBody, "max-body-bytes", queen.DefaultMaxBodyBytes, "request body limit; larger bodies get 413. A chat to a model that sees images takes up to "+strconv.Itoa(openai.MaxImageBodyBytes>>20)+" MiB (pictures inline), or this when it is larger")
	fl.StringVar(&f.sshConfig, "ssh-config", "", "ssh client configuration file for the nodes (ssh -F; default the user's ~/.ssh/config)")
	fl.DurationVar(&f.sshTimeout, "ssh-timeout", 10*time.Second, "how long ssh may take to connect to a node (ssh -o ConnectTimeout)")
	fl.StringVar(&f.owner, "owner", queen.QueenOwnerOperator, "who started this queen: operator, or keeper (apiary infer's ephemeral mode)")
	fl.StringVar(&f.lifeline, "lifeline", "", `"stdin": the parent holds this queen's stdin; its end shuts the queen down with every hive it started`)
	fl.BoolVar(&f.localHive, "local-hive", false, "start a hive on this machine as the queen's child (pool \"local\")")
	fl.StringArrayVar(&f.hiveArgs, "hive-arg", nil, "extra flag for every hive the queen starts, e.g. --hive-arg=--worker-threads=1 (repeatable)")
	fl.StringSliceVar(&f.passEnv, "pass-env", nil, "variables of this queen's environment its local hive gets besides PATH, HOME, locale, CUDA_* and the rest of the allow-list, and every hive it starts passes on to its workers (docs/security.md): NAME or PREFIX*, comma-separated or repeated")
	fl.DurationVar(&f.hiveStopTimeout, "hive-stop-timeout", queen.DefaultHiveStopTimeout, "how long a hive the queen started may take to stop its workers and exit; then it is killed")
	fl.StringVar(&f.modelsFile, "config", "", "the cluster's models (YAML: names, aliases, files, worker options, replicas, pools, sampling defaults); read again on SIGHUP and when it changes")
	fl.DurationVar(&f.modelsPoll, "config-poll", queen.DefaultModelsPoll, "how often the --config file is looked at for changes")
	f.routing.add(fl)
	f.kube.add(fl)
	fl.Int64Var(&f.batchMaxFile, "batch-max-file-bytes", batch.DefaultMaxFileBytes, "largest batch input file (POST /v1/files); larger ones get 413")
	fl.DurationVar(&f.batchRetention, "batch-file-retention", batch.DefaultFileRetention, "batch files (input, output, error) expire this long after they were made, and ended batches are removed this long after they were created; 0 keeps them forever")
	fl.IntVar(&f.batchAttempts, "batch-max-attempts", batch.DefaultMaxAttempts, "workers a batch request is tried on before it fails with the last one's reason")
	fl.IntVar(&f.batchConcurrency, "batch-concurrency", batch.DefaultConcurrency, "batch requests under way at once (waiting for a free slot or running)")
	fl.IntVar(&f.batchMaxLines, "batch-max-lines", batch.DefaultMaxLines, "most requests in one batch input file; a longer file is refused naming its line (each line is also bounded by --max-body-bytes)")
	fl.IntVar(&f.batchMaxFiles, "batch-max-files", batch.DefaultMaxFiles, "most batch input files kept at once (for every caller together: the queen has one API token); an upload past it gets 429")
	fl.IntVar(&f.batchMaxOpen, "batch-max-open-batches", batch.DefaultMaxOpenBatches, "most batches not ended (validating, in progress, finalizing, cancelling) at once, for every caller together; a creation past it gets 429")
	fl.DurationVar(&f.batchAttemptTimeout, "batch-attempt-timeout", batch.DefaultAttemptTimeout, "longest one attempt of a batch request may run once it has a slot; then it is cancelled and the request fails (attempt_timeout)")
	fl.Int64Var(&f.batchMaxAnswer, "batch-max-answer-bytes", batch.DefaultMaxAnswerBytes, "largest answer to one batch request the queen keeps; a larger one is cut off and the request fails (answer_too_large)")
	addTLSFlags(fl, &f.tls)
	fl.StringArrayVar(&f.corsOrigins, "cors-origin", nil, "browser origin allowed to call the OpenAI endpoints, e.g. https://chat.example.com (repeatable; * for any); default none")
	f.log.add(fl)
	groupFlags(cmd, queenFlagGroups)
	return cmd
}

// queenFlagGroups are the headings of `apiary queen --help`.
var queenFlagGroups = []flagGroup{
	{"Network and TLS", []string{"addr", "advertise", "tls-cert", "tls-key", "cors-origin", "max-body-bytes"}},
	{"Store and high availability", []string{"data-dir", "database-url", "standby", "lease-duration", "lease-renew", "flush-interval",
		"audit-retention", "rows-retention"}},
	{"Pools and hives", []string{"heartbeat-timeout", "unhealthy-grace", "offline-retention", "hive-timeout", "claim-timeout",
		"claim-health-interval", "local-hive", "hive-arg", "pass-env", "hive-stop-timeout", "ssh-config", "ssh-timeout", "owner", "lifeline"}},
	{"Models, placement and swap", []string{"config", "config-poll", "models-refresh", "max-workers", "model-max-workers", "scale-up-after",
		"swap-wait", "min-residency", "crashloop-failures", "crashloop-window", "crashloop-backoff", "stable-after"}},
	{"Routing", []string{"routing", "worker-slots", "queue-size", "queue-timeout", "affinity-ttl", "strike-limit", "image-fetch", "image-fetch-private"}},
	{"Batches", []string{"batch-concurrency", "batch-max-attempts", "batch-attempt-timeout", "batch-max-file-bytes", "batch-max-lines",
		"batch-max-files", "batch-max-open-batches", "batch-max-answer-bytes", "batch-file-retention"}},
	{"Kubernetes", kubeFlagNames},
	{"Logs", []string{"log-level", "log-json"}},
}

func (f *queenFlags) toConfig(cmd *cobra.Command) (queen.Config, error) {
	logger, err := f.log.logger(cmd.ErrOrStderr())
	if err != nil {
		return queen.Config{}, err
	}
	if err := notZero(cmd.Flags(), "heartbeat-timeout", "offline-retention", "flush-interval", "hive-timeout", "max-body-bytes", "claim-timeout", "claim-health-interval",
		"hive-stop-timeout", "lease-duration", "lease-renew", "affinity-ttl", "queue-size", "queue-timeout", "swap-wait", "scale-up-after", "max-workers", "worker-slots", "models-refresh",
		"strike-limit", "crashloop-failures", "crashloop-window", "crashloop-backoff", "stable-after", "config-poll",
		"batch-max-file-bytes", "batch-max-attempts", "batch-concurrency", "batch-max-lines", "batch-max-files", "batch-max-open-batches",
		"batch-attempt-timeout", "batch-max-answer-bytes"); err != nil {
		return queen.Config{}, err
	}
	for name, d := range map[string]*time.Duration{"--audit-retention": &f.auditRetention, "--rows-retention": &f.rowsRetention,
		"--batch-file-retention": &f.batchRetention} {
		switch {
		case *d < 0:
			return queen.Config{}, usagef("%s must not be negative (0 keeps forever), got %s", name, *d)
		case *d == 0:
			*d = queen.KeepForever
		}
	}
	if !cmd.Flags().Changed("database-url") {
		f.databaseURL = os.Getenv(databaseURLEnv)
	}
	dataDir, err := filepath.Abs(f.dataDir)
	if err != nil {
		return queen.Config{}, usagef("--data-dir %q: %v", f.dataDir, err)
	}
	routing := f.routing.config()
	localHive, hiveArgs := f.localHive, f.hiveArgs
	kc, err := f.kube.config()
	if err != nil {
		return queen.Config{}, err
	}
	if kc != nil {
		// Kubernetes mode: the queen's local hive runs the workers as Pods.
		localHive, hiveArgs = true, append(kubeHiveArgs(kc), hiveArgs...)
	}
	return queen.Config{
		Addr: f.addr, Advertise: f.advertise, DataDir: dataDir, DatabaseURL: f.databaseURL, Standby: f.standby,
		LeaseDuration: f.leaseDuration, LeaseRenew: f.leaseRenew,
		HeartbeatTimeout: f.heartbeatTimeout, UnhealthyGrace: f.unhealthyGrace, OfflineRetention: f.offlineRetention,
		FlushInterval: f.flushInterval, HiveTimeout: f.hiveTimeout, ClaimTimeout: f.claimTimeout, ClaimHealthInterval: f.claimHealthInterval,
		AuditRetention: f.auditRetention, RowsRetention: f.rowsRetention, ModelsFile: f.modelsFile, ModelsPoll: f.modelsPoll,
		Tokens: secret.TokensFromEnv(), MaxBodyBytes: f.maxBody, Routing: routing, TLS: f.tls, CORSOrigins: f.corsOrigins,
		Batch: batch.Config{MaxFileBytes: f.batchMaxFile, FileRetention: f.batchRetention, MaxAttempts: f.batchAttempts, Concurrency: f.batchConcurrency,
			MaxLines: f.batchMaxLines, MaxFiles: f.batchMaxFiles, MaxOpenBatches: f.batchMaxOpen, AttemptTimeout: f.batchAttemptTimeout,
			MaxAnswerBytes: f.batchMaxAnswer},
		Ownership: queen.OwnershipConfig{Owner: f.owner, Hives: fleet.Hives{LocalHive: localHive, LocalWorkersOutlive: kc != nil, HiveArgs: hiveArgs, PassEnv: f.passEnv,
			SSH: sshnode.Client{ConfigFile: f.sshConfig, ConnectTimeout: f.sshTimeout}, HiveStopTimeout: f.hiveStopTimeout}},
		Logger: logger,
	}, nil
}

// runReloading runs q, reloading its model config on each SIGHUP (a
// reload logs and audits itself, good or bad).
func runReloading(ctx context.Context, q *queen.Queen) error {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wg.Go(func() {
		for {
			select {
			case <-hup:
				_ = q.Reload(ctx)
			case <-ctx.Done():
				return
			}
		}
	})
	return q.Run(ctx)
}

// envDefault says where a secret flag's default comes from, and whether
// it is set, without its value.
func envDefault(env string) string {
	if os.Getenv(env) == "" {
		return "(default $" + env + ", not set)"
	}
	return "(default: set from $" + env + ")"
}

// openLifeline opens the lifeline --lifeline names: none for "", this
// process's stdin for "stdin" (with the preamble's variables of allowed).
func openLifeline(flag string, allowed []string) (io.ReadCloser, map[string]string, error) {
	switch flag {
	case "":
		return nil, nil, nil
	case "stdin":
		return procs.StdinLifeline(allowed)
	}
	return nil, nil, usagef("--lifeline %q: the only lifeline is stdin", flag)
}
