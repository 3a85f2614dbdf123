package main

import (
	"context"
	"errors"
	"fmt"
	"github.com/apiary-llm/apiary/internal/api"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/apiary-llm/apiary/internal/cpuvariant"
	"github.com/apiary-llm/apiary/internal/engine"
	"github.com/apiary-llm/apiary/internal/gpu"
	"github.com/apiary-llm/apiary/internal/llamacpp"
	"github.com/apiary-llm/apiary/internal/secret"
	"github.com/apiary-llm/apiary/internal/transport"
	"github.com/apiary-llm/apiary/internal/worker"
	"github.com/spf13/cobra"
)

// workerFlags are the command line of `apiary worker`.
type workerFlags struct {
	tls           transport.ServerTLS
	workerID      string
	model         string
	gpuDevice     int
	gpuDevices    []int
	splitMode     string
	gpuLayers     int
	mmproj        string
	host          string
	port          int
	listenFD      int
	callbackURL   string
	queenURL      string
	advertise     string
	lifecycleID   string
	kvCacheDir    string
	kvCacheDisk   string
	ctxSize       int
	slots         int
	threads       int
	queue         int
	shutdownGrace time.Duration
	claimInterval time.Duration
	log           logFlags
}

func newWorkerCmd() *cobra.Command {
	var f workerFlags
	cmd := &cobra.Command{
		Use:   "worker --model PATH --port P [flags]",
		Short: "Serve one model on one device",
		Long: `Serve one GGUF model over the OpenAI-compatible API (/v1/completions,
/v1/chat/completions, /v1/models), with /health and /v1/admin/shutdown.

A hive starts workers with --callback-url: the worker reports ready there once
it listens and the model is loaded. A worker run by hand joins a queen with
--queen URL: once the model is loaded it claims the row --lifecycle-id (one
created with placement operator) or, without it, a row of its own, and the
queen routes to it; the cluster token comes from $` + secret.ClusterTokenEnv + `. With
neither it serves standalone. The worker's token comes from $` + worker.TokenEnv + `, never from
the command line; without one the worker binds a loopback address only.
SIGTERM or SIGINT drains: in-flight generations get --shutdown-grace to finish.`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usagef("unexpected argument %q: `apiary worker` runs one worker process; to list or manage workers, did you mean `apiary workers %s`?",
					args[0], strings.Join(args, " "))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runWorker(cmd.Context(), f, cmd.ErrOrStderr())
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.workerID, "worker-id", "", "id of this worker, sent in the ready callback (required with --callback-url)")
	fl.StringVar(&f.model, "model", "", "path of the GGUF model file to serve (required); its name without .gguf is the model id")
	fl.IntVar(&f.gpuDevice, "gpu-device", -1, "GPU to load the model on, with the CUDA backend beside the binary (or in $"+gpu.BackendDirEnv+"); -1 runs on the CPU. A GPU the worker cannot use is an error, never a fallback to the CPU")
	fl.IntSliceVar(&f.gpuDevices, "gpu-devices", nil, "GPUs to split the model over, comma-separated (0,1): for a model too big for one; not with --gpu-device (one GPU is --gpu-device N)")
	fl.StringVar(&f.splitMode, "split-mode", engine.SplitLayer, "with --gpu-devices, how the model is split: layer (whole layers on each GPU, in proportion to their free memory) or row (each layer's rows over the GPUs)")
	fl.IntVar(&f.gpuLayers, "gpu-layers", 0, "layers to offload to the GPU; 0 offloads all")
	fl.StringVar(&f.mmproj, "mmproj", "", "vision projector GGUF to load beside the model (default: mmproj-M.gguf beside M.gguf, when there is one)")
	fl.StringVar(&f.host, "host", "127.0.0.1", "address to listen on")
	fl.IntVar(&f.port, "port", 0, "port to listen on; 0 picks a free one (logged, and reported in the ready callback)")
	fl.IntVar(&f.listenFD, "listen-fd", 0, "serve on this inherited listening socket (a hive binds the port and passes it) instead of binding --host and --port")
	fl.StringVar(&f.callbackURL, "callback-url", "", "URL to POST the ready callback to; none: serve standalone")
	fl.StringVar(&f.queenURL, "queen", "", "URL of the queen to claim a row at once the model is loaded (a worker run by hand), or the URLs of queens sharing one PostgreSQL database, comma-separated (it follows the active one); not with --callback-url")
	fl.StringVar(&f.lifecycleID, "lifecycle-id", "", "the queen's lifecycle id of this worker: with --queen, the row to claim (default: the queen creates one)")
	fl.DurationVar(&f.claimInterval, "claim-interval", worker.DefaultClaimInterval, "with --queen, how often the claimed row is claimed again, so that a restarted queen routes to this worker again")
	fl.StringVar(&f.advertise, "advertise", "", "URL the queen or hive reaches this worker at (default http://HOST:PORT)")
	fl.IntVar(&f.ctxSize, "ctx-size", 0, "total context in tokens, shared by the slots; 0: the model's, at most 4096 per slot")
	fl.IntVar(&f.slots, "slots", worker.DefaultSlots, "generations run in parallel")
	fl.IntVar(&f.threads, "threads", 0, "CPU threads; 0: one per CPU")
	fl.IntVar(&f.queue, "queue", 0, "requests that may wait for a slot; 0: 4 per slot, -1: none")
	fl.StringVar(&f.kvCacheDir, "kv-cache-dir", "", "directory to save the slots' KV cache in on a graceful stop and restore it from at start (a hive passes DATA_DIR/kvcache); none: no save")
	fl.StringVar(&f.kvCacheDisk, "kv-cache-disk", "2GiB", "disk budget of the saves in --kv-cache-dir; the least recently used past it are removed")
	fl.DurationVar(&f.shutdownGrace, "shutdown-grace", worker.DefaultShutdownGrace, "time in-flight generations get to finish on shutdown")
	addTLSFlags(fl, &f.tls)
	f.log.add(fl)
	return cmd
}

// runWorker checks the flags, then runs the worker until it is shut down.
func runWorker(ctx context.Context, f workerFlags, stderr io.Writer) error {
	if f.model == "" {
		return usagef("--model is required")
	}
	if f.port < 0 || f.port > 65535 {
		return usagef("--port %d is not a port number", f.port)
	}
	if f.slots < 1 {
		return usagef("--slots must be at least 1, got %d", f.slots)
	}
	if f.queue < -1 {
		return usagef("--queue must be -1 (no queue) or more, got %d", f.queue)
	}
	if f.shutdownGrace <= 0 {
		return usagef("--shutdown-grace must be positive, got %s", f.shutdownGrace)
	}
	if f.claimInterval <= 0 {
		return usagef("--claim-interval must be positive, got %s", f.claimInterval)
	}
	if err := checkGPUDevices(&f); err != nil {
		return err
	}
	kvDisk, err := api.ParseBytes(f.kvCacheDisk)
	if err != nil || kvDisk == 0 || kvDisk > 1<<62 {
		return usagef("--kv-cache-disk %q: a size such as 2GiB, more than 0", f.kvCacheDisk)
	}
	logger, err := f.log.logger(stderr)
	if err != nil {
		return err
	}

	// llama.cpp's CPU backend is the best level this CPU runs, loaded
	// from beside the binary (or the one APIARY_CPU_VARIANT names).
	cpuBackend, err := llamacpp.CPUBackend(logger)
	if err != nil {
		if os.Getenv(cpuvariant.Env) != "" {
			return usagef("%w", err)
		}
		return err
	}

	// A worker asked for a GPU runs on it or not at all: the GPU backend
	// is loaded from beside the binary before anything else.
	if len(f.gpuDevices) > 0 {
		for _, d := range f.gpuDevices {
			if err := llamacpp.UseGPU(gpu.BackendDir(), d, logger); err != nil {
				return fmt.Errorf("--gpu-devices %s: %w", joinInts(f.gpuDevices), err)
			}
		}
	} else if f.gpuDevice >= 0 {
		if err := llamacpp.UseGPU(gpu.BackendDir(), f.gpuDevice, logger); err != nil {
			return fmt.Errorf("--gpu-device %d: %w", f.gpuDevice, err)
		}
	}

	addr := net.JoinHostPort(f.host, strconv.Itoa(f.port))
	var ln net.Listener
	if f.listenFD != 0 {
		if ln, err = inheritedListener(f.listenFD, f.port); err != nil {
			return usagef("%w", err)
		}
		addr = ln.Addr().String()
	}

	cfg := worker.Config{
		WorkerID:      f.workerID,
		ModelPath:     f.model,
		Addr:          addr,
		Listener:      ln,
		CallbackURL:   f.callbackURL,
		QueenURL:      f.queenURL,
		ClusterToken:  os.Getenv(secret.ClusterTokenEnv),
		Advertise:     f.advertise,
		LifecycleID:   f.lifecycleID,
		ClaimInterval: f.claimInterval,
		Token:         os.Getenv(worker.TokenEnv),
		TLS:           f.tls,
		Slots:         f.slots,
		QueueSize:     f.queue,
		ShutdownGrace: f.shutdownGrace,
		TestHoldDir:   os.Getenv(worker.TestHoldEnv),
		KVCacheDir:    f.kvCacheDir,
		KVCacheDisk:   int64(kvDisk),
		Engine: engine.Options{
			CtxSize:    f.ctxSize,
			Threads:    f.threads,
			GPUDevice:  f.gpuDevice,
			GPUDevices: f.gpuDevices,
			SplitMode:  f.splitMode,
			GPULayers:  f.gpuLayers,
			Projector:  f.mmproj,
		},
		CPUBackend:       cpuBackend.Name,
		CPUBackendReason: cpuBackend.Reason,
		Logger:           logger,
	}
	load := func(ctx context.Context, opts engine.Options, log *slog.Logger) (engine.Engine, error) {
		return llamacpp.Load(ctx, opts, log)
	}
	if cfg.TestHoldDir != "" {
		logger.Warn("generations are held while a file named the model exists in $"+worker.TestHoldEnv+" (a test knob)", "dir", cfg.TestHoldDir)
	}
	w, err := worker.New(cfg, load)
	if err != nil && ln != nil {
		ln.Close()
	}
	if errors.Is(err, worker.ErrInvalidConfig) {
		return usagef("%w", err)
	}
	if err != nil {
		return err
	}
	return daemonError(w.Run(ctx))
}

// inheritedListener turns fd, a listening TCP socket this process
// inherited, into a net.Listener; port, when not 0, is the port it must be
// bound to.
func inheritedListener(fd, port int) (net.Listener, error) {
	if fd < 3 {
		return nil, fmt.Errorf("--listen-fd %d: descriptors 0-2 are standard input and output; an inherited socket is 3 or above", fd)
	}
	file := os.NewFile(uintptr(fd), "listen-fd")
	ln, err := net.FileListener(file)
	file.Close()
	if err != nil {
		return nil, fmt.Errorf("--listen-fd %d is not a listening socket this process inherited: %w", fd, err)
	}
	tcp, ok := ln.Addr().(*net.TCPAddr)
	if !ok {
		ln.Close()
		return nil, fmt.Errorf("--listen-fd %d is a %s socket, not TCP", fd, ln.Addr().Network())
	}
	if port != 0 && tcp.Port != port {
		ln.Close()
		return nil, fmt.Errorf("--listen-fd %d listens on %s, but --port says %d", fd, tcp, port)
	}
	return ln, nil
}

// checkGPUDevices checks --gpu-devices and --split-mode; one device is
// --gpu-device N, and several set --gpu-device to the first.
func checkGPUDevices(f *workerFlags) error {
	if f.splitMode != engine.SplitLayer && f.splitMode != engine.SplitRow {
		return usagef("--split-mode %q: layer or row", f.splitMode)
	}
	if len(f.gpuDevices) == 0 {
		return nil
	}
	if f.gpuDevice >= 0 {
		return usagef("--gpu-device and --gpu-devices together: one GPU is --gpu-device N, several --gpu-devices N,M")
	}
	seen := map[int]bool{}
	for _, d := range f.gpuDevices {
		if d < 0 || seen[d] {
			return usagef("--gpu-devices %s: GPU numbers from 0, each once", joinInts(f.gpuDevices))
		}
		seen[d] = true
	}
	f.gpuDevice = f.gpuDevices[0]
	if len(f.gpuDevices) == 1 {
		f.gpuDevices = nil
	}
	return nil
}

// joinInts is ns comma-separated, as a flag takes them.
func joinInts(ns []int) string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}
