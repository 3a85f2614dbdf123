package hive

import (
	"context"
	"fmt"
	"net/http"
	"syscall"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/modelstore"
	"github.com/apiary-llm/apiary/internal/procs"
	"github.com/apiary-llm/apiary/internal/rpc"
	"github.com/apiary-llm/apiary/internal/transport"
)

// The hive's effects live behind these small interfaces so that the policy
// and the owner loop can be tested with fakes.

// Launcher starts worker processes.
type Launcher interface {
	Launch(ctx context.Context, spec procs.Spec) (Process, error)
	Close() error
}

// Process is a started worker process (see procs.Process).
type Process interface {
	PID() int
	Identity() procs.Identity
	Exited() <-chan struct{}
	Done() <-chan struct{}
	Exit() procs.Exit
	Signal(sig syscall.Signal) error
	Kill()
}

// WorkerClient speaks to a worker's HTTP API.
type WorkerClient interface {
	Health(ctx context.Context, uri string) (api.WorkerHealth, error)
	Shutdown(ctx context.Context, uri, token string) error
}

// ModelInspector reads what preflight needs from a model file.
type ModelInspector interface {
	Inspect(path string, ctxSize int) (ModelInfo, error)
}

// ModelInfo is what preflight learns from a GGUF header.
type ModelInfo struct {
	Architecture string
	MemoryBytes  uint64 // estimate for weights + KV cache + compute
}

// spawner launches through procs.Spawner.
type spawner struct{ s *procs.Spawner }

func newSpawner() *spawner { return &spawner{s: procs.NewSpawner()} }

func (s *spawner) Launch(ctx context.Context, spec procs.Spec) (Process, error) {
	p, err := s.s.Start(ctx, spec)
	if err != nil {
		return nil, err
	}
	return p, nil
}

func (s *spawner) Close() error { return s.s.Close() }

// httpWorkerClient is the real WorkerClient.
type httpWorkerClient struct{ c *http.Client }

func newHTTPWorkerClient() *httpWorkerClient {
	// No keep-alive: a pooled transport may dial a connection for a probe,
	// serve the probe on another that became idle meanwhile, and leave the
	// new one unused. The worker's http.Server.Shutdown then waits 5s for
	// that never-used connection, which stalled cascades. A loopback dial
	// per probe costs nothing at these rates.
	t := transport.NewTransport()
	t.DisableKeepAlives = true
	return &httpWorkerClient{c: transport.NewClient(t, 0)}
}

func (c *httpWorkerClient) Health(ctx context.Context, uri string) (api.WorkerHealth, error) {
	return rpc.WorkerHealth(ctx, c.c, uri)
}

func (c *httpWorkerClient) Shutdown(ctx context.Context, uri, token string) error {
	return rpc.Do(ctx, c.c, rpc.Call{Method: http.MethodPost, URL: uri + "/v1/admin/shutdown", Token: token, MaxAnswer: 4096})
}

func (c *httpWorkerClient) close() { c.c.CloseIdleConnections() }

// ggufInspector reads GGUF headers with package gguf, through
// modelstore.ReadInfo: a split model's estimate counts the tensors of all
// its parts.
type ggufInspector struct{}

func (ggufInspector) Inspect(path string, ctxSize int) (ModelInfo, error) {
	info, err := modelstore.ReadInfo(path)
	if err != nil {
		return ModelInfo{}, fmt.Errorf("%w: %w", ErrInvalidModel, err)
	}
	return ModelInfo{Architecture: info.Architecture, MemoryBytes: info.EstimateMemory(ctxSize).Total}, nil
}
