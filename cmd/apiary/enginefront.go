package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/apiary-llm/apiary/internal/config"
	"github.com/apiary-llm/apiary/internal/front"
	"github.com/apiary-llm/apiary/internal/secret"
	"github.com/apiary-llm/apiary/internal/transport"
)

// engineFrontFlags are the command line of `apiary engine-front`.
type engineFrontFlags struct {
	tls           transport.ServerTLS
	workerID      string
	modelRef      string
	host          string
	port          int
	listenFD      int
	callbackURL   string
	engineURL     string
	health        string
	memoryBytes   uint64
	slots         int
	shutdownGrace time.Duration
	stopWait      time.Duration
	passEnv       []string
	log           logFlags
}

func newEngineFrontCmd() *cobra.Command {
	var f engineFrontFlags
	cmd := &cobra.Command{
		Use:   "engine-front --engine-url URL [flags] -- PROGRAM [ARG...]",
		Short: "Run an external engine behind the worker API (a hive starts it)",
		Long: `Run an external OpenAI-compatible server (llama-server, vLLM, ...) as a
worker: start PROGRAM, wait for its --health path at --engine-url to answer
200, send the ready callback, then relay every request to it unchanged but
for the bearer, counting the requests in flight for /health, as the built-in
worker does. A hive starts it for the engines of its --engines file
(docs/engines.md).

The worker's token comes from $` + secret.WorkerTokenEnv + `: every request but
GET (or HEAD) /health must carry it. The engine's own bearer, if any, comes from
$` + secret.EngineKeyEnv + `; neither reaches PROGRAM's environment, which holds
only PATH, HOME, locale, CUDA_* and the rest of the allow-list
(docs/security.md) and what --pass-env names. SIGTERM,
SIGINT or POST /v1/admin/shutdown drain: requests in flight get
--shutdown-grace, then PROGRAM gets SIGTERM, and SIGKILL after --stop-wait.
When PROGRAM exits on its own, this command ends as it did (the same exit
code, or killed by the same signal).`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runEngineFront(cmd.Context(), f, args, cmd.ErrOrStderr())
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.workerID, "worker-id", "", "id of this worker, sent in the ready callback (required with --callback-url)")
	fl.StringVar(&f.modelRef, "model-ref", "", "the model's name, reported on /health")
	fl.StringVar(&f.host, "host", "127.0.0.1", "address to listen on")
	fl.IntVar(&f.port, "port", 0, "port to listen on")
	fl.IntVar(&f.listenFD, "listen-fd", 0, "serve on this inherited listening socket (a hive binds the port and passes it) instead of binding --host and --port")
	fl.StringVar(&f.callbackURL, "callback-url", "", "URL to POST the ready callback to; none: serve standalone")
	fl.StringVar(&f.engineURL, "engine-url", "", "where PROGRAM serves: http://127.0.0.1:PORT (required; loopback only)")
	fl.StringVar(&f.health, "health", front.DefaultHealthPath, "PROGRAM's health path: 200 means it serves")
	fl.Uint64Var(&f.memoryBytes, "memory-bytes", 0, "vram_bytes of the ready callback; 0: PROGRAM's resident set")
	fl.IntVar(&f.slots, "slots", 1, "generations PROGRAM runs at once, reported on /health")
	fl.DurationVar(&f.shutdownGrace, "shutdown-grace", front.DefaultShutdownGrace, "time requests in flight get to finish on shutdown")
	fl.DurationVar(&f.stopWait, "stop-wait", front.DefaultStopWait, "SIGTERM to SIGKILL of PROGRAM")
	fl.StringSliceVar(&f.passEnv, "pass-env", nil, "variables PROGRAM gets besides the allow-list: NAME or PREFIX*, comma-separated or repeated (a hive sets them)")
	addTLSFlags(fl, &f.tls)
	f.log.add(fl)
	return cmd
}

// runEngineFront runs the front until it is shut down or its engine
// exits; then it ends as the engine did.
func runEngineFront(ctx context.Context, f engineFrontFlags, args []string, stderr io.Writer) error {
	logger, err := f.log.logger(stderr)
	if err != nil {
		return fmt.Errorf("engine-front: %w", err)
	}
	if f.port < 0 || f.port > 65535 {
		return usagef("engine-front: --port %d is not a port number", f.port)
	}
	if err := secret.CheckPassEnv(f.passEnv); err != nil {
		return usagef("engine-front: --pass-env: %w", err)
	}
	var ln net.Listener
	if f.listenFD != 0 {
		if ln, err = inheritedListener(f.listenFD, f.port); err != nil {
			return usagef("engine-front: %w", err)
		}
	} else {
		token := os.Getenv(secret.WorkerTokenEnv)
		if token == "" && !transport.IsLoopback(f.host) {
			return usagef("engine-front: without %s the front binds loopback only; %q is not a loopback address", secret.WorkerTokenEnv, f.host)
		}
		if ln, err = net.Listen("tcp", net.JoinHostPort(f.host, strconv.Itoa(f.port))); err != nil {
			return fmt.Errorf("engine-front: %w", err)
		}
	}
	fr, err := front.New(front.Config{
		WorkerID: f.workerID, ModelRef: f.modelRef, Listener: ln,
		Token:       os.Getenv(secret.WorkerTokenEnv),
		CallbackURL: f.callbackURL,
		Engine:      front.Command{Path: args[0], Args: args[1:], Env: secret.ChildEnv(os.Environ(), f.passEnv)},
		EngineURL:   f.engineURL, HealthPath: f.health, EngineKey: os.Getenv(secret.EngineKeyEnv),
		MemoryBytes: f.memoryBytes, Slots: f.slots, ShutdownGrace: f.shutdownGrace, StopWait: f.stopWait,
		TLS: f.tls, Logger: logger,
	})
	if err != nil {
		ln.Close()
		if errors.Is(err, front.ErrInvalidConfig) {
			// Each problem by the flag or variable it came from.
			var problems []error
			for _, fe := range config.Fields(err) {
				problems = append(problems, fe)
			}
			return usagef("engine-front: %v", config.Rename(errors.Join(problems...), frontFields))
		}
		return err
	}
	err = fr.Run(ctx)
	var ee *front.EngineExitError
	if !errors.As(err, &ee) {
		return err
	}
	if ee.Exit.Code >= 0 {
		return &exitError{code: ee.Exit.Code, err: err}
	}
	// Killed by a signal: end by the same one, so that the hive reports
	// the engine's end as it would a worker's.
	printError(stderr, err)
	signal.Reset(ee.Exit.Signal)
	_ = syscall.Kill(os.Getpid(), ee.Exit.Signal)
	return &exitError{code: 128 + int(ee.Exit.Signal)} // a signal that does not end a process
}
