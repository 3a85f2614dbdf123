package hive

import (
	"fmt"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/lifecycle"
)

// This file is the hive's policy: pure functions that decide from their
// inputs and return a decision. The worker's owner goroutine applies them.

// probeResult is what one /health probe saw.
type probeResult struct {
	err    error            // nil: the worker answered 200 with a body
	health api.WorkerHealth // valid when err is nil
	at     time.Time
	idle   bool // the probe was asked for by the idle timer
}

// healthDecision is what a probe result means for a serving worker.
type healthDecision struct {
	to     lifecycle.State // "" when the state stays
	reason string
	misses int  // consecutive misses after this probe
	kill   bool // to is failed: the worker must be killed
}

// decideHealth applies the health rules (kubelet-style: N consecutive
// results) to one probe of a worker in state `state` that had `misses`
// consecutive misses before it. A miss moves ready/busy to degraded; the
// maxMisses-th miss in a row fails the worker; an answer moves degraded back
// to ready and follows the worker's own ready/busy report.
func decideHealth(state lifecycle.State, misses, maxMisses int, r probeResult) healthDecision {
	if r.err != nil {
		misses++
		if misses >= maxMisses {
			return healthDecision{to: lifecycle.Failed, kill: true, misses: misses,
				reason: fmt.Sprintf("%d health checks in a row failed: %v", misses, r.err)}
		}
		if state == lifecycle.Ready || state == lifecycle.Busy {
			return healthDecision{to: lifecycle.Degraded, misses: misses,
				reason: fmt.Sprintf("health check failed: %v", r.err)}
		}
		return healthDecision{misses: misses}
	}
	switch {
	case state == lifecycle.Degraded:
		return healthDecision{to: lifecycle.Ready, reason: "health check passed"}
	case state == lifecycle.Ready && (r.health.Status == "busy" || r.health.InFlight > 0):
		return healthDecision{to: lifecycle.Busy, reason: fmt.Sprintf("worker reports %d request(s) in flight", max(r.health.InFlight, 1))}
	case state == lifecycle.Busy && r.health.Status == "ready" && r.health.InFlight == 0:
		return healthDecision{to: lifecycle.Ready, reason: "worker reports no request in flight"}
	}
	return healthDecision{}
}

// lastActivity is when a worker last did something that keeps it from
// being idle: it became ready, or it last served a request.
func lastActivity(readyAt time.Time, lastRequest *time.Time) time.Time {
	if lastRequest != nil && lastRequest.After(readyAt) {
		return *lastRequest
	}
	return readyAt
}

// idleFor reports whether a worker in state with inFlight requests whose
// last activity was at `last` has been idle for timeout at now, and
// otherwise how long until it could be.
func idleFor(state lifecycle.State, inFlight int, last, now time.Time, timeout time.Duration) (idle bool, wait time.Duration) {
	if timeout <= 0 {
		return false, -1
	}
	if state != lifecycle.Ready || inFlight > 0 {
		return false, timeout
	}
	left := last.Add(timeout).Sub(now)
	if left <= 0 {
		return true, 0
	}
	return false, left
}

// held is what one device's workers have taken: vram_bytes reported by
// ready workers, and the estimate of workers still starting.
type held struct {
	allocated uint64
	reserved  uint64
}

func (h held) total() uint64 { return h.allocated + h.reserved }

// available is the memory a new worker may use on a device: what the driver
// reports free less what starting workers have claimed (their estimate:
// the reading need not show memory they have not touched yet, and two
// starts may share one reading), but never more than the total less what
// the hive's workers hold. A starting worker that has already allocated
// is counted twice until it is ready: a start refused then, not two
// workers on memory for one.
func available(d deviceInfo, h held) uint64 {
	budget := uint64(0)
	if d.TotalBytes > h.total() {
		budget = d.TotalBytes - h.total()
	}
	free := d.FreeBytes - min(d.FreeBytes, h.reserved)
	return min(budget, free)
}

// checkFit refuses a model whose estimate does not fit the device.
func checkFit(d deviceInfo, h held, need uint64) error {
	avail := available(d, h)
	if need <= avail {
		return nil
	}
	return &InsufficientMemoryError{Device: d.ID, Kind: d.Kind, Need: need, Available: avail, Held: h.total()}
}

// plausibleVRAM refuses a ready callback's vram_bytes that cannot be true.
func plausibleVRAM(vram uint64, devs []deviceInfo) error {
	if vram == 0 {
		return fmt.Errorf("%w: vram_bytes is 0; a loaded model occupies memory", ErrImplausibleReady)
	}
	var total uint64
	for _, d := range devs {
		if d.TotalBytes == 0 {
			return nil // a device of no known size
		}
		total += d.TotalBytes
	}
	if len(devs) == 1 && vram > total {
		return fmt.Errorf("%w: vram_bytes %d exceeds device %d's %d bytes", ErrImplausibleReady, vram, devs[0].ID, total)
	}
	if vram > total {
		return fmt.Errorf("%w: vram_bytes %d exceeds the %d bytes of its %d devices", ErrImplausibleReady, vram, total, len(devs))
	}
	return nil
}

func secondsDuration(s int) time.Duration { return time.Duration(s) * time.Second }
