package hive

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/gpu"
	"github.com/apiary-llm/apiary/internal/procs"
)

// This file is the hive's side of the GPU driver's memory accounting: a
// CUDA worker's vram_bytes is what the driver (NVML) says its process
// holds, and after a worker ends the hive checks that the driver gave
// its memory back. Memory still held, or a GPU process that is no worker
// of this hive, marks the device unusable ("memory leaked by ...") and is
// reported to the queen as a worker.memory_leaked audit entry; the mark
// stays until a later check finds the memory back.

// processes is the driver's process list of d, when the node's inventory
// reports one (CUDA); ok is false on the CPU device or without a driver.
func (h *Hive) processes(ctx context.Context, d gpu.Device) (ps []gpu.Process, ok bool, err error) {
	pl, isLister := h.devices.(gpu.ProcessLister)
	if !isLister || d.Kind != gpu.KindCUDA {
		return nil, false, nil
	}
	ps, err = pl.Processes(ctx, d.ID)
	return ps, true, err
}

// device reads device id from the inventory now.
func (h *Hive) device(ctx context.Context, id int) (gpu.Device, error) {
	devs, err := h.devices.Devices(ctx)
	if err != nil {
		return gpu.Device{}, err
	}
	for _, d := range devs {
		if d.ID == id {
			return d, nil
		}
	}
	return gpu.Device{}, fmt.Errorf("%w: device %d is gone from the inventory", ErrDeviceNotFound, id)
}

// driverVRAM is the memory the driver says worker pid's processes hold on
// d: the worker's and every other process of its group (an engine is its
// front's child); ok is false when the driver lists none of them (or
// reports no processes).
func (h *Hive) driverVRAM(ctx context.Context, d gpu.Device, pid int) (uint64, bool) {
	ps, listed, err := h.processes(ctx, d)
	if !listed || err != nil {
		if err != nil {
			h.log.Warn("cannot read the driver's process list", "gpu_device", d.ID, "err", err)
		}
		return 0, false
	}
	group := groupOf(pid)
	var used uint64
	found := false
	for _, p := range ps {
		if group[p.PID] {
			used += p.UsedBytes
			found = true
		}
	}
	return used, found
}

// groupOf is worker pid's process and the live processes of its group
// (a worker leads a process group of its own).
func groupOf(pid int) map[int]bool {
	out := map[int]bool{pid: true}
	members, _ := procs.GroupMembers(pid)
	for _, m := range members {
		out[m] = true
	}
	return out
}

// unownedBaseline is the memory of device d no process holds now (the
// driver's own); the release check compares against it.
func (h *Hive) unownedBaseline(ctx context.Context, d gpu.Device) (uint64, bool) {
	ps, listed, err := h.processes(ctx, d)
	if !listed || err != nil {
		return 0, false
	}
	return unowned(d, ps), true
}

// leakMarks are the devices marked unusable for leaked memory, by id.
type leakMarks struct {
	by map[int]string // guarded by registry.mu
}

// markLeak keeps device id out of placement with why.
func (h *Hive) markLeak(id int, why string) {
	h.reg.mu.Lock()
	defer h.reg.mu.Unlock()
	if h.reg.leaks.by == nil {
		h.reg.leaks.by = map[int]string{}
	}
	h.reg.leaks.by[id] = why
}

// clearLeak lifts device id's mark; it reports whether there was one.
func (h *Hive) clearLeak(id int) bool {
	h.reg.mu.Lock()
	defer h.reg.mu.Unlock()
	_, ok := h.reg.leaks.by[id]
	delete(h.reg.leaks.by, id)
	return ok
}

// withLeaks marks the devices with leaked memory unusable (a device the
// inventory already marks keeps its reason).
func (r *registry) withLeaks(devs []gpu.Device) []gpu.Device {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.withLeaksLocked(devs)
}

func (r *registry) withLeaksLocked(devs []gpu.Device) []gpu.Device {
	if len(r.leaks.by) == 0 {
		return devs
	}
	out := slices.Clone(devs)
	for i, d := range out {
		if why, ok := r.leaks.by[d.ID]; ok && d.Unusable == "" {
			out[i].Unusable = why
		}
	}
	return out
}

// checkRelease runs after worker w (pid, on device d; a split worker's
// on each of its devices) has ended: it polls
// the driver every ReleasePoll until the memory is back (releaseVerdict),
// for ReleaseTimeout at most. Memory still held then marks the device,
// logs, and sends the queen a memory_leaked event; the polling goes on,
// ReleaseTimeout apart, until the memory is back, which lifts the mark.
func (h *Hive) checkRelease(w *worker, d gpu.Device, pid int, baseline uint64) {
	defer h.checks.Done()
	ctx := h.checkCtx
	deadline := time.Now().Add(h.cfg.ReleaseTimeout)
	interval := h.cfg.ReleasePoll
	reported := ""
	for {
		why, err := h.releaseCheck(ctx, w.id, d.ID, pid, baseline)
		switch {
		case err != nil && time.Now().After(deadline):
			h.log.Error("memory release check given up: cannot read the driver", "worker_id", w.id, "gpu_device", d.ID, "err", err)
			return
		case err != nil:
			h.log.Warn("memory release check: cannot read the driver", "worker_id", w.id, "gpu_device", d.ID, "err", err)
		case why == "":
			if h.clearLeak(d.ID) {
				h.log.Info("leaked GPU memory is back; the device is usable again", "worker_id", w.id, "gpu_device", d.ID)
			} else {
				h.log.Info("the driver gave the worker's GPU memory back", "worker_id", w.id, "gpu_device", d.ID, "pid", pid)
			}
			return
		case time.Now().After(deadline) && why != reported:
			h.markLeak(d.ID, why)
			h.log.Error("GPU memory not given back; the device takes no worker until it is", "worker_id", w.id, "gpu_device", d.ID, "pid", pid, "reason", why)
			h.emit(api.WorkerEvent{Kind: api.EventMemoryLeaked, WorkerID: w.id, LifecycleID: w.lifecycle, Reason: why, At: time.Now(),
				Worker: w.h.reg.snapshot(w).Brief()})
			reported = why
			interval = h.cfg.ReleaseTimeout
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(interval):
		}
	}
}

// releaseCheck reads the driver once and says what still holds memory on
// device id after worker id (pid) ended ("": nothing).
func (h *Hive) releaseCheck(ctx context.Context, id string, dev, pid int, baseline uint64) (string, error) {
	d, err := h.device(ctx, dev)
	if err != nil {
		return "", err
	}
	ps, _, err := h.processes(ctx, d)
	if err != nil {
		return "", err
	}
	return releaseVerdict(id, pid, groupOf(pid), d, ps, baseline, h.cfg.ReleaseTolerance), nil
}

// releaseVerdict says why device d's memory is not back after worker id
// (pid) ended, or "" when it is: the driver still lists a process of the
// worker's group (pid, or a child left behind); or more memory than
// baseline (+ tolerance) is held by no listed process. Other processes
// (the hive's live workers, whatever else shares the GPU, or pids the
// driver reports from another pid namespace, as in a container) are
// none of this worker's: they are no leak of it, and their memory is
// already out of the free memory placement reads.
func releaseVerdict(id string, pid int, group map[int]bool, d gpu.Device, ps []gpu.Process, baseline, tolerance uint64) string {
	held := byPID(ps)
	for _, p := range slices.Sorted(maps.Keys(held)) {
		if p == pid || group[p] {
			what := "it"
			if p != pid {
				what = fmt.Sprintf("its process %d", p)
			}
			return fmt.Sprintf("memory leaked by %s (pid %d): the driver still lists %s on device %d with %s", id, pid, what, d.ID, api.FormatBytes(held[p]))
		}
	}
	if u := unowned(d, ps); u > baseline+tolerance {
		return fmt.Sprintf("memory leaked by %s (pid %d): %s of device %d is held by no process (%s when it started)", id, pid, api.FormatBytes(u), d.ID, api.FormatBytes(baseline))
	}
	return ""
}

func byPID(ps []gpu.Process) map[int]uint64 {
	out := make(map[int]uint64, len(ps))
	for _, p := range ps {
		out[p.PID] += p.UsedBytes
	}
	return out
}

// unowned is the memory of d in use that no listed process holds.
func unowned(d gpu.Device, ps []gpu.Process) uint64 {
	if d.FreeBytes >= d.TotalBytes {
		return 0
	}
	used := d.TotalBytes - d.FreeBytes
	var listed uint64
	for _, p := range ps {
		listed += p.UsedBytes
	}
	if listed >= used {
		return 0
	}
	return used - listed
}
