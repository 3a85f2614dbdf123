//go:build !race

package queen

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	oai "github.com/openai/openai-go"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/keeper"
	"github.com/apiary-llm/apiary/internal/modelstore"
	"github.com/apiary-llm/apiary/internal/routing"
	"github.com/apiary-llm/apiary/internal/testbin"
	"github.com/apiary-llm/apiary/internal/testmodel"
	apworker "github.com/apiary-llm/apiary/internal/worker"
)

// Swap on demand: a hive whose CPU offers room for one worker (--cpu-memory)
// and two models. A request for the second finds no room: the controller
// stops the first model's idle worker (one worker.evicted audit entry,
// counted), waits for its memory and places the second — the request
// waits and is served, never refused. Then back again. A busy worker is
// never cut: a stream the test holds (the workers' test knob) keeps its
// worker, the other model's request waits for its end, and the stream
// ends whole; held past --swap-wait, the request gets a 503 with why.
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
	h := newHolds(t)
	c := startClusterWith(t, clusterOptions{model: shape, more: map[string]testmodel.Options{"b": other}, hiveEnv: h.env()},
		[]string{"--swap-wait", swapWait.String(), "--min-residency", "0"},
		append(h.hiveArgs(), "--cpu-memory", fmt.Sprint(capacity), "--worker-ctx-size", "1024")...)

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
	if evs := c.evictionEntries(); len(evs) != 1 || evs[0].Target != first.ID || evs[0].Reason != "evicted for b" || evs[0].Metadata["for"] != "b" {
		t.Errorf("worker.evicted audit entries %+v, want one of %s, reason \"evicted for b\", for b", evs, first.ID)
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

	// A busy worker is never cut: a request for the other model waits
	// while tiny's stream is held, the controller weighing it round after
	// round; once the stream ends (whole) b is served.
	const n = 32
	held := func() (first chan struct{}, done chan wholeStream) {
		first, done = make(chan struct{}), make(chan wholeStream, 1)
		h.hold("tiny")
		go func() { done <- c.streamWhole(t.Context(), "tiny", n, first) }()
		select {
		case <-first:
		case s := <-done:
			t.Fatalf("tiny's stream ended before its first token: %+v", s)
		}
		return first, done
	}
	_, done := held()
	answered := make(chan error, 1)
	go func() {
		_, err := c.client.Chat.Completions.New(t.Context(), oai.ChatCompletionNewParams{Model: "b", MaxTokens: oai.Int(4),
			Messages: []oai.ChatCompletionMessageParamUnion{oai.UserMessage("Hi")}})
		answered <- err
	}()
	c.waitMetric(`apiary_queen_queue_depth{model="b"}`, func(v float64) bool { return v >= 1 })
	rounds := c.metricValue("apiary_queen_controller_rounds_total")
	c.waitMetric("apiary_queen_controller_rounds_total", func(v float64) bool { return v >= rounds+2 })
	select {
	case err := <-answered:
		t.Fatalf("b was answered while tiny's only worker streamed: %v", err)
	default:
	}
	if now := running(); now["tiny"].ID == "" {
		t.Fatalf("tiny's worker is not RUNNING while its stream is held: %+v", now)
	}
	h.release("tiny")
	c.checkWhole(<-done, n)
	if err := <-answered; err != nil {
		t.Fatalf("b after tiny's stream ended: %v", err)
	}

	// Past --swap-wait: 503 with the reason.
	ask("tiny")
	_, done = held()
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
	h.release("tiny")
	c.checkWhole(<-done, n)
	if evs := c.evictionEntries(); len(evs) != 4 {
		t.Errorf("%d worker.evicted audit entries, want 4 (tiny for b, b for tiny, twice each): %+v", len(evs), evs)
	}
}

// swapSoakEnv sets how long TestProcessSwapMaxLoaded's clients alternate
// (default 6s; docs/queen.md's figure is of 60s), swapResidencyEnv its
// --min-residency (default 1s; the figure's is the queen's default).
const (
	swapSoakEnv      = "APIARY_SWAP_SOAK"
	swapResidencyEnv = "APIARY_SWAP_MIN_RESIDENCY"
)

// A hive that runs one worker at a time (--max-loaded 1) and two
// configured models: requests for tiny, b, tiny, b, tiny in turn are each
// served, every switch an audited eviction, and only the last model's
// worker runs at the end; the pool's listing shows the evictions and the
// worker's last use. Then 4 clients alternate the two models: no request
// fails, and the device swaps no more often than --min-residency allows.
// Then tiny is pinned: a request for b is refused at once, with why.
func TestProcessSwapMaxLoaded(t *testing.T) {
	soak := 6 * time.Second
	if v := os.Getenv(swapSoakEnv); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("%s=%q: %v", swapSoakEnv, v, err)
		}
		soak = d
	}
	minResidency := time.Second
	if v := os.Getenv(swapResidencyEnv); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("%s=%q: %v", swapResidencyEnv, v, err)
		}
		minResidency = d
	}
	swapWait := max(10*time.Second, 3*minResidency)
	config := filepath.Join(t.TempDir(), "models.yaml")
	if err := os.WriteFile(config, []byte("models:\n  tiny: {}\n  b: {}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	other := testmodel.Options{Seed: 2}
	c := startClusterWith(t, clusterOptions{more: map[string]testmodel.Options{"b": other}},
		[]string{"--config", config, "--config-poll", "100ms", "--min-residency", minResidency.String(), "--swap-wait", swapWait.String()},
		"--max-loaded", "1")
	ask := func(ctx context.Context, model string) error {
		_, err := c.client.Chat.Completions.New(ctx, oai.ChatCompletionNewParams{Model: model, MaxTokens: oai.Int(2), Temperature: oai.Float(0),
			Messages: []oai.ChatCompletionMessageParamUnion{oai.UserMessage("Say hello to the bees.")}})
		return err
	}
	evictions := func() int {
		n := 0
		for _, pair := range [][2]string{{"tiny", "b"}, {"b", "tiny"}} {
			v := c.metric(fmt.Sprintf(`apiary_queen_evictions_total{for="%s",model="%s"}`, pair[1], pair[0]))
			var k int
			if v != "" {
				if _, err := fmt.Sscan(v, &k); err != nil {
					t.Fatalf("evictions %q: %v", v, err)
				}
			}
			n += k
		}
		return n
	}

	for i, model := range []string{"tiny", "b", "tiny", "b", "tiny"} {
		if err := ask(t.Context(), model); err != nil {
			t.Fatalf("request %d, for %s: %v", i+1, model, err)
		}
	}
	if n := evictions(); n != 4 {
		t.Errorf("%d evictions after 4 switches, want 4", n)
	}
	var running []string
	for _, r := range c.rows() {
		if r.Status == "RUNNING" {
			running = append(running, r.ModelRef)
		}
	}
	if len(running) != 1 || running[0] != "tiny" {
		t.Errorf("running after the turns: %v, want tiny's worker alone", running)
	}
	audited := map[string]int{}
	for _, e := range c.evictionEntries() {
		audited[e.Reason]++
	}
	if audited["evicted for b"] != 2 || audited["evicted for tiny"] != 2 {
		t.Errorf("worker.evicted audit entries by reason: %v, want 2 \"evicted for b\" and 2 \"evicted for tiny\"", audited)
	}
	pools, err := c.admin.Pools(t.Context(), keeper.PoolFilter{})
	if err != nil || len(pools) != 1 {
		t.Fatalf("pools: %+v, %v", pools, err)
	}
	p := pools[0]
	if p.MaxLoaded != 1 || len(p.Evictions) != 4 || p.Evictions[0].Model != "b" || p.Evictions[0].For != "tiny" || p.Evictions[0].LastUsedAt == nil {
		t.Errorf("pool listing: max_loaded %d, evictions %+v; want 1 and 4, the newest b's for tiny with its last use", p.MaxLoaded, p.Evictions)
	}
	for _, w := range p.Workers {
		if w.ModelRef == "tiny" && w.StoppedAt == nil && w.LastUsedAt == nil {
			t.Errorf("tiny's worker is listed without its last use: %+v", w)
		}
	}

	// 4 clients, each asking for the two models in turn.
	before := evictions()
	var served, failed atomic.Int64
	var worst atomic.Int64
	var firstErr sync.Once
	ctx, cancel := context.WithTimeout(t.Context(), soak)
	defer cancel()
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			for k := i; ctx.Err() == nil; k++ {
				model := []string{"tiny", "b"}[k%2]
				start := time.Now()
				err := ask(t.Context(), model)
				if took := time.Since(start); int64(took) > worst.Load() {
					worst.Store(int64(took))
				}
				if err != nil {
					failed.Add(1)
					firstErr.Do(func() { t.Errorf("client %d, request for %s: %v", i, model, err) })
					continue
				}
				served.Add(1)
			}
		})
	}
	wg.Wait()
	swaps := evictions() - before
	bound := math.MaxInt // no rule: no bound
	if minResidency > 0 {
		bound = routing.ThrashEvictions + int(math.Ceil(soak.Seconds()/minResidency.Seconds())) + 1
	}
	t.Logf("4 clients alternating for %s: %d served, %d failed, %d swaps (%.1f a minute; bound %d), slowest request %s",
		soak, served.Load(), failed.Load(), swaps, float64(swaps)*time.Minute.Seconds()/soak.Seconds(), bound, time.Duration(worst.Load()).Round(time.Millisecond))
	if failed.Load() > 0 {
		t.Errorf("%d requests failed while 4 clients alternated", failed.Load())
	}
	if swaps > bound {
		t.Errorf("%d swaps in %s with --min-residency %s: over the rule's bound %d", swaps, soak, minResidency, bound)
	}

	// Pinned: tiny's worker is never evicted, so b cannot run.
	if err := os.WriteFile(config, []byte("models:\n  tiny: {pin: true}\n  b: {}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c.queen.logs.wait(t, 0, "model config reloaded", map[string]string{"trigger": "file changed"})
	if err := ask(t.Context(), "tiny"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = ask(t.Context(), "b")
	var apiErr *oai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusServiceUnavailable || !strings.Contains(apiErr.Message, "--max-loaded") {
		t.Errorf("b while pinned tiny holds the pool's one place: %v", err)
	}
	if took := time.Since(start); took >= swapWait {
		t.Errorf("refused after %s: a pinned worker is not waited for", took)
	}
}

// swapLoadEnv sets how long TestProcessSwapUnderLoad's six clients stream
// (default 4s; docs/queen.md's figure is of 40s), swapLoadRoundsEnv how many
// held streams it ends to time the swap after them (default 2).
const (
	swapLoadEnv       = "APIARY_SWAP_LOAD"
	swapLoadRoundsEnv = "APIARY_SWAP_ROUNDS"
)

// The bar of swap under load: one hive that runs one worker at a time
// (--max-loaded 1) and probes its workers every 2 s, three configured
// models.
//
// First, a request for another model while a held stream runs: the hive's
// probe has seen the worker busy; the test ends the stream; the queen
// evicts the worker before the hive's next probe (it counts its own
// requests, not the hive's report), the hive never sees the worker ready
// again, and the request is served (the time after the stream's end is
// logged: docs/queen.md's figure).
//
// Then six clients stream completions for a while, each asking the three
// models in turn: every request is answered 200 and streamed whole (the
// tokens counted match the usage), no worker is evicted twice, and each
// eviction is one worker.evicted audit entry.
func TestProcessSwapUnderLoad(t *testing.T) {
	load := durationEnv(t, swapLoadEnv, 4*time.Second)
	rounds := 2
	if v := os.Getenv(swapLoadRoundsEnv); v != "" {
		if _, err := fmt.Sscan(v, &rounds); err != nil || rounds < 1 {
			t.Fatalf("%s=%q: want a count of at least 1", swapLoadRoundsEnv, v)
		}
	}
	const healthInterval = 2 * time.Second
	config := filepath.Join(t.TempDir(), "models.yaml")
	if err := os.WriteFile(config, []byte("models:\n  tiny: {}\n  b: {}\n  c: {}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	h := newHolds(t)
	c := startClusterWith(t, clusterOptions{more: map[string]testmodel.Options{"b": {Seed: 2}, "c": {Seed: 3}}, hiveEnv: h.env()},
		[]string{"--config", config}, append(h.hiveArgs(), "--max-loaded", "1", "--health-interval", healthInterval.String())...)

	for i := range rounds {
		held, next := []string{"tiny", "b"}[i%2], []string{"b", "tiny"}[i%2]
		if s := c.streamWhole(t.Context(), held, 2, nil); s.err != nil {
			t.Fatalf("round %d: %s: %v", i+1, held, s.err)
		}
		hiveFrom, queenFrom := c.hive.logs.Len(), c.queen.logs.Len()
		h.hold(held)
		first, done := make(chan struct{}), make(chan wholeStream, 1)
		go func() { done <- c.streamWhole(t.Context(), held, 16, first) }()
		<-first
		other := make(chan wholeStream, 1)
		go func() { other <- c.streamWhole(t.Context(), next, 2, nil) }()
		// The hive's probe sees the worker busy; the stream ends at once.
		busy, _ := c.hive.logs.wait(t, hiveFrom, "worker state", map[string]string{"model_ref": held, "to": "busy"})
		c.waitMetric(fmt.Sprintf(`apiary_queen_queue_depth{model="%s"}`, next), func(v float64) bool { return v >= 1 })
		h.release(held)
		s := <-done
		c.checkWhole(s, 16)
		o := <-other
		c.checkWhole(o, 2)
		ev, _ := c.queen.logs.wait(t, queenFrom, "worker evicted", map[string]string{"model_ref": held, "for": next})
		probe := logTime(t, busy).Add(healthInterval)
		if at := logTime(t, ev); !at.Before(probe) {
			t.Errorf("round %d: %s's worker evicted at %s, not before the hive's next probe at %s: the queen waited for the hive's report",
				i+1, held, at.Format(time.StampMicro), probe.Format(time.StampMicro))
		}
		if c.hive.logs.Has("worker state", map[string]string{"worker_id": busy.Attrs["worker_id"], "from": "busy", "to": "ready"}) {
			t.Errorf("round %d: the hive saw %s's worker ready again before it was evicted", i+1, held)
		}
		t.Logf("round %d: %s served %s after %s's stream ended (its first token; whole after %s; the eviction after %s)", i+1, next,
			o.firstAt.Sub(s.end).Round(time.Millisecond), held, o.end.Sub(s.end).Round(time.Millisecond), logTime(t, ev).Sub(s.end).Round(time.Millisecond))
	}

	swapUnderConcurrency(t, c, "--max-loaded 1", load)
}

// The same six clients on a hive whose CPU memory (--cpu-memory) holds
// one worker of the three models and not two: the hive refuses a second
// one 507, which the queen must not pass on to a client while an eviction
// can make the room (the issue saw 503 4 ms after such a refusal). The
// models are big enough that the hive's estimate, not a worker count,
// is the limit.
func TestProcessSwapUnderLoadCPUMemory(t *testing.T) {
	load := durationEnv(t, swapLoadEnv, 4*time.Second)
	shape := testmodel.Options{Dim: 256, Heads: 4, Layers: 4, FF: 512, Vocab: 2000}
	probe := filepath.Join(t.TempDir(), "probe.gguf")
	if err := testmodel.WriteFile(probe, shape); err != nil {
		t.Fatal(err)
	}
	info, err := modelstore.ReadInfo(probe)
	if err != nil {
		t.Fatal(err)
	}
	capacity := info.EstimateMemory(1024).Total * 6 / 5
	config := filepath.Join(t.TempDir(), "models.yaml")
	if err := os.WriteFile(config, []byte("models:\n  tiny: {}\n  b: {}\n  c: {}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	b, cc := shape, shape
	b.Seed, cc.Seed = 2, 3
	c := startClusterWith(t, clusterOptions{model: shape, more: map[string]testmodel.Options{"b": b, "c": cc}},
		[]string{"--config", config, "--min-residency", "0"}, "--cpu-memory", fmt.Sprint(capacity), "--worker-ctx-size", "1024")
	swapUnderConcurrency(t, c, "--cpu-memory for one worker", load)
}

// swapUnderConcurrency runs six clients for load, each asking the three
// models tiny, b and c in turn: every request is answered 200 and
// streamed whole, no worker is evicted twice, and each eviction is one
// worker.evicted audit entry.
func swapUnderConcurrency(t *testing.T, c *cluster, limit string, load time.Duration) {
	t.Helper()
	models := []string{"tiny", "b", "c"}
	before := c.evictionEntries()
	var served, failed atomic.Int64
	var worst atomic.Int64
	ctx, cancel := context.WithTimeout(t.Context(), load)
	defer cancel()
	var wg sync.WaitGroup
	for i := range 6 {
		wg.Go(func() {
			for k := i; ctx.Err() == nil; k++ {
				s := c.streamWhole(t.Context(), models[k%3], 8, nil)
				if took := s.end.Sub(s.start); int64(took) > worst.Load() {
					worst.Store(int64(took))
				}
				if s.err != nil || s.tokens != 8 || s.usage != 8 || s.finish != "length" {
					if failed.Add(1) <= 3 {
						t.Errorf("client %d, %s: %d tokens received, %d reported, finish_reason %q, err %v; want 8, 8, length", i, models[k%3], s.tokens, s.usage, s.finish, s.err)
					}
					continue
				}
				served.Add(1)
			}
		})
	}
	wg.Wait()
	evs := c.evictionEntries()
	swaps := len(evs) - len(before)
	t.Logf("6 clients, 3 models, %s, for %s: %d served whole, %d not, %d swaps (%.0f a minute), slowest request %s",
		limit, load, served.Load(), failed.Load(), swaps, float64(swaps)*time.Minute.Seconds()/load.Seconds(), time.Duration(worst.Load()).Round(time.Millisecond))
	if served.Load() == 0 {
		t.Errorf("no request served in %s", load)
	}
	byRow := map[string]int{}
	for _, e := range evs {
		if byRow[e.Target]++; byRow[e.Target] == 2 {
			t.Errorf("worker %s evicted twice: %+v", e.Target, evs)
		}
	}
	var metric int
	for _, victim := range models {
		for _, forModel := range models {
			if v := c.metric(fmt.Sprintf(`apiary_queen_evictions_total{for="%s",model="%s"}`, forModel, victim)); v != "" {
				var k int
				if _, err := fmt.Sscan(v, &k); err != nil {
					t.Fatalf("evictions %q: %v", v, err)
				}
				metric += k
			}
		}
	}
	if metric != len(evs) {
		t.Errorf("%d evictions counted, %d worker.evicted audit entries: want one entry each", metric, len(evs))
	}
}

// durationEnv is the duration in the environment variable name, or def.
func durationEnv(t *testing.T, name string, def time.Duration) time.Duration {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		t.Fatalf("%s=%q: %v", name, v, err)
	}
	return d
}

// holds is the workers' test knob (apworker.TestHoldEnv): a directory where
// a file named a model holds that model's generations after their first
// token until the test removes it, however fast the CPU generates.
type holds struct {
	t   *testing.T
	dir string
}

func newHolds(t *testing.T) *holds { return &holds{t: t, dir: t.TempDir()} }

// env is the hive's environment for the knob; hiveArgs passes it on to
// the workers.
func (h *holds) env() []string      { return []string{apworker.TestHoldEnv + "=" + h.dir} }
func (h *holds) hiveArgs() []string { return []string{"--pass-env", apworker.TestHoldEnv} }

func (h *holds) hold(model string) {
	h.t.Helper()
	if err := os.WriteFile(filepath.Join(h.dir, model), nil, 0o644); err != nil {
		h.t.Fatal(err)
	}
}

func (h *holds) release(model string) {
	h.t.Helper()
	if err := os.Remove(filepath.Join(h.dir, model)); err != nil {
		h.t.Fatal(err)
	}
}

// wholeStream is a streamed completion as a test counts it.
type wholeStream struct {
	tokens  int    // received: the tokens of every chunk's logprobs
	usage   int64  // completion_tokens of the usage chunk
	finish  string // the finish_reason received
	start   time.Time
	firstAt time.Time // the first chunk
	end     time.Time // the stream's end
	err     error
}

// streamWhole streams a greedy completion of n tokens of model (EOS
// ignored, each token's logprob asked for so that the test counts the
// tokens it receives); first, when not nil, is closed at the first chunk.
func (c *cluster) streamWhole(ctx context.Context, model string, n int, first chan struct{}) wholeStream {
	p := completion(n)
	p.Model = oai.CompletionNewParamsModel(model)
	p.Logprobs = oai.Int(0)
	p.StreamOptions = oai.ChatCompletionStreamOptionsParam{IncludeUsage: oai.Bool(true)}
	out := wholeStream{start: time.Now()}
	s := c.client.Completions.NewStreaming(ctx, p, ignoreEOS)
	defer s.Close()
	for s.Next() {
		if out.firstAt.IsZero() {
			out.firstAt = time.Now()
			if first != nil {
				close(first)
			}
		}
		ch := s.Current()
		for _, choice := range ch.Choices {
			out.tokens += len(choice.Logprobs.Tokens)
			if choice.FinishReason != "" {
				out.finish = string(choice.FinishReason)
			}
		}
		if ch.Usage.CompletionTokens > 0 {
			out.usage = ch.Usage.CompletionTokens
		}
	}
	out.end, out.err = time.Now(), s.Err()
	return out
}

// checkWhole fails the test unless s ended whole: n tokens received, n
// reported, finish_reason length.
func (c *cluster) checkWhole(s wholeStream, n int) {
	c.t.Helper()
	if s.err != nil || s.tokens != n || s.usage != int64(n) || s.finish != "length" {
		c.t.Fatalf("stream %+v, want %d tokens received and reported, finish_reason length", s, n)
	}
}

// evictionEntries returns the audit entries of evictions (worker.evicted
// by the queen), newest first; a stop audited worker.stop for an eviction
// fails the test.
func (c *cluster) evictionEntries() []api.AuditEntry {
	c.t.Helper()
	entries, err := c.admin.Audit(context.Background(), "", 10000)
	if err != nil {
		c.t.Fatal(err)
	}
	if len(entries) == 10000 {
		c.t.Fatal("10000 audit entries: more than one read holds")
	}
	var out []api.AuditEntry
	for _, e := range entries {
		switch {
		case e.Action == "worker.evicted" && e.Actor == "queen":
			out = append(out, e)
		case e.Action == "worker.stop" && strings.HasPrefix(e.Reason, "evicted for"):
			c.t.Errorf("an eviction audited worker.stop: %+v", e)
		}
	}
	return out
}

// metricValue is metric(prefix) as a number (0 when absent).
func (c *cluster) metricValue(prefix string) float64 {
	c.t.Helper()
	v := c.metric(prefix)
	if v == "" {
		return 0
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		c.t.Fatalf("metric %s: %q: %v", prefix, v, err)
	}
	return f
}

// waitMetric waits until the queen's metric prefix satisfies ok, at most
// testbin.WaitLimit (reaching it fails the test).
func (c *cluster) waitMetric(prefix string, ok func(float64) bool) {
	c.t.Helper()
	deadline := time.Now().Add(testbin.WaitLimit)
	for !ok(c.metricValue(prefix)) {
		if time.Now().After(deadline) {
			c.t.Fatalf("metric %s is %q after %s", prefix, c.metric(prefix), testbin.WaitLimit)
		}
		time.Sleep(10 * time.Millisecond) // a poll of a condition, not a guess of a duration
	}
}
