package queen

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	oai "github.com/openai/openai-go"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/modelstore"
	"github.com/apiary-llm/apiary/internal/testmodel"
)

// Swap on demand: a hive whose CPU offers room for one worker (--cpu-memory)
// and two models. A request for the second finds no room: the controller
// stops the first model's idle worker ("evicted for b", counted), waits for
// its memory and places the second — the request waits and is served, never
// refused. Then back again.
func TestProcessSwapOnDemand(t *testing.T) {
	shape := testmodel.Options{Dim: 384, Heads: 4, Layers: 4, FF: 1024, Vocab: 2000}
	other := shape
	other.Seed = 2
	dir := t.TempDir()
	probe := filepath.Join(dir, "probe.gguf")
	if err := testmodel.WriteFile(probe, shape); err != nil {
		t.Fatal(err)
	}
	info, err := modelstore.ReadInfo(probe)
	if err != nil {
		t.Fatal(err)
	}
	// Room for one worker (the hive's estimate at its context size), not
	// for one more beside a loaded one.
	capacity := info.EstimateMemory(1024).Total * 6 / 5
	const swapWait = 2 * time.Second
	c := startClusterWith(t, clusterOptions{model: shape, more: map[string]testmodel.Options{"b": other}}, []string{"--swap-wait", swapWait.String()},
		"--cpu-memory", fmt.Sprint(capacity), "--worker-ctx-size", "1024")

	ask := func(model string) string {
		t.Helper()
		out, err := c.client.Chat.Completions.New(t.Context(), oai.ChatCompletionNewParams{Model: model, MaxTokens: oai.Int(4), Temperature: oai.Float(0),
			Messages: []oai.ChatCompletionMessageParamUnion{oai.UserMessage("Say hello to the bees.")}})
		if err != nil {
			t.Fatalf("request for %s: %v", model, err)
		}
		return out.Model
	}
	running := func() map[string]api.LifecycleRow {
		out := map[string]api.LifecycleRow{}
		for _, r := range c.rows() {
			if r.Status == "RUNNING" {
				out[r.ModelRef] = r
			}
		}
		return out
	}
	ask("tiny")
	first := running()["tiny"]
	if first.ID == "" {
		t.Fatalf("no RUNNING worker of tiny: %+v", c.rows())
	}
	ask("b")
	now := running()
	if now["b"].ID == "" || now["tiny"].ID != "" {
		t.Fatalf("after b: running %+v, want b's worker alone", now)
	}
	var evicted api.LifecycleRow
	for _, r := range c.rows() {
		if r.ID == first.ID {
			evicted = r
		}
	}
	if evicted.Status != "STOPPED" {
		t.Errorf("tiny's worker %+v, want STOPPED", evicted)
	}
	entries, err := c.admin.Audit(t.Context(), "", 1000)
	if err != nil {
		t.Fatal(err)
	}
	stops := 0
	for _, e := range entries {
		if e.Action == "worker.stop" && e.Reason == "evicted for b" && e.Actor == "queen" {
			stops++
		}
	}
	if stops != 1 {
		t.Errorf("%d worker.stop audit entries by the queen with reason \"evicted for b\", want 1", stops)
	}
	c.queen.logs.wait(t, 0, "worker evicted", map[string]string{"model_ref": "tiny", "for": "b"})
	if got := c.metric(`apiary_queen_evictions_total{for="b",model="tiny"}`); got != "1" {
		t.Errorf("evictions of tiny for b: %q", got)
	}
	if n := c.queen.logs.Count("placement found no pool", nil); n != 0 {
		t.Errorf("%d placements failed; eviction must have made room", n)
	}

	ask("tiny") // and back
	if now := running(); now["tiny"].ID == "" || now["b"].ID != "" {
		t.Errorf("after tiny again: running %+v", now)
	}

	// A busy worker is never cut: a request for the other model waits for
	// its stream to end (within --swap-wait), then evicts it and is served.
	long := func() (stop func()) {
		t.Helper()
		ctx, cancel := context.WithCancel(t.Context())
		first := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			p := completion(100000)
			p.Model = "tiny"
			c.stream(ctx, p, first)
		}()
		<-first
		return func() { cancel(); <-done }
	}
	stop := long()
	answered := make(chan error, 1)
	go func() {
		_, err := c.client.Chat.Completions.New(t.Context(), oai.ChatCompletionNewParams{Model: "b", MaxTokens: oai.Int(4),
			Messages: []oai.ChatCompletionMessageParamUnion{oai.UserMessage("Hi")}})
		answered <- err
	}()
	select {
	case err := <-answered:
		t.Fatalf("b was answered while tiny's only worker was busy: %v", err)
	case <-time.After(swapWait / 2):
	}
	stop()
	if err := <-answered; err != nil {
		t.Fatalf("b after tiny's stream ended: %v", err)
	}

	// Past --swap-wait: 503 with the reason.
	ask("tiny")
	stop = long()
	defer stop()
	start := time.Now()
	_, err = c.client.Chat.Completions.New(t.Context(), oai.ChatCompletionNewParams{Model: "b", MaxTokens: oai.Int(4),
		Messages: []oai.ChatCompletionMessageParamUnion{oai.UserMessage("Hi")}})
	var apiErr *oai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusServiceUnavailable || !strings.Contains(apiErr.Message, "--swap-wait") {
		t.Errorf("b while tiny streams past --swap-wait: %v", err)
	}
	if took := time.Since(start); took < swapWait {
		t.Errorf("refused after %s, before --swap-wait %s", took, swapWait)
	}
}
