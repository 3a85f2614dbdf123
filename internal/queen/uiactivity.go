package queen

import (
	"encoding/json"
	"math"
	"strconv"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/dashboard"
	"github.com/apiary-llm/apiary/internal/gpu"
	"github.com/apiary-llm/apiary/internal/registry"
	"github.com/apiary-llm/apiary/internal/routing"
)

// The dashboard's activity: the recent requests (one "request/SEQ" item
// each) and each node's load over the last hour (one "node/POOL" item a
// pool), both in bounded rings in the queen's memory.

const (
	// uiRecentRequests is how many requests the page lists: the newest.
	uiRecentRequests = 200
	// uiLoadStep and uiLoadSamples are a node's graphs' resolution and
	// length: a sample every 10 s (the hives send their load that often),
	// one hour.
	uiLoadStep    = 10 * time.Second
	uiLoadSamples = 360
	// uiMaxNodes bounds the pools whose samples are kept (those of pools
	// gone from the registry are dropped at the next build).
	uiMaxNodes = 1024
)

// uiRequest is a "request/SEQ" item: one request as the recent requests
// list shows it.
type uiRequest struct {
	Seq              uint64   `json:"seq"`
	At               string   `json:"at"`
	Endpoint         string   `json:"endpoint"`
	Model            string   `json:"model"`
	Worker           string   `json:"worker,omitempty"`
	Route            string   `json:"route,omitempty"`
	Stream           bool     `json:"stream"`
	Status           int      `json:"status"`
	PromptTokens     *int     `json:"prompt_tokens,omitempty"`
	CompletionTokens *int     `json:"completion_tokens,omitempty"`
	CachedTokens     *int     `json:"cached_tokens,omitempty"`
	TTFTMS           *float64 `json:"ttft_ms,omitempty"`
	TokensPerSecond  *float64 `json:"tokens_per_s,omitempty"`
	DurationMS       float64  `json:"duration_ms"`
}

// uiItem is an item marshalled once, with its key.
type uiItem struct {
	key  string
	data json.RawMessage
}

// requestFinished is routing's Config.Finished: the request joins the
// recent ones (the oldest goes past uiRecentRequests).
func (u *ui) requestFinished(f routing.Finished) {
	u.mu.Lock()
	u.reqSeq++
	r := uiRequest{Seq: u.reqSeq, At: f.At.UTC().Format(time.RFC3339Nano), Endpoint: f.Endpoint, Model: f.Model, Worker: f.Worker, Route: f.Route,
		Stream: f.Stream, Status: f.Status, PromptTokens: f.PromptTokens, CompletionTokens: f.CompletionTokens,
		CachedTokens: f.CachedTokens, DurationMS: round1(ms(f.Duration))}
	if f.TTFT != nil {
		v := round1(ms(*f.TTFT))
		r.TTFTMS = &v
	}
	if f.TokensPerSecond != nil && !math.IsInf(*f.TokensPerSecond, 0) && !math.IsNaN(*f.TokensPerSecond) {
		v := round1(*f.TokensPerSecond)
		r.TokensPerSecond = &v
	}
	data, err := json.Marshal(r)
	if err == nil {
		u.requests.Add(uiItem{key: "request/" + strconv.FormatUint(r.Seq, 10), data: data})
	}
	u.mu.Unlock()
	u.hub.Changed()
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func round1(v float64) float64 { return math.Round(v*10) / 10 }

// nodeSample is one node's load at one time: the hive's load and the
// pool's GPUs as the registry had them then (a CPU device is the node's
// memory, graphed as such).
type nodeSample struct {
	at       time.Time
	cpu      *float64
	memUsed  uint64
	memTotal uint64
	gpus     []gpuSample
}

type gpuSample struct {
	id          int
	name        string
	used, total uint64
	util        *int
}

// nodeSeries is one pool's samples, and its item's JSON since the last
// sample (nil: marshal again).
type nodeSeries struct {
	nodeID  string
	samples *dashboard.Ring[nodeSample]
	data    json.RawMessage
}

// loadDue reports whether a load that came from pool id at now makes a
// sample: at most one a uiLoadStep (half of it, for beats that come a
// little early).
func (u *ui) loadDue(id string, now time.Time) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	s := u.nodes[id]
	if s == nil {
		return true
	}
	last, ok := s.samples.Last()
	return !ok || now.Sub(last.at) >= uiLoadStep/2
}

// nodeLoad records a heartbeat's load of pool p as a sample.
func (u *ui) nodeLoad(p registry.Pool, load api.NodeLoad, now time.Time) {
	smp := nodeSample{at: now, cpu: load.CPUPercent, memTotal: load.MemTotalBytes}
	if load.MemTotalBytes > 0 {
		smp.memUsed = load.MemTotalBytes - min(load.MemAvailableBytes, load.MemTotalBytes)
	}
	util := map[int]int{}
	for _, g := range load.GPUs {
		util[g.ID] = g.UtilPercent
	}
	for _, g := range p.GPUs {
		if g.Kind == gpu.KindCPU {
			continue // the node's memory, graphed as such
		}
		gs := gpuSample{id: g.ID, name: g.Name, used: g.TotalBytes - min(g.FreeBytes, g.TotalBytes), total: g.TotalBytes}
		if v, ok := util[g.ID]; ok {
			gs.util = &v
		}
		smp.gpus = append(smp.gpus, gs)
	}
	u.mu.Lock()
	s := u.nodes[p.ID]
	if s == nil {
		if len(u.nodes) >= uiMaxNodes {
			u.dropStalestNodeLocked()
		}
		s = &nodeSeries{samples: dashboard.NewRing[nodeSample](uiLoadSamples)}
		u.nodes[p.ID] = s
	}
	s.nodeID = p.NodeID
	s.samples.Add(smp)
	s.data = nil
	u.mu.Unlock()
	u.hub.Changed()
}

func (u *ui) dropStalestNodeLocked() {
	stalest, at := "", time.Time{}
	for id, s := range u.nodes {
		last, _ := s.samples.Last()
		if stalest == "" || last.at.Before(at) {
			stalest, at = id, last.at
		}
	}
	delete(u.nodes, stalest)
}

// uiNode is a "node/POOL" item: a pool's node's samples as columns,
// oldest first (null where the hive did not say).
type uiNode struct {
	Pool     string     `json:"pool"`
	NodeID   string     `json:"node_id"`
	StepS    float64    `json:"step_s"`
	Samples  int        `json:"samples"` // the most a series holds: the graphs span Samples × StepS
	T        []int64    `json:"t"`       // each sample's time, Unix seconds
	CPU      []*float64 `json:"cpu_percent"`
	MemUsed  []uint64   `json:"mem_used_bytes"`
	MemTotal uint64     `json:"mem_total_bytes"`
	GPUs     []uiGPU    `json:"gpus"`
}

// uiGPU is one device's series in a uiNode.
type uiGPU struct {
	ID    int      `json:"id"`
	Name  string   `json:"name"`
	Total uint64   `json:"total_bytes"`
	Used  []uint64 `json:"used_bytes"`
	Util  []*int   `json:"util_percent"`
}

// activityItems adds the recent requests and the nodes' series of the
// pools in live to s.
func (u *ui) activityItems(s dashboard.Snapshot, live map[string]bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, it := range u.requests.All() {
		s[it.key] = it.data
	}
	for id, ns := range u.nodes {
		if !live[id] {
			delete(u.nodes, id) // its pool is gone
			continue
		}
		if ns.data == nil {
			data, err := json.Marshal(ns.view(id))
			if err != nil {
				continue
			}
			ns.data = data
		}
		s["node/"+id] = ns.data
	}
}

// view is the series as the page draws it.
func (ns *nodeSeries) view(id string) uiNode {
	all := ns.samples.All()
	v := uiNode{Pool: id, NodeID: ns.nodeID, StepS: uiLoadStep.Seconds(), Samples: ns.samples.Cap(), GPUs: []uiGPU{}}
	gpus := map[int]int{} // device id → index in v.GPUs
	for i, smp := range all {
		v.T = append(v.T, smp.at.Unix())
		v.CPU = append(v.CPU, smp.cpu)
		v.MemUsed = append(v.MemUsed, smp.memUsed)
		if smp.memTotal > 0 {
			v.MemTotal = smp.memTotal
		}
		for _, g := range smp.gpus {
			j, ok := gpus[g.id]
			if !ok {
				j = len(v.GPUs)
				gpus[g.id] = j
				v.GPUs = append(v.GPUs, uiGPU{ID: g.id, Used: make([]uint64, i), Util: make([]*int, i)})
			}
			d := &v.GPUs[j]
			d.Name, d.Total = g.name, g.total
			for len(d.Used) < i {
				d.Used, d.Util = append(d.Used, 0), append(d.Util, nil)
			}
			d.Used, d.Util = append(d.Used, g.used), append(d.Util, g.util)
		}
	}
	for j := range v.GPUs {
		for len(v.GPUs[j].Used) < len(all) {
			v.GPUs[j].Used, v.GPUs[j].Util = append(v.GPUs[j].Used, 0), append(v.GPUs[j].Util, nil)
		}
	}
	return v
}
