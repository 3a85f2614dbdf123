package hive

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/config"
	"github.com/apiary-llm/apiary/internal/gpu"
	"github.com/apiary-llm/apiary/internal/kube"
	"github.com/apiary-llm/apiary/internal/lifecycle"
	"github.com/apiary-llm/apiary/internal/procs"
	"github.com/apiary-llm/apiary/internal/secret"
	"github.com/apiary-llm/apiary/internal/transport"
)

// modelPath resolves a model_ref to <models-dir>/<ref>.gguf. A ref is a
// plain name: path separators, "..", and NUL are refused.
func (h *Hive) modelPath(ref string) (string, error) {
	switch {
	case ref == "":
		return "", fmt.Errorf("%w: model_ref is empty", ErrInvalidModelRef)
	case strings.ContainsAny(ref, `/\`+"\x00"), strings.Contains(ref, ".."), ref == ".":
		return "", fmt.Errorf("%w: %q must be a model name, not a path", ErrInvalidModelRef, ref)
	}
	path := filepath.Join(h.cfg.ModelsDir, strings.TrimSuffix(ref, ".gguf")+".gguf")
	st, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("%w: %q is not in %s", ErrModelNotFound, ref, h.cfg.ModelsDir)
	}
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrInvalidModel, err)
	}
	if !st.Mode().IsRegular() {
		return "", fmt.Errorf("%w: %s is not a regular file", ErrInvalidModel, path)
	}
	return path, nil
}

// chooseDevice picks the requested device, or else, of the usable ones,
// a GPU where need fits before the CPU (a GPU node offers its CPU too),
// the one with the most available memory among equals. When need fits
// nowhere it is the roomiest, whose admission then says so. A device
// marked unusable is refused.
func chooseDevice(devs []gpu.Device, want *int, need uint64, heldOf func(int) held) (gpu.Device, error) {
	if want != nil {
		for _, d := range devs {
			if d.ID == *want {
				if d.Unusable != "" {
					return gpu.Device{}, fmt.Errorf("%w: %s device %d: %s", ErrDeviceUnusable, d.Kind, d.ID, d.Unusable)
				}
				return d, nil
			}
		}
		return gpu.Device{}, fmt.Errorf("%w: gpu_device %d (this node has %d)", ErrDeviceNotFound, *want, len(devs))
	}
	if len(devs) == 0 {
		return gpu.Device{}, fmt.Errorf("%w: the node reports no device", ErrDeviceNotFound)
	}
	// rank orders devices: fits, then a GPU, then more available; each
	// device's is made once (heldOf takes the registry's lock).
	type rank struct {
		fits, gpu bool
		avail     uint64
	}
	better := func(a, b rank) bool {
		switch {
		case a.fits != b.fits:
			return a.fits
		case a.fits && a.gpu != b.gpu:
			return a.gpu
		}
		return a.avail > b.avail
	}
	var best *gpu.Device
	var bestRank rank
	for i, d := range devs {
		if d.Unusable != "" {
			continue
		}
		a := available(d, heldOf(d.ID))
		r := rank{fits: a >= need, gpu: d.Kind != gpu.KindCPU, avail: a}
		if best == nil || better(r, bestRank) {
			best, bestRank = &devs[i], r
		}
	}
	if best == nil {
		return gpu.Device{}, fmt.Errorf("%w: every device of this node is unusable (device %d: %s)", ErrDeviceUnusable, devs[0].ID, devs[0].Unusable)
	}
	return *best, nil
}

// startWorker runs preflight (model, architecture, memory), takes a port,
// spawns the worker and hands it to its owner goroutine in state starting.
func (h *Hive) startWorker(ctx context.Context, req api.StartWorkerRequest) (snap api.Worker, err error) {
	defer func() {
		switch {
		case err == nil:
			h.metrics.spawns.WithLabelValues("spawned").Inc()
		case errors.Is(err, ErrSpawn):
			h.metrics.spawns.WithLabelValues("error").Inc()
		default:
			h.metrics.spawns.WithLabelValues("refused").Inc()
		}
	}()
	var eng *Engine
	if req.Engine != "" && req.Engine != EngineBuiltin {
		e, ok := h.cfg.Engines[req.Engine]
		if !ok {
			return snap, fmt.Errorf("%w: %q (this hive has %s)", ErrUnknownEngine, api.Printable(req.Engine, 60), strings.Join(h.engineNames(), ", "))
		}
		eng = &e
	}
	path, err := h.modelPath(req.ModelRef)
	if err != nil {
		return snap, err
	}
	opts := h.workerOptions(req.WorkerOptions)
	if req.Projector != "" {
		if eng != nil {
			return snap, fmt.Errorf("%w: projector %q: engine %s gets no projector from the hive (give it in the engine's command)", ErrInvalidModelRef, api.Printable(req.Projector, 60), req.Engine)
		}
		if opts.projector, err = h.modelPath(req.Projector); err != nil {
			return snap, fmt.Errorf("projector: %w", err)
		}
	}
	info, err := h.models.Inspect(path, opts.CtxSize)
	if err != nil {
		return snap, err
	}
	// An external engine knows which architectures it runs; the built-in
	// one is checked here.
	if eng == nil && !textArchitectures[info.Architecture] {
		return snap, fmt.Errorf("%w: %q (model %s)", ErrUnsupportedModel, info.Architecture, req.ModelRef)
	}
	devs, err := h.devices.Devices(ctx)
	if err != nil {
		return snap, fmt.Errorf("device inventory: %w", err)
	}
	devs = h.reg.withLeaks(devs)
	heldOf := func(id int) held {
		h.reg.mu.Lock()
		defer h.reg.mu.Unlock()
		return h.reg.heldLocked(id)
	}
	var split []gpu.Device
	var shares []uint64
	var dev gpu.Device
	if len(req.GPUDevices) > 1 {
		if req.GPUDevice != nil && *req.GPUDevice != req.GPUDevices[0] {
			return snap, fmt.Errorf("%w: gpu_device %d is not the first of gpu_devices %v", ErrBadDevices, *req.GPUDevice, req.GPUDevices)
		}
		if split, shares, err = chooseSplit(devs, req.GPUDevices, info.MemoryBytes, heldOf); err != nil {
			return snap, err
		}
		dev = split[0]
	} else {
		want := req.GPUDevice
		if len(req.GPUDevices) == 1 {
			want = &req.GPUDevices[0]
		}
		if dev, err = chooseDevice(devs, want, info.MemoryBytes, heldOf); err != nil {
			return snap, err
		}
	}

	id := "worker-" + newUUID()
	w := &worker{
		h: h, id: id, lifecycle: req.LifecycleID, modelRef: strings.TrimSuffix(req.ModelRef, ".gguf"),
		device: dev, split: split, shares: shares, estimate: info.MemoryBytes, token: randomHex(32), idleTimeout: opts.idleTimeout,
		engine: eng, cmds: make(chan any), done: make(chan struct{}),
	}
	// The memory no process holds on a GPU before the worker: after it
	// ends, the driver must be back to it (checkRelease).
	w.baseline, w.driverCounts = h.unownedBaseline(ctx, dev)
	for _, d := range split {
		b, _ := h.unownedBaseline(ctx, d)
		w.baselines = append(w.baselines, b)
	}
	w.log = h.log.With("worker_id", id, "model_ref", w.modelRef, deviceAttr(dev))
	if len(split) > 0 {
		w.log = w.log.With("gpu_devices", deviceIDs(split))
	}
	if eng != nil {
		w.log = w.log.With("engine", req.Engine)
	}
	if err := h.reg.admit(w, h.cfg.WorkerHost, h.cfg.PortMin, h.cfg.PortMax); err != nil {
		return snap, err
	}
	w.uri = h.cfg.TLS.Scheme() + "://" + hostPort(h.cfg.WorkerHost, w.port)
	w.out = newWorkerLog(filepath.Join(h.data.logsDir(), id+".log"))
	if h.pods != nil {
		w.spawnedAt = time.Now()
		w.m = lifecycle.NewMachine(w.spawnedAt)
		if err := h.startPod(ctx, w, path, opts); err != nil {
			w.out.close()
			h.reg.remove(w)
			return snap, fmt.Errorf("%w: %w", ErrSpawn, err)
		}
		return h.started(w), nil
	}

	var spec procs.Spec
	if eng != nil {
		spec, err = h.engineSpec(w, *eng, path, opts)
	} else {
		spec = h.builtinSpec(w, req, path, opts)
	}
	var lf *os.File
	if err == nil {
		if lf, err = w.listener.File(); err != nil {
			err = fmt.Errorf("the worker's socket: %w", err)
		}
	}
	if err != nil {
		w.out.close()
		h.reg.remove(w)
		return snap, fmt.Errorf("%w: %w", ErrSpawn, err)
	}
	spec.ExtraFiles = []*os.File{lf}
	w.spawnedAt = time.Now()
	w.m = lifecycle.NewMachine(w.spawnedAt)
	proc, err := h.launcher.Launch(ctx, spec)
	// The worker has its own copy of the socket now.
	lf.Close()
	h.reg.mu.Lock()
	w.closeListener()
	h.reg.mu.Unlock()
	if err != nil {
		w.out.close()
		h.reg.remove(w)
		return snap, fmt.Errorf("%w: %w", ErrSpawn, err)
	}
	w.proc = proc
	if err := h.data.writeRecord(childRecord{WorkerID: id, Process: proc.Identity(), SpawnedAt: w.spawnedAt}); err != nil {
		w.log.Error("cannot record child; a crash of this hive could orphan it", "err", err)
	}
	w.reason = fmt.Sprintf("spawned pid %d on %s device %d, port %d", proc.PID(), dev.Kind, dev.ID, w.port)
	if len(split) > 0 {
		w.reason = fmt.Sprintf("spawned pid %d split over %s devices %s, port %d", proc.PID(), dev.Kind, deviceIDs(split), w.port)
	}
	return h.started(w), nil
}

// started publishes a spawned worker in state starting, tells the queen
// and hands it to its owner goroutine.
func (h *Hive) started(w *worker) api.Worker {
	snap := w.publish()
	h.metrics.workers.WithLabelValues(string(lifecycle.Starting)).Inc()
	if p, ok := w.proc.(*kube.Pod); ok {
		w.log.Info("worker spawned", "pod", p.Ref(), "port", w.port, "estimate", api.FormatBytes(w.estimate))
	} else {
		w.log.Info("worker spawned", "pid", w.proc.PID(), "port", w.port, "estimate", api.FormatBytes(w.estimate))
	}
	h.emit(api.WorkerEvent{WorkerID: w.id, LifecycleID: w.lifecycle, To: string(lifecycle.Starting),
		Reason: w.reason, At: w.spawnedAt, Worker: snap.Brief()})
	h.owners.Go(w.run)
	return snap
}

// builtinSpec is the command line of apiary's own worker.
func (h *Hive) builtinSpec(w *worker, req api.StartWorkerRequest, path string, opts startOptions) procs.Spec {
	args := append([]string(nil), h.cfg.WorkerArgs...)
	args = append(args,
		"--worker-id", w.id,
		"--model", path,
		"--port", strconv.Itoa(w.port),
		"--host", h.cfg.WorkerHost,
		"--listen-fd", "3", // w.listener, ExtraFiles[0]
		"--callback-url", h.callbackURL(),
	)
	if len(w.split) > 0 {
		args = append(args, "--gpu-devices", deviceIDs(w.split), "--split-mode", h.cfg.SplitMode)
	} else {
		args = append(args, "--gpu-device", strconv.Itoa(workerDevice(w.device)))
	}
	args = append(args, optionArgs(req.LifecycleID, opts)...)
	args = append(args, h.kvCacheArgs()...)
	if h.cfg.TLS.Enabled() {
		// A TLS hive's workers serve TLS with the node's certificate.
		args = append(args, "--tls-cert", h.cfg.TLS.CertFile, "--tls-key", h.cfg.TLS.KeyFile)
	}
	if ca := transport.CAFile(); ca != "" {
		args = append(args, "--ca-file", ca) // to trust the hive in its callback
	}
	// The worker gets the allow-list of the hive's environment and what
	// the operator named (PassEnv); no secret of the hive's but its own
	// token.
	env := append(secret.ChildEnv(os.Environ(), h.cfg.PassEnv), h.cfg.WorkerEnv...)
	env = append(env, secret.WorkerTokenEnv+"="+w.token)
	if w.device.Kind == gpu.KindCUDA {
		// CUDA numbers GPUs fastest first by default; NVML, which the
		// hive's device ids come from, by PCI bus. The worker's
		// --gpu-device must name the same GPU.
		env = append(env, cudaOrderPCI)
	}
	return procs.Spec{Path: h.cfg.WorkerPath, Args: args, Env: env, Output: w.out}
}

// optionArgs are the built-in worker's flags for its row and its
// options, a process's and a Pod's alike.
func optionArgs(lifecycleID string, opts startOptions) []string {
	var args []string
	if lifecycleID != "" {
		args = append(args, "--lifecycle-id", lifecycleID)
	}
	for _, o := range []struct {
		flag string
		n    int
	}{{"--threads", opts.Threads}, {"--slots", opts.Slots}, {"--ctx-size", opts.CtxSize}} {
		if o.n > 0 {
			args = append(args, o.flag, strconv.Itoa(o.n))
		}
	}
	if opts.projector != "" {
		args = append(args, "--mmproj", opts.projector)
	}
	return args
}

// engineSpec runs an external engine behind its front: `apiary
// engine-front` serves the worker's socket as a built-in worker does (the
// same token, /health, shutdown and ready callback) and starts the
// engine's command line, given after "--" with its placeholders
// replaced, on a loopback port of the engine's own that only the front
// reaches. The front, and through it the engine, gets the allow-list of
// the hive's environment, what the operator named (PassEnv) and the
// engine's env; no secret of the hive's reaches the engine: the front
// gets the worker's token and the engine's key, if its command uses
// {api_key}, and keeps both out of the engine's environment.
func (h *Hive) engineSpec(w *worker, e Engine, path string, opts startOptions) (procs.Spec, error) {
	port, err := loopbackPort()
	if err != nil {
		return procs.Spec{}, fmt.Errorf("a loopback port for the engine: %w", err)
	}
	var key string
	if e.usesAPIKey() {
		key = randomHex(32)
	}
	vals := engineValues(path, w.modelRef, engineHost, port, w.devs(), opts, key)
	engineURL := "http://" + hostPort(engineHost, port)
	w.healthURL = engineURL + e.healthPath()
	args := append([]string(nil), h.cfg.FrontArgs...)
	args = append(args,
		"--worker-id", w.id,
		"--model-ref", w.modelRef,
		"--port", strconv.Itoa(w.port),
		"--host", h.cfg.WorkerHost,
		"--listen-fd", "3", // w.listener, ExtraFiles[0]
		"--callback-url", h.callbackURL(),
		"--engine-url", engineURL,
		"--health", e.healthPath(),
		"--slots", vals["slots"],
		"--stop-wait", h.cfg.ShutdownAck.String(), // SIGTERM to SIGKILL, as the hive's
	)
	if w.device.Kind != gpu.KindCPU {
		// The front measures the engine's resident set on the CPU; a
		// GPU's memory it cannot see, so it reports the estimate.
		args = append(args, "--memory-bytes", strconv.FormatUint(w.estimate, 10))
	}
	if h.cfg.TLS.Enabled() {
		args = append(args, "--tls-cert", h.cfg.TLS.CertFile, "--tls-key", h.cfg.TLS.KeyFile)
	}
	if ca := transport.CAFile(); ca != "" {
		args = append(args, "--ca-file", ca) // to trust the hive in its callback
	}
	if pass := h.enginePassEnv(e); len(pass) > 0 {
		args = append(args, "--pass-env", strings.Join(pass, ","))
	}
	args = append(args, "--", expand(e.Command[0], vals))
	for _, a := range e.Command[1:] {
		args = append(args, expand(a, vals))
	}
	env := secret.ChildEnv(os.Environ(), h.cfg.PassEnv)
	for _, k := range slices.Sorted(maps.Keys(e.Env)) {
		env = append(env, k+"="+expand(e.Env[k], vals))
	}
	if _, own := e.Env[cudaOrderKey]; !own && w.device.Kind == gpu.KindCUDA {
		env = append(env, cudaOrderPCI) // so that even {gpu} is NVML's index
	}
	if _, own := e.Env[cudaVisibleKey]; !own && len(w.split) > 0 {
		// A split engine sees its GPUs, and only them (by UUID).
		env = append(env, cudaVisibleKey+"="+vals["gpu_uuids"])
	}
	env = append(env, secret.WorkerTokenEnv+"="+w.token)
	if key != "" {
		env = append(env, secret.EngineKeyEnv+"="+key)
	}
	return procs.Spec{Path: h.cfg.FrontPath, Args: args, Env: env, Output: w.out}, nil
}

// enginePassEnv is what an engine's front passes its engine besides the
// allow-list (its --pass-env): what the operator named (PassEnv) and the
// engine's own env of the engines file, which the hive adds to the
// front's environment. A secret of apiary's the engines file sets never
// reaches the engine.
func (h *Hive) enginePassEnv(e Engine) []string {
	pass := slices.Clone(h.cfg.PassEnv)
	for _, k := range slices.Sorted(maps.Keys(e.Env)) {
		if !slices.Contains(secret.EnvNames(), k) {
			pass = append(pass, k)
		}
	}
	return pass
}

// engineHost is where an external engine listens: loopback, behind its
// front.
const engineHost = "127.0.0.1"

// loopbackPort is a port free on loopback now: the engine binds it
// itself a moment later (another process could take it in between; the
// engine then fails to bind, exits, and its worker is FAILED).
func loopbackPort() (int, error) {
	ln, err := net.Listen("tcp", hostPort(engineHost, 0))
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// startOptions are one worker's options: the start's own, else the
// hive's.
type startOptions struct {
	CtxSize, Slots, Threads int
	idleTimeout             time.Duration // negative: never idle-stopped
	projector               string        // the path of the start's projector; "" the worker's default
}

func (h *Hive) workerOptions(o api.WorkerOptions) startOptions {
	config.Default(&o.CtxSize, h.cfg.CtxSize)
	config.Default(&o.Slots, h.cfg.WorkerSlots)
	config.Default(&o.Threads, h.cfg.WorkerThreads)
	out := startOptions{CtxSize: o.CtxSize, Slots: o.Slots, Threads: o.Threads, idleTimeout: h.cfg.IdleTimeout}
	if o.IdleTimeoutMS > 0 {
		out.idleTimeout = time.Duration(o.IdleTimeoutMS) * time.Millisecond
	}
	return out
}

// callbackURL is where workers post their ready callback.
func (h *Hive) callbackURL() string {
	host := "127.0.0.1"
	if th, _, err := splitHost(h.addr.String()); err == nil && th != "" && !isUnspecified(th) {
		host = th
	}
	_, port, _ := splitHost(h.addr.String())
	return h.cfg.TLS.Scheme() + "://" + hostPort(host, mustAtoi(port)) + "/v2/internal/workers/ready"
}

// requestStop asks the owner to stop the worker; it returns once the owner
// has taken the request (or the worker is already gone).
func (w *worker) requestStop(c stopCmd) error {
	c.reply = make(chan error, 1)
	select {
	case w.cmds <- c:
		return <-c.reply
	case <-w.done:
		return nil
	}
}

// deliverReady hands a ready callback to the owner and returns its verdict.
func (w *worker) deliverReady(ctx context.Context, token string, cb api.ReadyCallback) error {
	c := readyCmd{token: token, cb: cb, reply: make(chan error, 1)}
	select {
	case w.cmds <- c:
		return <-c.reply
	case <-w.done:
		return fmt.Errorf("%w: %s", ErrWorkerEnded, w.id)
	case <-ctx.Done():
		return ctx.Err()
	}
}

func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	x := hex.EncodeToString(b[:])
	return x[0:8] + "-" + x[8:12] + "-" + x[12:16] + "-" + x[16:20] + "-" + x[20:]
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// chooseSplit checks the devices ids a model is split over (each a
// usable GPU of this node, each once) and gives each its share of need, in
// proportion to the memory it has available: a share that does not fit
// is refused by admit, as a whole model is on one device.
func chooseSplit(devs []gpu.Device, ids []int, need uint64, heldOf func(int) held) ([]gpu.Device, []uint64, error) {
	var out []gpu.Device
	var avail []uint64
	var sum uint64
	for _, id := range ids {
		i := slices.IndexFunc(devs, func(d gpu.Device) bool { return d.ID == id })
		switch {
		case i < 0:
			return nil, nil, fmt.Errorf("%w: gpu_devices %v: no device %d (this node has %d)", ErrDeviceNotFound, ids, id, len(devs))
		case devs[i].Kind == gpu.KindCPU:
			return nil, nil, fmt.Errorf("%w: gpu_devices %v: device %d is the CPU; a model is split over GPUs only", ErrBadDevices, ids, id)
		case devs[i].Unusable != "":
			return nil, nil, fmt.Errorf("%w: %s device %d: %s", ErrDeviceUnusable, devs[i].Kind, id, devs[i].Unusable)
		case slices.ContainsFunc(out, func(d gpu.Device) bool { return d.ID == id }):
			return nil, nil, fmt.Errorf("%w: gpu_devices %v names device %d twice", ErrBadDevices, ids, id)
		}
		out = append(out, devs[i])
		a := available(devs[i], heldOf(id))
		avail = append(avail, a)
		sum += a
	}
	return out, api.SplitShares(need, avail), nil
}

// deviceIDs are ds' ids comma-separated, as --gpu-devices takes them.
func deviceIDs(ds []gpu.Device) string {
	s := make([]string, len(ds))
	for i, d := range ds {
		s[i] = strconv.Itoa(d.ID)
	}
	return strings.Join(s, ",")
}

// workerDevice is the worker's --gpu-device: the GPU's index, or -1 for
// the CPU device.
// deviceAttr names a worker's device in its log lines: device=cpu on the
// CPU (its inventory id 0 is no GPU), gpu_device=N on a GPU.
func deviceAttr(d gpu.Device) slog.Attr {
	if d.Kind == gpu.KindCPU {
		return slog.String("device", gpu.KindCPU)
	}
	return slog.Int("gpu_device", d.ID)
}

func workerDevice(d gpu.Device) int {
	if d.Kind == gpu.KindCPU {
		return -1
	}
	return d.ID
}

// closeListener closes the hive's copy of the worker's socket (once the
// worker has inherited it, or the spawn failed); under the registry's
// lock.
func (w *worker) closeListener() {
	if w.listener != nil {
		w.listener.Close()
		w.listener = nil
	}
}
