//go:build !race

package queen

// Prefix-aware routing against least-loaded, with real processes: a
// queen, a hive and four workers of the test model, a multi-turn chat
// workload without session ids.
//
//	make bench-prefix   # go test -run '^$' -bench PrefixRouting -benchtime 1x ./internal/queen/

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/benchmark"
	"github.com/apiary-llm/apiary/internal/keeper"
	"github.com/apiary-llm/apiary/internal/testmodel"
)

// The workload (docs/benchmarks.md, "Routing by prefix").
const (
	prefixWorkers       = 4
	prefixSlots         = 2 // per worker: 8 slots for 8 conversations
	prefixConversations = 8
	prefixTurns         = 5
	prefixClients       = 4
	prefixSystemWords   = 170 // about 1,000 bytes: the test model's tokens are bytes
	prefixAnswerTokens  = 16
	// The shared-system-prompt workload: prefixApps system prompts,
	// prefixSharedRequests requests per client.
	prefixApps           = 4
	prefixSharedRequests = 12
)

// prefixModel is the model's shape: 8 layers of 256 (about 12 MB), so
// that reading a prompt costs more than the relay and the HTTP round
// trips around it (the default test model reads 1,000 tokens in tens of
// milliseconds on this machine: routing cannot show in that).
var prefixModel = testmodel.Options{Layers: 8, Dim: 256}

// turnSample is one request of the workload.
type turnSample struct {
	turn           int
	ttft           time.Duration
	prompt, cached int
	completion     int
	route          string
}

// BenchmarkPrefixRouting runs each workload once with --routing
// least-loaded and once with --routing prefix, each on a fresh queen and
// hive, and reports the time to first token (of turns 2.. in a
// conversation; of every request with a shared system prompt), p50 and
// p95, the throughput, the share of the prompt tokens the workers
// reported cached, and the prefix routes' hit rate.
func BenchmarkPrefixRouting(b *testing.B) {
	for _, w := range []struct {
		name string
		run  func(b *testing.B, qURL string) []turnSample
	}{{"multi-turn", multiTurnWorkload}, {"shared-system", sharedSystemWorkload}} {
		b.Run(w.name, func(b *testing.B) {
			results := map[string][]turnSample{}
			took := map[string]time.Duration{}
			for b.Loop() {
				for _, routing := range []string{"least-loaded", "prefix"} {
					samples, d := runPrefixWorkload(b, routing, w.run)
					results[routing] = append(results[routing], samples...)
					took[routing] += d
				}
			}
			reportPrefixRuns(b, results, took)
		})
	}
}

// reportPrefixRuns reports the figures of both routings' samples (those
// of a conversation's first turn left out) and their ratio.
func reportPrefixRuns(b *testing.B, results map[string][]turnSample, took map[string]time.Duration) {
	var p50 [2]time.Duration
	for i, routing := range []string{"least-loaded", "prefix"} {
		var ttft []time.Duration
		prompt, cached, hits, routes, completion := 0, 0, 0, 0, 0
		for _, s := range results[routing] {
			completion += s.completion
			if s.turn == 0 {
				continue
			}
			ttft = append(ttft, s.ttft)
			prompt += s.prompt
			cached += s.cached
			if strings.HasPrefix(s.route, "prefix ") {
				routes++
				if strings.HasPrefix(s.route, "prefix hit") {
					hits++
				}
			}
		}
		slices.Sort(ttft)
		p50[i] = ttft[len(ttft)/2]
		p95 := ttft[min(len(ttft)-1, len(ttft)*95/100)]
		share := float64(cached) / float64(max(prompt, 1))
		rate := float64(len(results[routing])) / took[routing].Seconds()
		b.ReportMetric(float64(p50[i].Microseconds())/1000, routing+"-ttft-p50-ms")
		b.ReportMetric(float64(p95.Microseconds())/1000, routing+"-ttft-p95-ms")
		b.ReportMetric(share*100, routing+"-cached-%")
		b.ReportMetric(rate, routing+"-req/s")
		line := fmt.Sprintf("%s: %d requests counted: TTFT p50 %s p95 %s; %d of %d prompt tokens cached (%.1f %%); %d requests in %s (%.2f/s, %.1f completion tok/s)",
			routing, len(ttft), p50[i].Round(time.Millisecond), p95.Round(time.Millisecond), cached, prompt, share*100,
			len(results[routing]), took[routing].Round(time.Millisecond), rate, float64(completion)/took[routing].Seconds())
		if routes > 0 {
			b.ReportMetric(100*float64(hits)/float64(routes), routing+"-hit-%")
			line += fmt.Sprintf("; prefix routes: %d hits of %d", hits, routes)
		}
		b.Log(line)
	}
	b.ReportMetric(float64(p50[1])/float64(p50[0]), "prefix/least-loaded-p50")
	b.Logf("TTFT p50 prefix / least-loaded = %.3f; machine: %s; load %s", float64(p50[1])/float64(p50[0]),
		machineLine(), benchmark.LoadAverage())
}

// runPrefixWorkload starts a queen with --routing routing and a hive
// with prefixWorkers workers, and runs the workload on them; it returns
// its samples and how long it took.
func runPrefixWorkload(b *testing.B, routing string, workload func(b *testing.B, qURL string) []turnSample) ([]turnSample, time.Duration) {
	dataDir := b.TempDir()
	slots := fmt.Sprint(prefixSlots)
	q, qURL := startQueenProc(b, dataDir, "", "--routing", routing, "--worker-slots", slots, "--max-workers", fmt.Sprint(prefixWorkers))
	dir := b.TempDir()
	models := filepath.Join(dir, "models")
	if err := os.MkdirAll(models, 0o755); err != nil {
		b.Fatal(err)
	}
	if err := testmodel.WriteFile(filepath.Join(models, "tiny.gguf"), prefixModel); err != nil {
		b.Fatal(err)
	}
	hive := startProc(b, "hive node-1", nil, "hive", "--addr", "127.0.0.1:0", "--queen", qURL, "--pool-id", "node-1", "--data-dir", dir,
		"--heartbeat-interval", "500ms", "--worker-ports", "25000-25999", "--worker-threads", "1", "--worker-slots", slots,
		"--worker-ctx-size", fmt.Sprint(prefixSlots*4096))
	defer func() {
		if b.Failed() {
			b.Logf("queen logs:\n%s", q.logs.String())
			b.Logf("hive logs:\n%s", hive.logs.String())
		}
		_ = hive.stop(b, syscall.SIGTERM)
		_ = q.stop(b, syscall.SIGTERM)
	}()
	ctx := b.Context()
	admin := keeper.NewClient(qURL, "", "")
	n := prefixWorkers
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if _, err := admin.ScaleModel(ctx, "tiny", prefixWorkers, &n, "prefix routing benchmark"); err == nil {
			break
		} else if time.Now().After(deadline) {
			b.Fatalf("models scale: %v", err)
		}
	}
	for deadline := time.Now().Add(120 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		rows, err := admin.Workers(ctx, keeper.WorkerFilter{Status: "RUNNING", Model: "tiny"})
		if err == nil && len(rows) == prefixWorkers {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d workers RUNNING after 2 minutes (%v)", len(rows), prefixWorkers, err)
		}
	}
	start := time.Now()
	samples := workload(b, qURL)
	took := time.Since(start)
	if f := os.Getenv("APIARY_BENCH_ROUTES"); f != "" {
		// Every request's figures and route, and the queen's log, to a file.
		var out strings.Builder
		for _, s := range samples {
			fmt.Fprintf(&out, "%s turn %d: prompt %d cached %d ttft %s route %q\n", routing, s.turn+1, s.prompt, s.cached, s.ttft.Round(time.Millisecond), s.route)
		}
		out.WriteString(q.logs.String())
		if err := os.WriteFile(f+"."+strings.ReplaceAll(b.Name(), "/", "-")+"."+routing, []byte(out.String()), 0o644); err != nil {
			b.Error(err)
		}
	}
	return samples, took
}

// message is a chat message of the workloads.
type message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// multiTurnWorkload: prefixClients clients take prefixConversations
// conversations, each with its own long system prompt, in turns
// (conversation c's turn t after its turn t-1 answered), each request
// streamed with its usage.
func multiTurnWorkload(b *testing.B, qURL string) []turnSample {
	convs := make([][]message, prefixConversations)
	for c := range convs {
		convs[c] = []message{{Role: "system", Content: benchmark.Words(uint64(1000+c), prefixSystemWords)}}
	}
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: prefixClients}}
	defer hc.CloseIdleConnections()
	var (
		mu      sync.Mutex
		samples []turnSample
		wg      sync.WaitGroup
	)
	// Client k runs conversations k, k+clients, … turn by turn,
	// interleaved: every conversation's next turn comes after the
	// others' of that client, as users who read the answer first. Each
	// turn the client takes its conversations in a shuffled order (the
	// same seeds for both routings): clients in lockstep would send each
	// conversation to the same worker by the order of arrival alone.
	for k := range prefixClients {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(k), 7))
			var mine []int
			for c := k; c < prefixConversations; c += prefixClients {
				mine = append(mine, c)
			}
			for turn := range prefixTurns {
				rng.Shuffle(len(mine), func(i, j int) { mine[i], mine[j] = mine[j], mine[i] })
				for _, c := range mine {
					convs[c] = append(convs[c], message{Role: "user", Content: benchmark.Words(uint64(c*100+turn), 12)})
					body, _ := json.Marshal(map[string]any{"model": "tiny", "messages": convs[c], "max_tokens": prefixAnswerTokens,
						"temperature": 0, "stream": true, "stream_options": map[string]any{"include_usage": true}})
					s, answer, err := streamTurn(hc, qURL, body)
					if err != nil {
						b.Errorf("conversation %d turn %d: %v", c, turn+1, err)
						return
					}
					s.turn = turn
					convs[c] = append(convs[c], message{Role: "assistant", Content: answer})
					mu.Lock()
					samples = append(samples, s)
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	return samples
}

// sharedSystemWorkload: the traffic of agents and RAG front ends, single
// requests that share a long system prompt (one of prefixApps, each
// about 1,000 bytes) and differ in their question. prefixClients clients
// send prefixSharedRequests requests each, one after the other, the
// apps in a shuffled order. A request counts from its app's second on
// (turn 1): the first of each app is cold under any routing.
func sharedSystemWorkload(b *testing.B, qURL string) []turnSample {
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: prefixClients}}
	defer hc.CloseIdleConnections()
	systems := make([]string, prefixApps)
	for a := range systems {
		systems[a] = benchmark.Words(uint64(2000+a), prefixSystemWords)
	}
	var (
		mu      sync.Mutex
		samples []turnSample
		seen    = map[int]bool{}
		wg      sync.WaitGroup
	)
	for k := range prefixClients {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(k), 11))
			for i := range prefixSharedRequests {
				a := rng.IntN(prefixApps)
				msgs := []message{{Role: "system", Content: systems[a]},
					{Role: "user", Content: benchmark.Words(uint64(k*1000+i), 12)}}
				body, _ := json.Marshal(map[string]any{"model": "tiny", "messages": msgs, "max_tokens": prefixAnswerTokens,
					"temperature": 0, "stream": true, "stream_options": map[string]any{"include_usage": true}})
				s, _, err := streamTurn(hc, qURL, body)
				if err != nil {
					b.Errorf("client %d request %d: %v", k, i+1, err)
					return
				}
				mu.Lock()
				if seen[a] {
					s.turn = 1
				}
				seen[a] = true
				samples = append(samples, s)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return samples
}

// streamTurn sends one streamed chat request and reads it to its end:
// the time to its first event with text, its usage and its answer.
func streamTurn(hc *http.Client, base string, body []byte) (turnSample, string, error) {
	start := time.Now()
	resp, err := hc.Post(base+"/v1/chat/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		return turnSample{}, "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return turnSample{}, "", fmt.Errorf("status %s", resp.Status)
	}
	s := turnSample{route: resp.Header.Get("X-Apiary-Route")}
	var answer strings.Builder
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var ch struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
			Usage *struct {
				PromptTokens        int `json:"prompt_tokens"`
				CompletionTokens    int `json:"completion_tokens"`
				PromptTokensDetails struct {
					CachedTokens int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if err := json.Unmarshal([]byte(data), &ch); err != nil {
			return s, "", fmt.Errorf("an event that is no JSON: %w", err)
		}
		if len(ch.Choices) > 0 && ch.Choices[0].Delta.Content != "" && s.ttft == 0 {
			s.ttft = time.Since(start) // the first text: the role's event comes before the prompt is read
		}
		for _, c := range ch.Choices {
			answer.WriteString(c.Delta.Content)
		}
		if ch.Usage != nil {
			s.prompt, s.cached, s.completion = ch.Usage.PromptTokens, ch.Usage.PromptTokensDetails.CachedTokens, ch.Usage.CompletionTokens
		}
	}
	if s.prompt == 0 {
		return s, "", fmt.Errorf("the stream ended without its usage (%v)", sc.Err())
	}
	return s, answer.String(), sc.Err()
}

func machineLine() string {
	m := benchmark.ThisMachine()
	return fmt.Sprintf("%s, %d CPUs", m.CPU, m.Cores)
}
