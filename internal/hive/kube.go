package hive

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/apiary-llm/apiary/internal/gpu"
	"github.com/apiary-llm/apiary/internal/kube"
	"github.com/apiary-llm/apiary/internal/lifecycle"
	"github.com/apiary-llm/apiary/internal/secret"
)

// A hive with Config.Kube runs its workers as Kubernetes Pods (package
// kube). The same owner loop supervises them: a Pod's end is its
// process's exit, a stop deletes it (the grace, then at once), the ready
// callback and health probes reach it at its Pod IP. Two things differ:
//   - Pods outlive a hive whose owner is gone (its lifeline or lease
//     ended: the queen was killed or cut off): the hive leaves them, and
//     the next hive of the installation adopts the running ones at its
//     start, for the restarted queen to find in its first heartbeat. A
//     hive asked to stop (the queen's shutdown) deletes them, as it
//     stops its processes.
//   - Placement is on the cluster's devices (each node's CPU and GPUs);
//     Kubernetes' scheduler binds the Pod to the node chosen.

// openKube connects to the cluster of cfg.Kube; its nodes become the
// hive's devices.
func (h *Hive) openKube() error {
	kc := *h.cfg.Kube
	kc.ModelsDir = h.cfg.ModelsDir
	kc.Logger = h.log
	c, err := kube.New(kc)
	if err != nil {
		return err
	}
	h.pods = c
	h.devices = c
	h.reg.fixedPort = kube.WorkerPort
	return nil
}

// startPod is startWorker's spawn for a Pod: the worker's command line
// with its Pod's IP to listen on, no socket handed over, no local
// record (its labels find it again).
func (h *Hive) startPod(ctx context.Context, w *worker, path string, opts startOptions) error {
	args := append([]string(nil), h.cfg.WorkerArgs...)
	args = append(args,
		"--worker-id", w.id,
		"--model", path,
		"--port", strconv.Itoa(w.port),
		"--host", "$("+kube.PodIPEnv+")",
		"--callback-url", h.podCallbackURL(),
	)
	devs := []int{w.device.ID}
	switch {
	case len(w.split) > 0:
		devs = devs[:0]
		for _, d := range w.split {
			devs = append(devs, d.ID)
		}
		// The Pod sees its GPUs only, numbered from 0.
		args = append(args, "--gpu-devices", podDevices(len(w.split)), "--split-mode", h.cfg.SplitMode)
	case w.device.Kind == gpu.KindCPU:
		args = append(args, "--gpu-device", "-1")
	default:
		args = append(args, "--gpu-device", "0")
	}
	args = append(args, optionArgs(w.lifecycle, opts)...)
	// A Pod's environment is its own: what the operator named
	// (PassEnv) and the hive's WorkerEnv, never the hive's machine's.
	env := map[string]string{}
	for _, kv := range secret.PassedEnv(os.Environ(), h.cfg.PassEnv) {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	for _, kv := range h.cfg.WorkerEnv {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	pod, err := h.pods.Launch(ctx, kube.Worker{
		ID: w.id, LifecycleID: w.lifecycle, ModelRef: w.modelRef, Devices: devs, MemoryBytes: w.estimate,
		Token: w.token, Args: args, Env: env, SpawnedAt: w.spawnedAt, Grace: h.cfg.ShutdownAck,
	})
	if err != nil {
		return err
	}
	w.proc = pod
	w.reason = fmt.Sprintf("created %s for %s device %d", pod.Where(), w.device.Kind, w.device.ID)
	return nil
}

// podDevices is --gpu-devices of a Pod with n GPUs: 0..n-1.
func podDevices(n int) string {
	s := make([]string, n)
	for i := range s {
		s[i] = strconv.Itoa(i)
	}
	return strings.Join(s, ",")
}

// podCallbackURL is where worker Pods post their ready callback: the
// hive's advertised URL when it has one (a Pod reaches the hive through
// it), else its listen address.
func (h *Hive) podCallbackURL() string {
	if a := h.cfg.Advertise; a != "" {
		return strings.TrimSuffix(a, "/") + "/v2/internal/workers/ready"
	}
	return h.callbackURL()
}

// podURI is where the hive reaches a ready worker Pod: its IP as the
// cluster reports it (else as its callback says: the worker's token vouches
// for it), on the worker port.
func podURI(pod *kube.Pod, reported string) string {
	host := pod.IP()
	if host == "" {
		if u, err := url.Parse(reported); err == nil {
			host = u.Hostname()
		}
	}
	return "http://" + hostPort(host, kube.WorkerPort)
}

// adoptPods takes over the running worker Pods a previous hive of the
// installation left: each is a ready worker again, supervised by an
// owner loop, reported in the first heartbeat.
func (h *Hive) adoptPods(ctx context.Context) error {
	found, err := h.pods.Adopt(ctx)
	if err != nil {
		return fmt.Errorf("the worker pods of the installation: %w", err)
	}
	devs, err := h.devices.Devices(ctx)
	if err != nil {
		return err
	}
	for _, a := range found {
		dev := gpu.Device{ID: a.Device, Kind: gpu.KindCPU}
		for _, d := range devs {
			if d.ID == a.Device {
				dev = d
			}
		}
		w := &worker{
			h: h, id: a.ID, lifecycle: a.LifecycleID, modelRef: a.ModelRef, device: dev, estimate: a.Estimate,
			token: a.Token, idleTimeout: h.cfg.IdleTimeout, cmds: make(chan any), done: make(chan struct{}),
			spawnedAt: a.SpawnedAt, proc: a.Pod,
		}
		w.log = h.log.With("worker_id", w.id, "model_ref", w.modelRef, "pod", a.Pod.Name())
		if err := h.reg.adopt(w); err != nil {
			return err
		}
		w.uri = podURI(a.Pod, "")
		w.out = newWorkerLog(filepath.Join(h.data.logsDir(), w.id+".log")) // its output is the Pod's log
		w.m = lifecycle.NewMachine(a.SpawnedAt)
		w.vram = a.Estimate
		w.readyAt = time.Now()
		w.publish()
		h.metrics.workers.WithLabelValues(string(lifecycle.Starting)).Inc()
		w.transition(lifecycle.Ready, "adopted "+a.Pod.Where()+" from a previous hive")
		h.owners.Go(w.run)
		w.log.Info("worker pod adopted", "uri", w.uri)
	}
	return nil
}
