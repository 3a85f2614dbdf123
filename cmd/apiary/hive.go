package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/hive"
	"github.com/apiary-llm/apiary/internal/modelstore"
	"github.com/apiary-llm/apiary/internal/sdnotify"
	"github.com/apiary-llm/apiary/internal/secret"
	"github.com/apiary-llm/apiary/internal/transport"
)

// hiveFlags are the flags of `apiary hive`; toConfig turns them into a
// hive.Config.
type hiveFlags struct {
	tls                                    transport.ServerTLS
	addr, advertise, queen, poolID, nodeID string
	dataDir, modelsDir, ports              string
	ctxSize, threads, slots                int
	splitMode                              string
	callbackTimeout, healthInterval        time.Duration
	stopGrace, shutdownAck                 time.Duration
	idleTimeout, heartbeatInterval         time.Duration
	pullStallTimeout                       time.Duration
	cpuMemory                              string
	maxLoaded                              int
	kvCacheDisk                            string
	logRetention                           time.Duration
	log                                    logFlags
	owner, lifeline, workerPath            string
	engines                                string
	leaseTimeout                           time.Duration
	passEnv                                []string
	kube                                   kubeFlags
}

func newHiveCmd() *cobra.Command {
	f := &hiveFlags{}
	cmd := &cobra.Command{
		Use:   "hive",
		Short: "Run the pool manager daemon of this node",
		Long: `Run the pool manager daemon of this node: it spawns, watches and stops the
node's workers, reports its devices, and registers with the queen (--queen).

Tokens come from the environment: APIARY_CLUSTER_TOKEN authenticates the hive's
API and its calls to the queen; without it the hive binds loopback only.
A queen that does not answer is not an error: the hive works standalone and
registers when the queen comes back. --queen "" disables the queen.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := f.toConfig(cmd)
			if err != nil {
				return err
			}
			lf, env, err := openLifeline(f.lifeline, hive.LifelineEnv)
			if err != nil {
				return err
			}
			cfg.Lifeline = lf
			if tok := env[secret.ClusterTokenEnv]; tok != "" {
				cfg.ClusterToken = tok
			}
			if tok := env[secret.HFTokenEnv]; tok != "" {
				cfg.HFToken = tok
			}
			notifier, err := sdnotify.FromEnv()
			if err != nil {
				return err
			}
			h, err := hive.New(cfg)
			if err != nil {
				return configError(err, hiveFields)
			}
			d := sdnotify.Daemon{Serving: h.Settled(), Done: h.Done(), Alive: h.Alive, Status: h.Summary}
			return notifying(cmd.Context(), notifier, d, cfg.Logger, h.Run) // context.Canceled is a clean exit (exitCode)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.addr, "addr", hive.DefaultAddr, "address the hive listens on")
	fl.StringVar(&f.advertise, "advertise", "", "URL the queen and workers use to reach this hive (default http://ADDR)")
	fl.StringVar(&f.queen, "queen", defaultQueenURL(), `queen URL to register with ("" for standalone); URL1,URL2 for queens sharing one PostgreSQL database: the active one is followed`)
	fl.StringVar(&f.poolID, "pool-id", "", "pool id reported to the queen, one per live hive (default: --node-id when given, else the host name and a hash of the machine id)")
	fl.StringVar(&f.nodeID, "node-id", "", "node id reported to the queen (default: host name)")
	fl.StringVar(&f.dataDir, "data-dir", hive.DefaultDataDir(), "directory for the hive's records and worker logs")
	fl.StringVar(&f.modelsDir, "models-dir", "", "directory of GGUF models (default DATA_DIR/models)")
	fl.StringVar(&f.ports, "worker-ports", fmt.Sprintf("%d-%d", hive.DefaultPortMin, hive.DefaultPortMax), "port range for workers, FROM-TO")
	fl.IntVar(&f.ctxSize, "worker-ctx-size", 0, "context size for workers (0: the model's, at most 4096)")
	fl.IntVar(&f.threads, "worker-threads", 0, "CPU threads of each worker (0: one per CPU); workers sharing CPUs should split them")
	fl.StringVar(&f.splitMode, "split-mode", "layer", "how a worker split over several GPUs of this node (a model too big for one) splits its model: layer (whole layers on each GPU, in proportion to their free memory) or row")
	fl.IntVar(&f.slots, "worker-slots", 0, "generations each worker runs at once (0: the worker's default, 1); tell the queen the same (its --worker-slots)")
	fl.DurationVar(&f.callbackTimeout, "callback-timeout", hive.DefaultCallbackTimeout, "ready callback deadline after spawn; then SIGKILL and failed")
	fl.DurationVar(&f.healthInterval, "health-interval", hive.DefaultHealthInterval, "period of each worker's /health check (3 misses in a row: failed)")
	fl.DurationVar(&f.stopGrace, "stop-grace", hive.DefaultStopGrace, "graceful stop budget before SIGTERM")
	fl.DurationVar(&f.shutdownAck, "shutdown-ack", hive.DefaultShutdownAck, "wait for a worker's shutdown acknowledgement, and from SIGTERM to SIGKILL")
	fl.DurationVar(&f.idleTimeout, "idle-timeout", hive.DefaultIdleTimeout, "stop a ready worker without requests for this long (0: never)")
	fl.StringVar(&f.cpuMemory, "cpu-memory", "", "memory the CPU device offers workers, e.g. 24GiB (default: the machine's); the queen evicts idle workers to make room within it")
	fl.StringVar(&f.kvCacheDisk, "kv-cache-disk", "2GiB", "disk the KV caches of stopped workers may take under DATA_DIR/hive/kvcache, for the next worker of the model to restore (least recently used removed first); 0: workers save none")
	fl.IntVar(&f.maxLoaded, "max-loaded", 0, "most workers this hive runs at once, of any models (0: no limit but memory); the queen evicts idle workers to make room within it")
	fl.DurationVar(&f.logRetention, "log-retention", hive.DefaultLogRetention, "remove ended workers' log files last written longer ago, hourly (0: keep forever)")
	fl.DurationVar(&f.heartbeatInterval, "heartbeat-interval", hive.DefaultHeartbeatInterval, "period of heartbeats to the queen")
	fl.DurationVar(&f.pullStallTimeout, "pull-stall-timeout", modelstore.DefaultStallTimeout,
		"a model pull's connection that sends no byte for this long is dropped and the download resumed from where it was")
	fl.StringVar(&f.owner, "owner", hive.OwnerOperator, "who started this hive: operator, or queen/keeper (then it must not outlive them)")
	fl.StringVar(&f.lifeline, "lifeline", "", `"stdin": the parent holds this hive's stdin; its end shuts the hive down (with --owner queen|keeper)`)
	fl.StringVar(&f.engines, "engines", "", "YAML file of the external engines this hive can run besides the built-in one (docs/engines.md)")
	fl.StringSliceVar(&f.passEnv, "pass-env", nil, "variables of this hive's environment its workers and engines get besides PATH, HOME, locale, CUDA_* and the rest of the allow-list (docs/security.md): NAME or PREFIX*, comma-separated or repeated, e.g. --pass-env 'HF_HOME,VLLM_*'")
	fl.StringVar(&f.workerPath, "worker-path", "", "binary run as a worker with the worker's flags (default: this apiary; tests use it)")
	_ = fl.MarkHidden("worker-path")
	fl.DurationVar(&f.leaseTimeout, "lease-timeout", 0, "shut down when the queen answered no heartbeat for this long (with --owner queen|keeper; 0: never)")
	addTLSFlags(fl, &f.tls)
	f.kube.add(fl)
	f.log.add(fl)
	groupFlags(cmd, hiveFlagGroups)
	return cmd
}

// hiveFlagGroups are the headings of `apiary hive --help`.
var hiveFlagGroups = []flagGroup{
	{"Network and TLS", []string{"addr", "advertise", "tls-cert", "tls-key"}},
	{"Queen and pool", []string{"queen", "pool-id", "node-id", "heartbeat-interval", "lease-timeout", "shutdown-ack", "owner", "lifeline"}},
	{"Models and storage", []string{"data-dir", "models-dir", "engines", "pull-stall-timeout", "log-retention", "kv-cache-disk"}},
	{"Workers", []string{"max-loaded", "cpu-memory", "worker-ports", "worker-slots", "worker-threads", "worker-ctx-size", "split-mode", "idle-timeout",
		"callback-timeout", "health-interval", "stop-grace", "pass-env"}},
	{"Kubernetes", kubeFlagNames},
	{"Logs", []string{"log-level", "log-json"}},
}

// queenFlagUsage is the help of the keeper commands' --queen.
const queenFlagUsage = "queen URL (from $APIARY_QUEEN when set); URL1,URL2 for queens sharing one PostgreSQL database: the active one is asked"

func defaultQueenURL() string {
	if u, ok := os.LookupEnv("APIARY_QUEEN"); ok {
		return u
	}
	return "http://127.0.0.1:8080"
}

func (f *hiveFlags) toConfig(cmd *cobra.Command) (hive.Config, error) {
	from, to, ok := strings.Cut(f.ports, "-")
	pmin, err1 := strconv.Atoi(from)
	pmax, err2 := strconv.Atoi(to)
	if !ok || err1 != nil || err2 != nil {
		return hive.Config{}, usagef("--worker-ports %q: want FROM-TO, e.g. 8001-8999", f.ports)
	}
	logger, err := f.log.logger(cmd.ErrOrStderr())
	if err != nil {
		return hive.Config{}, err
	}
	if err := notZero(cmd.Flags(), "callback-timeout", "health-interval", "stop-grace", "shutdown-ack", "heartbeat-interval",
		"pull-stall-timeout"); err != nil {
		return hive.Config{}, err
	}
	idle, logRetention := f.idleTimeout, f.logRetention
	if idle == 0 {
		idle = -1 // the flag's 0 means never
	}
	switch {
	case logRetention == 0:
		logRetention = -1 // forever
	case logRetention < 0:
		return hive.Config{}, usagef("--log-retention must not be negative, got %s", f.logRetention)
	}
	dataDir, err := filepath.Abs(f.dataDir)
	if err != nil {
		return hive.Config{}, usagef("--data-dir %q: %v", f.dataDir, err)
	}
	modelsDir := f.modelsDir
	if modelsDir != "" {
		if modelsDir, err = filepath.Abs(modelsDir); err != nil {
			return hive.Config{}, usagef("--models-dir %q: %v", f.modelsDir, err)
		}
	}
	var cpuMemory uint64
	if f.cpuMemory != "" {
		if cpuMemory, err = api.ParseBytes(f.cpuMemory); err != nil || cpuMemory == 0 {
			if err == nil {
				err = fmt.Errorf("0 leaves the CPU no memory for a worker")
			}
			return hive.Config{}, usagef("--cpu-memory: %v", err)
		}
	}
	kvCacheDisk, err := api.ParseBytes(f.kvCacheDisk)
	if err != nil {
		return hive.Config{}, usagef("--kv-cache-disk: %v", err)
	}
	if f.maxLoaded < 0 || f.maxLoaded > hive.MaxMaxLoaded {
		return hive.Config{}, usagef("--max-loaded must be from 0 (no limit) to %d, got %d", hive.MaxMaxLoaded, f.maxLoaded)
	}
	kc, err := f.kube.config()
	if err != nil {
		return hive.Config{}, err
	}
	if kc != nil && kc.ModelsHostPath != "" && modelsDir == "" {
		modelsDir = kc.ModelsHostPath // the Pods' models are the hive's
	}
	var engines map[string]hive.Engine
	if f.engines != "" {
		if engines, err = hive.LoadEngines(f.engines); err != nil {
			return hive.Config{}, usagef("--engines: %v", err)
		}
	}
	return hive.Config{
		Engines: engines,
		Addr:    f.addr, Advertise: f.advertise, DataDir: dataDir, ModelsDir: modelsDir,
		PortMin: pmin, PortMax: pmax, CtxSize: f.ctxSize, WorkerThreads: f.threads, SplitMode: f.splitMode, WorkerSlots: f.slots,
		CallbackTimeout: f.callbackTimeout, HealthInterval: f.healthInterval,
		StopGrace: f.stopGrace, ShutdownAck: f.shutdownAck, IdleTimeout: idle, LogRetention: logRetention,
		HeartbeatInterval: f.heartbeatInterval, CPUMemory: cpuMemory, MaxLoaded: f.maxLoaded, KVCacheDisk: kvCacheDisk, PullStallTimeout: f.pullStallTimeout,
		QueenURL: f.queen, PoolID: f.poolID, NodeID: f.nodeID,
		ClusterToken: os.Getenv(secret.ClusterTokenEnv),
		TLS:          f.tls, PassEnv: f.passEnv,
		Owner: f.owner, LeaseTimeout: f.leaseTimeout, WorkerPath: f.workerPath,
		Kube:   kc,
		Logger: logger,
	}, nil
}
