package hive

import (
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
)

func TestSameReport(t *testing.T) {
	temp := func(c int) *int { return &c }
	at := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	base := func() api.Heartbeat {
		return api.Heartbeat{
			GPUs: []api.GPU{{ID: 0, Kind: "cuda", Name: "H100", TotalBytes: 80 << 30, FreeBytes: 40 << 30, TemperatureC: temp(50),
				Workers: []string{"w-1"}}},
			Workers:      []api.Worker{{WorkerID: "w-1", LifecycleID: "wk-1", ModelRef: "m", Status: "ready", PID: 7, StartedAt: at, ReadyAt: &at, Transitions: 2}},
			WorkerTokens: map[string]string{"w-1": "t"},
		}
	}
	ready2 := at.Add(time.Second)
	one := 1
	for _, c := range []struct {
		name   string
		change func(*api.Heartbeat)
		same   bool
	}{
		{"nothing", func(*api.Heartbeat) {}, true},
		{"free memory within 1% of the total", func(h *api.Heartbeat) { h.GPUs[0].FreeBytes -= 800 << 20 }, true},
		{"free memory beyond 1%", func(h *api.Heartbeat) { h.GPUs[0].FreeBytes -= 900 << 20 }, false},
		{"temperature within 5 °C", func(h *api.Heartbeat) { h.GPUs[0].TemperatureC = temp(54) }, true},
		{"temperature by 5 °C", func(h *api.Heartbeat) { h.GPUs[0].TemperatureC = temp(45) }, false},
		{"temperature gone", func(h *api.Heartbeat) { h.GPUs[0].TemperatureC = nil }, false},
		{"a device's workers", func(h *api.Heartbeat) { h.GPUs[0].Workers = nil }, false},
		{"a device more", func(h *api.Heartbeat) { h.GPUs = append(h.GPUs, h.GPUs[0]) }, false},
		{"reserved memory", func(h *api.Heartbeat) { h.GPUs[0].ReservedBytes = 1 }, false},
		{"a worker's status", func(h *api.Heartbeat) { h.Workers[0].Status = "busy" }, false},
		{"a worker's requests", func(h *api.Heartbeat) { h.Workers[0].InFlight = 1 }, false},
		{"a worker's exit code", func(h *api.Heartbeat) { h.Workers[0].ExitCode = &one }, false},
		{"a worker's ready time", func(h *api.Heartbeat) { h.Workers[0].ReadyAt = &ready2 }, false},
		{"the same ready time, another pointer", func(h *api.Heartbeat) { c := at; h.Workers[0].ReadyAt = &c }, true},
		{"a worker's transitions", func(h *api.Heartbeat) { h.Workers[0].Transitions = 3 }, false},
		{"a worker more", func(h *api.Heartbeat) { h.Workers = append(h.Workers, api.Worker{WorkerID: "w-2"}) }, false},
		{"a token", func(h *api.Heartbeat) { h.WorkerTokens["w-1"] = "u" }, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := base()
			c.change(&b)
			if got := sameReport(base(), b); got != c.same {
				t.Errorf("sameReport = %v, want %v", got, c.same)
			}
		})
	}
	l := lastBeat{hb: base(), at: at, ok: true}
	if !l.unchanged(base(), at.Add(fullBeatEvery-time.Millisecond)) || l.unchanged(base(), at.Add(fullBeatEvery)) {
		t.Error("an unchanged beat must go within fullBeatEvery of the last full one, and only then")
	}
	if l.ok = false; l.unchanged(base(), at) {
		t.Error("no unchanged beat without a full one the queen took")
	}
}
