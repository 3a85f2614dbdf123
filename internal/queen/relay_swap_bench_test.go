//go:build llamaswap && !race

package queen

// The queen's relay beside llama-swap's, in front of the same worker:
//
//	APIARY_LLAMA_SWAP=$(scripts/build-llama-swap.sh) \
//	  go test -tags llamaswap -run '^$' -bench RelayVsLlamaSwap -benchtime 1x ./internal/queen/

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/testbin"
)

// llamaSwapEnv names the llama-swap binary the benchmark runs.
const llamaSwapEnv = "APIARY_LLAMA_SWAP"

// startLlamaSwap runs llama-swap with one model, "tiny", whose upstream is
// the worker at workerURI; its cmd is a process that only sleeps (the
// worker is the queen's, already running), and llama-swap checks the
// worker's /health (which needs no token) before it relays. It returns
// llama-swap's base URL once llama-swap answers, and its pid.
func startLlamaSwap(b *testing.B, bin, workerURI string) (string, int) {
	b.Helper()
	// concurrencyLimit: llama-swap's default, 10 requests at once a model,
	// answers the rest 429. performance: its CPU and GPU sampling is not on
	// the relay path and would only add noise. The rest is its default.
	return runLlamaSwap(b, bin, fmt.Sprintf(`healthCheckTimeout: 15
logLevel: warn
performance:
  disabled: true
models:
  tiny:
    cmd: sleep 86400
    proxy: %s
    checkEndpoint: /health
    concurrencyLimit: 512
`, strings.TrimSuffix(workerURI, "/")))
}

// llamaSwapBin is the llama-swap binary named by APIARY_LLAMA_SWAP; the
// benchmark fails, saying how to build one, when there is none.
func llamaSwapBin(b *testing.B) string {
	b.Helper()
	bin := os.Getenv(llamaSwapEnv)
	if bin == "" {
		b.Fatalf("%s is not set: build llama-swap with scripts/build-llama-swap.sh (it prints the binary's path) and set %s to it",
			llamaSwapEnv, llamaSwapEnv)
	}
	if _, err := exec.LookPath(bin); err != nil {
		b.Fatalf("%s=%s: %v", llamaSwapEnv, bin, err)
	}
	return bin
}

// runLlamaSwap runs llama-swap with the configuration config on a free
// loopback port, in its own process group (so that the processes it
// starts go with it), until the benchmark ends. It returns llama-swap's
// base URL once llama-swap answers /health, and its pid; its log is
// llama-swap.log in a temporary directory, shown when it does not answer.
func runLlamaSwap(b *testing.B, bin, config string) (string, int) {
	b.Helper()
	dir := b.TempDir()
	cfg := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfg, []byte(config), 0o644); err != nil {
		b.Fatal(err)
	}
	addr := testbin.FreeAddr(b)
	logf, err := os.Create(filepath.Join(dir, "llama-swap.log"))
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(bin, "-config", cfg, "-listen", addr)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		b.Fatalf("%s=%s: %v", llamaSwapEnv, bin, err)
	}
	b.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
		_ = logf.Close()
	})
	base := "http://" + addr
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		resp, err := http.Get(base + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return base, cmd.Process.Pid
			}
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(logf.Name())
			b.Fatalf("llama-swap did not answer %s/health within 10s (%v); its log:\n%s", base, err, log)
		}
	}
}

// spread is the median of per-round figures and their range and
// interquartile range.
type spread struct{ med, min, max, q1, q3 time.Duration }

func spreadOf(d []time.Duration) spread {
	s := slices.Clone(d)
	slices.Sort(s)
	at := func(p float64) time.Duration { return s[int(p*float64(len(s)-1)+0.5)] }
	return spread{med: at(.5), min: s[0], max: s[len(s)-1], q1: at(.25), q3: at(.75)}
}

func (s spread) String() string {
	ms := func(d time.Duration) string { return fmt.Sprintf("%+.2f", float64(d.Microseconds())/1000) }
	return fmt.Sprintf("%s ms (IQR %s…%s, range %s…%s)", ms(s.med), ms(s.q1), ms(s.q3), ms(s.min), ms(s.max))
}

// BenchmarkRelayVsLlamaSwap: one worker with 64 slots, and in front of it
// the queen and llama-swap (APIARY_LLAMA_SWAP, see
// scripts/build-llama-swap.sh). At 1, 8, 16 and 64 concurrent streams of
// 64 tokens, each round runs the same waves of streams straight to the
// worker, through the queen and through llama-swap, in an order that
// rotates from round to round. A side's figure in a round is the p50 of
// its streams' TTFT (and of its inter-token gaps); the added p50 of a
// proxy in a round is its p50 minus the direct p50 of the same round.
// Reported per concurrency: the median over rounds of each, with the
// interquartile range and the range, so that the machine's drift during
// the run falls on all three sides alike; and the CPU time each proxy
// process ran during its own waves, per stream relayed.
func BenchmarkRelayVsLlamaSwap(b *testing.B) {
	bin := llamaSwapBin(b)
	qURL, qPID, direct, token := relayCluster(b)
	ctx := context.Background()
	swap, swapPID := startLlamaSwap(b, bin, direct)

	// llama-swap passes the client's Authorization header on to the
	// worker: the client sends the worker's own token, as straight to it.
	// pid: the proxy, whose CPU time the side's streams cost; 0: none.
	type side struct {
		name, base, token string
		pid               int
	}
	sides := []side{{"direct", direct, token, 0}, {"queen", qURL, "", qPID}, {"llama-swap", swap, token, swapPID}}
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256, DisableCompression: true}}
	defer hc.CloseIdleConnections()
	const body = `{"model":"tiny","prompt":"Once upon a time","max_tokens":64,"temperature":0,"ignore_eos":true,"stream":true}`
	// Warm every path (connections, llama-swap's start of its model, the
	// worker's first batch).
	for range 3 {
		for _, s := range sides {
			roundAs(ctx, b, hc, s.base, s.token, body, 8, &sample{})
		}
	}
	b.ResetTimer()
	for b.Loop() {
		var report []string
		for _, c := range []struct{ streams, waves, rounds int }{{1, 12, 30}, {8, 3, 30}, {16, 2, 24}, {64, 1, 15}} {
			ttft := make([][]time.Duration, len(sides)) // per side, per round: p50
			itl := make([][]time.Duration, len(sides))
			added := make([][]time.Duration, len(sides))
			cpu := make([]time.Duration, len(sides)) // the proxy's, during its side's waves
			for r := range c.rounds {
				p50 := make([]time.Duration, len(sides))
				for k := range sides {
					i := (r + k) % len(sides)
					var s sample
					var before time.Duration
					if sides[i].pid != 0 {
						before = cpuTime(b, sides[i].pid)
					}
					for range c.waves {
						roundAs(ctx, b, hc, sides[i].base, sides[i].token, body, c.streams, &s)
					}
					if sides[i].pid != 0 {
						cpu[i] += cpuTime(b, sides[i].pid) - before
					}
					p50[i] = pct(s.ttft, .5)
					ttft[i] = append(ttft[i], p50[i])
					itl[i] = append(itl[i], pct(s.itl, .5))
				}
				for i := range sides {
					added[i] = append(added[i], p50[i]-p50[0])
				}
			}
			line := fmt.Sprintf("%2d streams, %d rounds of %d TTFT samples a side: direct TTFT p50 %v, ITL p50 %v",
				c.streams, c.rounds, c.streams*c.waves, spreadOf(ttft[0]).med.Round(time.Microsecond), spreadOf(itl[0]).med.Round(time.Microsecond))
			for i := 1; i < len(sides); i++ {
				a := spreadOf(added[i])
				perStream := cpu[i] / time.Duration(c.rounds*c.waves*c.streams)
				line += fmt.Sprintf("\n    %-10s TTFT p50 %v, added %v; ITL p50 %v; CPU %v a stream", sides[i].name,
					spreadOf(ttft[i]).med.Round(time.Microsecond), a, spreadOf(itl[i]).med.Round(time.Microsecond), perStream.Round(time.Microsecond))
				b.ReportMetric(float64(a.med.Microseconds()), fmt.Sprintf("%s-added-ttft-p50-µs/%d", sides[i].name, c.streams))
				b.ReportMetric(float64(perStream.Microseconds()), fmt.Sprintf("%s-cpu-µs-per-stream/%d", sides[i].name, c.streams))
			}
			report = append(report, line)
		}
		b.Log("\n" + strings.Join(report, "\n"))
	}
}
