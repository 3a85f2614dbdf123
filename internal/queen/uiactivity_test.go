package queen

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/dashboard"
	"github.com/apiary-llm/apiary/internal/registry"
	"github.com/apiary-llm/apiary/internal/routing"
)

// The dashboard's rings are bounded: the recent requests keep the newest
// uiRecentRequests, a node's series the last uiLoadSamples, and the
// nodes at most uiMaxNodes; a pool gone from the registry loses its
// series at the next build.
func TestDashboardActivityIsBounded(t *testing.T) {
	u := newUI(func() dashboard.Snapshot { return nil })
	start := time.Unix(1_700_000_000, 0)
	for i := range uiRecentRequests + 50 {
		u.requestFinished(routing.Finished{At: start.Add(time.Duration(i) * time.Second), Model: "tiny", Status: 200})
	}
	cpu := 12.5
	pool := registry.Pool{ID: "p1", NodeID: "n1", GPUs: []api.GPU{{ID: 0, Kind: "cuda", TotalBytes: 100, FreeBytes: 40}, {ID: 1, Kind: "cpu", TotalBytes: 10}}}
	for i := range uiLoadSamples + 20 {
		u.nodeLoad(pool, api.NodeLoad{CPUPercent: &cpu, MemTotalBytes: 1000, MemAvailableBytes: 250, GPUs: []api.GPULoad{{ID: 0, UtilPercent: 7}}},
			start.Add(time.Duration(i)*uiLoadStep))
	}
	s := dashboard.Snapshot{}
	u.activityItems(s, map[string]bool{"p1": true})
	requests := 0
	for k := range s {
		if strings.HasPrefix(k, "request/") {
			requests++
		}
	}
	if requests != uiRecentRequests || s["request/250"] == nil || s["request/50"] != nil {
		t.Errorf("%d request items (the newest %v, the 50th %v); want the newest %d", requests, s["request/250"] != nil, s["request/50"] != nil, uiRecentRequests)
	}
	var n uiNode
	if err := json.Unmarshal(s["node/p1"].(json.RawMessage), &n); err != nil {
		t.Fatal(err)
	}
	if len(n.T) != uiLoadSamples || len(n.CPU) != uiLoadSamples || len(n.MemUsed) != uiLoadSamples || n.MemUsed[0] != 750 || *n.CPU[0] != 12.5 {
		t.Errorf("node series: %d times, %d cpu, %d memory (first %d); want %d samples of 750 bytes used", len(n.T), len(n.CPU), len(n.MemUsed), n.MemUsed[0], uiLoadSamples)
	}
	if len(n.GPUs) != 1 || len(n.GPUs[0].Used) != uiLoadSamples || n.GPUs[0].Used[0] != 60 || *n.GPUs[0].Util[0] != 7 {
		t.Errorf("gpu series: %+v; want device 0 only (the CPU device is the node's memory), 60 bytes used, 7%%", n.GPUs)
	}
	for i := range uiMaxNodes + 5 {
		u.nodeLoad(registry.Pool{ID: "x" + string(rune('a'+i%26)) + time.Duration(i).String()}, api.NodeLoad{}, start.Add(time.Duration(i)*time.Second))
	}
	u.mu.Lock()
	nodes := len(u.nodes)
	u.mu.Unlock()
	if nodes > uiMaxNodes {
		t.Errorf("%d node series kept; at most %d", nodes, uiMaxNodes)
	}
	s = dashboard.Snapshot{}
	u.activityItems(s, map[string]bool{})
	u.mu.Lock()
	nodes = len(u.nodes)
	u.mu.Unlock()
	if nodes != 0 || s["node/p1"] != nil {
		t.Errorf("%d node series kept for pools the registry no longer has", nodes)
	}
}
