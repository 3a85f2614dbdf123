package hive

import (
	"maps"
	"slices"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
)

// A hive sends its full heartbeat (devices, workers, worker tokens) when
// something the queen acts on has changed since the last one the queen
// took whole, and at least every fullBeatEvery; in between it sends an
// unchanged beat, which only renews the lease. The queen of a large fleet
// then decodes and checks a few bytes a beat instead of the inventory.
const fullBeatEvery = 30 * time.Second

// Drifts below these are not news: a device's free memory moves by pages
// and its temperature by degrees between beats.
const (
	freeDriftDivisor = 100 // 1% of the device's total memory
	tempDrift        = 5   // °C
)

// lastBeat is the last full heartbeat the queen took whole (no entry
// refused, no full one asked for), and when.
type lastBeat struct {
	hb api.Heartbeat
	at time.Time
	ok bool
}

// unchanged reports whether hb may go as an unchanged beat at now.
func (l lastBeat) unchanged(hb api.Heartbeat, now time.Time) bool {
	return l.ok && now.Sub(l.at) < fullBeatEvery && sameReport(l.hb, hb)
}

// sameReport reports whether b tells the queen nothing a did not: the same
// devices and workers in the same states, the same tokens, free memory
// and temperature within their drifts.
func sameReport(a, b api.Heartbeat) bool {
	return slices.EqualFunc(a.GPUs, b.GPUs, sameGPU) && slices.EqualFunc(a.Workers, b.Workers, sameWorker) &&
		maps.Equal(a.WorkerTokens, b.WorkerTokens)
}

func sameGPU(a, b api.GPU) bool {
	if a.ID != b.ID || a.Kind != b.Kind || a.Name != b.Name || a.UUID != b.UUID || a.TotalBytes != b.TotalBytes ||
		a.AllocatedBytes != b.AllocatedBytes || a.ReservedBytes != b.ReservedBytes || !slices.Equal(a.Workers, b.Workers) ||
		a.Unusable != b.Unusable {
		return false
	}
	if diff(a.FreeBytes, b.FreeBytes) > a.TotalBytes/freeDriftDivisor {
		return false
	}
	switch {
	case (a.TemperatureC == nil) != (b.TemperatureC == nil):
		return false
	case a.TemperatureC != nil && abs(*a.TemperatureC-*b.TemperatureC) >= tempDrift:
		return false
	}
	return true
}

func sameWorker(a, b api.Worker) bool {
	return a.WorkerID == b.WorkerID && a.LifecycleID == b.LifecycleID && a.ModelRef == b.ModelRef && a.GPUDevice == b.GPUDevice &&
		a.VRAMBytes == b.VRAMBytes && a.URI == b.URI && a.Status == b.Status && a.Reason == b.Reason && a.PID == b.PID &&
		samePtr(a.ExitCode, b.ExitCode) && a.InFlight == b.InFlight && a.StartedAt.Equal(b.StartedAt) &&
		sameTime(a.ReadyAt, b.ReadyAt) && sameTime(a.StoppedAt, b.StoppedAt) && a.Transitions == b.Transitions &&
		a.Pod == b.Pod && a.Node == b.Node
}

func samePtr[T comparable](a, b *T) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }

func sameTime(a, b *time.Time) bool { return (a == nil) == (b == nil) && (a == nil || a.Equal(*b)) }

func diff(a, b uint64) uint64 {
	if a > b {
		return a - b
	}
	return b - a
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}
