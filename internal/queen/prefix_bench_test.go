package queen

// Prefix-aware routing against least-loaded, with real processes: a
// queen, a hive and four workers of the test model, a multi-turn chat
// workload without session ids.
//
//	go test -run '^$' -bench PrefixRouting -benchtime 1x ./internal/queen/

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
	route          string
}

// BenchmarkPrefixRouting runs the workload once with --routing
// least-loaded and once with --routing prefix, each on a fresh queen and
// hive, and reports the time to first token of turns 2.. (p50, p95), the
// share of their prompt tokens the workers reported cached, and the
// prefix routes' hit rate.
func BenchmarkPrefixRouting(b *testing.B) {
	results := map[string][]turnSample{}
	for b.Loop() {
		for _, routing := range []string{"least-loaded", "prefix"} {
			results[routing] = append(results[routing], runPrefixWorkload(b, routing)...)
		}
	}
	var p50 [2]time.Duration
	for i, routing := range []string{"least-loaded", "prefix"} {
		var ttft []time.Duration
		prompt, cached, hits, routes := 0, 0, 0, 0
		for _, s := range results[routing] {
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
		b.ReportMetric(float64(p50[i].Microseconds())/1000, routing+"-ttft-p50-ms")
		b.ReportMetric(float64(p95.Microseconds())/1000, routing+"-ttft-p95-ms")
		b.ReportMetric(share*100, routing+"-cached-%")
		line := fmt.Sprintf("%s: turns 2..%d, %d requests: TTFT p50 %s p95 %s; %d of %d prompt tokens cached (%.1f %%)",
			routing, prefixTurns, len(ttft), p50[i].Round(time.Millisecond), p95.Round(time.Millisecond), cached, prompt, share*100)
		if routes > 0 {
			b.ReportMetric(100*float64(hits)/float64(routes), routing+"-hit-%")
			line += fmt.Sprintf("; prefix routes: %d hits of %d", hits, routes)
		}
		b.Log(line)
	}
	b.ReportMetric(float64(p50[1])/float64(p50[0]), "prefix/least-loaded-p50")
	b.Logf("TTFT p50 prefix / least-loaded = %.3f (bar: ≤ 0.3); machine: %s; load %s", float64(p50[1])/float64(p50[0]),
		machineLine(), benchmark.LoadAverage())
}

// runPrefixWorkload starts a queen with --routing routing and a hive
// with prefixWorkers workers, and runs the conversations: prefixClients
// clients take the conversations in turns (conversation c's turn t after
// its turn t-1 answered), each request streamed with its usage.
func runPrefixWorkload(b *testing.B, routing string) []turnSample {
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

	type message struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
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
	if f := os.Getenv("APIARY_BENCH_ROUTES"); f != "" {
		// Every request's figures and route, and the queen's log, to a file.
		var out strings.Builder
		for _, s := range samples {
			fmt.Fprintf(&out, "%s turn %d: prompt %d cached %d ttft %s route %q\n", routing, s.turn+1, s.prompt, s.cached, s.ttft.Round(time.Millisecond), s.route)
		}
		out.WriteString(q.logs.String())
		if err := os.WriteFile(f+"."+routing, []byte(out.String()), 0o644); err != nil {
			b.Error(err)
		}
	}
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
			s.prompt, s.cached = ch.Usage.PromptTokens, ch.Usage.PromptTokensDetails.CachedTokens
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
