//go:build llamaswap && !race

package queen

// The first request after a model switch, apiary beside llama-swap on the
// same machine, both in front of the same llama-server and the same two
// models, only one of which may be loaded at a time (issue #30):
//
//	APIARY_LLAMA_SWAP=$(scripts/build-llama-swap.sh) APIARY_BIN=$PWD/bin/apiary \
//	  go test -tags llamaswap -run '^$' -bench SwapVsLlamaSwap -benchtime 1x -v ./internal/queen/

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/hive"
	"github.com/apiary-llm/apiary/internal/modelstore"
	"github.com/apiary-llm/apiary/internal/testbin"
	"github.com/apiary-llm/apiary/internal/testmodel"
)

// swapModelsEnv names two GGUF files, comma-separated, that the benchmark
// swaps between instead of its two generated models.
const swapModelsEnv = "APIARY_BENCH_SWAP_MODELS"

// swapRoundsEnv is the number of rounds counted (default swapRounds).
const swapRoundsEnv = "APIARY_BENCH_SWAP_ROUNDS"

const (
	// swapRounds: each round asks both sides for the model the previous
	// round did not ask for, so every request counted is the first after
	// a switch; half the rounds ask for each model (-benchtime Nx runs
	// N times as many).
	swapRounds = 20
	// swapCtx is the context size llama-server gets on both sides.
	swapCtx = 1024
	// swapGap is the pause before each request, so that what one side
	// still does after its answer (a stopped process's exit, log and row
	// writes) is not counted against the other.
	swapGap = 300 * time.Millisecond
)

// swapNames are the two models' names, on both sides.
var swapNames = [2]string{"a", "b"}

// swapShape is the generated models' shape (two seeds): 4 layers of 384,
// 8.6 M parameters, 33 MiB each as f32; llama-server of this machine
// starts on one in about 70 ms.
var swapShape = testmodel.Options{Dim: 384, Heads: 4, Layers: 4, FF: 1024, Vocab: 2000}

// BenchmarkSwapVsLlamaSwap: apiary (a queen and one hive whose CPU offers
// room for one of two models, --cpu-memory, with llama-server as the
// engine of both) and llama-swap (the same llama-server command line, the
// same two GGUF files, its default swapping: one model at a time) run
// side by side. Each round asks both, one after the other, for the model
// the previous round did not ask for: a streamed chat completion of a
// few tokens whose time to first token includes the switch (stop the
// loaded llama-server, start the other, know it is ready, relay). Which
// side goes first changes in the pattern apiary, llama-swap, llama-swap,
// apiary, so that each side goes first equally often for each model.
// Reported: each side's median TTFT with its interquartile range, the
// ratio of the medians apiary/llama-swap (issue #30's bar: at most 0.5)
// and the median of the rounds' own ratios; and where apiary's time
// went, from the queen's and the hive's logs. Every request must answer
// 200, every apiary request must evict the other model's worker, and
// after every llama-swap request llama-swap must run the asked model
// alone.
func BenchmarkSwapVsLlamaSwap(b *testing.B) {
	bin := llamaSwapBin(b)
	files := swapModelFiles(b)
	engines := docsEngines(b, map[string]string{"llama": testbin.LlamaServer(b)})
	q, hiveP, qURL := swapCluster(b, engines, files)
	swap, _ := runLlamaSwap(b, bin, llamaSwapModels(b, engines, files))
	rounds := swapRoundCount(b)
	ctx := context.Background()
	hc := &http.Client{Transport: &http.Transport{DisableCompression: true}}
	defer hc.CloseIdleConnections()

	// Warm up: both models once on both sides (the first is a cold start,
	// the second the first switch).
	for _, m := range swapNames {
		for _, base := range []string{qURL, swap} {
			time.Sleep(swapGap)
			if _, err := chatTTFT(ctx, hc, base, m); err != nil {
				b.Fatalf("warm-up: %v", err)
			}
		}
	}
	logs := swapLogs{q: q, hive: hiveP}
	logs.skip(b, swapNames[1])

	var res swapResults
	r := 0 // rounds so far: the next asks for swapNames[r%2]
	b.ResetTimer()
	for b.Loop() {
		for range rounds {
			m := swapNames[r%2]
			apiaryFirst := (r^(r>>1))&1 == 0
			var ta, tl time.Duration
			var at time.Time
			for _, first := range []bool{true, false} {
				time.Sleep(swapGap)
				if first == apiaryFirst {
					at = time.Now()
					ta = mustTTFT(b, ctx, hc, qURL, m)
				} else {
					tl = mustTTFT(b, ctx, hc, swap, m)
					checkRunningAlone(b, ctx, hc, swap, m)
				}
			}
			res.add(m, apiaryFirst, ta, tl, logs.phases(b, m, at, ta))
			r++
		}
	}
	b.StopTimer()
	res.report(b)
	if n := q.logs.Count("placement found no pool", nil); n != 0 {
		b.Errorf("%d placements found no pool; every switch must evict", n)
	}
}

// swapResults are the rounds' figures.
type swapResults struct {
	apiary, llamaSwap []time.Duration // TTFT a round
	ratios            []float64       // apiary/llama-swap a round
	phases            []swapPhases    // apiary's a round
	lines             []string        // a round
}

// add records one round: the model asked for, which side went first,
// each side's TTFT and apiary's phases.
func (s *swapResults) add(model string, apiaryFirst bool, apiary, llamaSwap time.Duration, ph swapPhases) {
	s.apiary, s.llamaSwap, s.phases = append(s.apiary, apiary), append(s.llamaSwap, llamaSwap), append(s.phases, ph)
	s.ratios = append(s.ratios, float64(apiary)/float64(llamaSwap))
	first := "llama-swap"
	if apiaryFirst {
		first = "apiary"
	}
	s.lines = append(s.lines, fmt.Sprintf("%3d  %s  %-10s  %8s  %8s  %5.2f   %s",
		len(s.lines)+1, model, first, fmtMS(apiary), fmtMS(llamaSwap), s.ratios[len(s.ratios)-1], ph))
}

// report logs every round and the summary, and reports the medians, the
// interquartile ranges and the ratios as the benchmark's metrics.
func (s *swapResults) report(b *testing.B) {
	sa, sl := spreadOf(s.apiary), spreadOf(s.llamaSwap)
	ratios := slices.Sorted(slices.Values(s.ratios))
	rq := func(p float64) float64 { return ratios[int(p*float64(len(ratios)-1)+0.5)] }
	ratio := float64(sa.med) / float64(sl.med)
	b.Logf("\nround model first  apiary ms  llama-swap ms  ratio   apiary: %s\n%s\n"+
		"apiary TTFT     median %s ms (IQR %s…%s, range %s…%s)\n"+
		"llama-swap TTFT median %s ms (IQR %s…%s, range %s…%s)\n"+
		"ratio of the medians apiary/llama-swap %.3f (goal ≤ 0.5); median of the rounds' ratios %.3f (IQR %.3f…%.3f)\n"+
		"apiary's phases, medians: %s\n"+
		"every request answered 200: %d a side, the %d of the warm-up included",
		swapPhaseNames, strings.Join(s.lines, "\n"),
		fmtMS(sa.med), fmtMS(sa.q1), fmtMS(sa.q3), fmtMS(sa.min), fmtMS(sa.max),
		fmtMS(sl.med), fmtMS(sl.q1), fmtMS(sl.q3), fmtMS(sl.min), fmtMS(sl.max),
		ratio, rq(.5), rq(.25), rq(.75),
		medianPhases(s.phases), len(s.apiary)+len(swapNames), len(swapNames))
	b.ReportMetric(inMS(sa.med), "apiary-ttft-p50-ms")
	b.ReportMetric(inMS(sa.q1), "apiary-ttft-q1-ms")
	b.ReportMetric(inMS(sa.q3), "apiary-ttft-q3-ms")
	b.ReportMetric(inMS(sl.med), "llama-swap-ttft-p50-ms")
	b.ReportMetric(inMS(sl.q1), "llama-swap-ttft-q1-ms")
	b.ReportMetric(inMS(sl.q3), "llama-swap-ttft-q3-ms")
	b.ReportMetric(ratio, "apiary/llama-swap")
	b.ReportMetric(rq(.5), "paired-ratio-p50")
	b.ReportMetric(0, "ns/op")
}

// swapRoundCount is APIARY_BENCH_SWAP_ROUNDS, else swapRounds.
func swapRoundCount(b *testing.B) int {
	s := os.Getenv(swapRoundsEnv)
	if s == "" {
		return swapRounds
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 2 {
		b.Fatalf("%s=%q: want a number of rounds, at least 2", swapRoundsEnv, s)
	}
	return n
}

// swapModelFiles are the two GGUF files: APIARY_BENCH_SWAP_MODELS, else
// two generated models of swapShape with different seeds.
func swapModelFiles(b *testing.B) [2]string {
	b.Helper()
	if s := os.Getenv(swapModelsEnv); s != "" {
		f := strings.Split(s, ",")
		if len(f) != 2 {
			b.Fatalf("%s=%q: want two GGUF files, comma-separated", swapModelsEnv, s)
		}
		var out [2]string
		for i, p := range f {
			abs, err := filepath.Abs(p)
			if err == nil {
				_, err = os.Stat(abs)
			}
			if err != nil {
				b.Fatalf("%s: %v", swapModelsEnv, err)
			}
			out[i] = abs
		}
		return out
	}
	dir := b.TempDir()
	var out [2]string
	for i, name := range swapNames {
		o := swapShape
		o.Seed = int64(i + 1)
		out[i] = filepath.Join(dir, name+".gguf")
		if err := testmodel.WriteFile(out[i], o); err != nil {
			b.Fatal(err)
		}
	}
	return out
}

// swapCapacity is the memory the hive's CPU offers: room for the larger
// model's worker (the hive's own estimate at swapCtx) and half the
// smaller one's, so either fits alone and never both.
func swapCapacity(b *testing.B, files [2]string) uint64 {
	b.Helper()
	var est [2]uint64
	for i, f := range files {
		info, err := modelstore.ReadInfo(f)
		if err != nil {
			b.Fatal(err)
		}
		est[i] = info.EstimateMemory(swapCtx).Total
	}
	return max(est[0], est[1]) + min(est[0], est[1])/2
}

// swapCluster runs a queen whose --config names the two models, each on
// the engine llama, and one hive (pool node-1) with the engines file,
// the two files linked into its models directory and its CPU capped by
// swapCapacity. The hive's heartbeat and health intervals are its
// defaults. The queen gets --min-residency 0 when it has that flag, so
// that no anti-thrash rule holds a model that was just loaded.
func swapCluster(b *testing.B, engines string, files [2]string) (q, hiveP *proc, qURL string) {
	b.Helper()
	dir := b.TempDir()
	var cfg strings.Builder
	cfg.WriteString("models:\n")
	for _, name := range swapNames {
		fmt.Fprintf(&cfg, "  %s:\n    file: %s\n    engine: llama\n", name, name)
	}
	path := filepath.Join(dir, "models.yaml")
	writeConfig(b, path, cfg.String())
	args := []string{"--config", path}
	if queenHasFlag(b, "--min-residency") {
		args = append(args, "--min-residency", "0")
		b.Log("the queen has --min-residency: it runs with --min-residency 0")
	} else {
		b.Log("the queen has no --min-residency: nothing holds a model that was just loaded")
	}
	q, qURL = startQueenProc(b, filepath.Join(dir, "queen"), "", args...)
	hdir := filepath.Join(dir, "hive")
	if err := os.MkdirAll(filepath.Join(hdir, "models"), 0o755); err != nil {
		b.Fatal(err)
	}
	for i, name := range swapNames {
		if err := os.Symlink(files[i], filepath.Join(hdir, "models", name+".gguf")); err != nil {
			b.Fatal(err)
		}
	}
	hiveP = startProc(b, "hive node-1", nil, "hive", "--addr", "127.0.0.1:0", "--queen", qURL, "--pool-id", "node-1",
		"--data-dir", hdir, "--worker-ports", "24000-24999", "--worker-threads", "1", "--worker-ctx-size", strconv.Itoa(swapCtx),
		"--engines", engines, "--cpu-memory", strconv.FormatUint(swapCapacity(b, files), 10))
	b.Cleanup(func() {
		if b.Failed() {
			b.Logf("queen logs:\n%s", q.logs.String())
			b.Logf("hive logs:\n%s", hiveP.logs.String())
		}
		_ = hiveP.stop(b, syscall.SIGTERM)
		_ = q.stop(b, syscall.SIGTERM)
	})
	q.logs.wait(b, 0, "pool status changed", map[string]string{"pool_id": "node-1", "to": "healthy"})
	return q, hiveP, qURL
}

// queenHasFlag says whether `apiary queen --help` lists flag.
func queenHasFlag(b *testing.B, flag string) bool {
	b.Helper()
	out, err := exec.Command(testbin.Path(b), "queen", "--help").CombinedOutput()
	if err != nil {
		b.Fatalf("apiary queen --help: %v\n%s", err, out)
	}
	return strings.Contains(string(out), flag+" ")
}

// llamaSwapModels is llama-swap's configuration for the two models: each
// model's cmd is the engines file's llama command with the hive's values
// for its placeholders (the file, loopback, llama-swap's ${PORT}, swapCtx,
// one slot, one thread, the CPU device), and its env the engine's. The
// rest is llama-swap's default: one model runs at a time, the
// next is started once the running one has stopped, and llama-swap asks
// its checkEndpoint, /health, for readiness.
func llamaSwapModels(b *testing.B, enginesPath string, files [2]string) string {
	b.Helper()
	engines, err := hive.LoadEngines(enginesPath)
	if err != nil {
		b.Fatal(err)
	}
	e := engines["llama"]
	var out strings.Builder
	out.WriteString("healthCheckTimeout: 60\nlogLevel: info\nperformance:\n  disabled: true\nmodels:\n")
	for i, name := range swapNames {
		r := strings.NewReplacer("{model}", files[i], "{model_ref}", name, "{host}", "127.0.0.1", "{port}", "${PORT}",
			"{ctx_size}", strconv.Itoa(swapCtx), "{slots}", "1", "{threads}", "1", "{gpu}", "-1", "{gpu_uuid}", "-1")
		var cmd []string
		for _, a := range e.Command {
			a = r.Replace(a)
			if strings.ContainsAny(a, " \t\n\"'\\") {
				b.Fatalf("engine argument %q would need quoting in llama-swap's cmd", a)
			}
			cmd = append(cmd, a)
		}
		fmt.Fprintf(&out, "  %s:\n    cmd: %s\n    proxy: http://127.0.0.1:${PORT}\n", name, strings.Join(cmd, " "))
		if len(e.Env) > 0 {
			out.WriteString("    env:\n")
			for _, k := range slices.Sorted(maps.Keys(e.Env)) {
				fmt.Fprintf(&out, "      - %q\n", k+"="+r.Replace(e.Env[k]))
			}
		}
	}
	return out.String()
}

// chatTTFT sends a streamed chat completion of a few greedy tokens for
// model to base and returns its time to first token, reading the stream
// to its end.
func chatTTFT(ctx context.Context, hc *http.Client, base, model string) (time.Duration, error) {
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"Say hello to the bees."}],"max_tokens":4,"temperature":0,"stream":true}`, model)
	ttft, _, err := streamTimesAt(ctx, hc, base, "/v1/chat/completions", "", body)
	return ttft, err
}

// mustTTFT is chatTTFT; an error (an answer other than 200 among them)
// ends the benchmark.
func mustTTFT(b *testing.B, ctx context.Context, hc *http.Client, base, model string) time.Duration {
	b.Helper()
	ttft, err := chatTTFT(ctx, hc, base, model)
	if err != nil {
		b.Fatalf("%s for %s: %v", base, model, err)
	}
	return ttft
}

// checkRunningAlone fails the benchmark unless llama-swap's /running
// lists model alone, ready.
func checkRunningAlone(b *testing.B, ctx context.Context, hc *http.Client, base, model string) {
	b.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/running", nil)
	if err != nil {
		b.Fatal(err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	var running struct {
		Running []struct{ Model, State string } `json:"running"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&running); err != nil {
		b.Fatalf("llama-swap /running: %v", err)
	}
	if len(running.Running) != 1 || running.Running[0].Model != model || running.Running[0].State != "ready" {
		b.Fatalf("llama-swap runs %+v after a request for %s; want %s alone", running.Running, model, model)
	}
}

// swapPhaseNames names the columns of swapPhases.String.
const swapPhaseNames = "to evicted, to victim STOPPED, to spawned, to RUNNING, to first token"

// swapPhases is where one apiary switch's time went, each phase from the
// end of the one before: from the request to the queen's "worker
// evicted" (placement found no room, the victim's stop sent), to the
// victim's row STOPPED, to the hive's "worker spawned" of the new worker
// (the memory seen free, placement, the start call), to its row RUNNING
// (llama-server's load, the front's health polling and ready callback),
// to the first token (the relay through the queen and the front, and
// llama-server's first token).
type swapPhases [5]time.Duration

func (p swapPhases) String() string {
	var s []string
	for _, d := range p {
		s = append(s, fmtMS(d))
	}
	return strings.Join(s, " / ")
}

// medianPhases is each phase's median over the rounds.
func medianPhases(ps []swapPhases) swapPhases {
	var out swapPhases
	for i := range out {
		var d []time.Duration
		for _, p := range ps {
			d = append(d, p[i])
		}
		out[i] = spreadOf(d).med
	}
	return out
}

// swapLogs follows the queen's and the hive's logs round by round.
type swapLogs struct {
	q, hive         *proc
	qFrom, hiveFrom int
}

// skip moves past the warm-up's switch to model.
func (l *swapLogs) skip(b *testing.B, model string) {
	b.Helper()
	_, n := l.q.logs.wait(b, l.qFrom, "worker evicted", map[string]string{"for": model})
	_, l.qFrom = l.q.logs.wait(b, n, "worker placed on demand", map[string]string{"model_ref": model})
	_, l.hiveFrom = l.hive.logs.wait(b, l.hiveFrom, "worker spawned", map[string]string{"model_ref": model})
}

// phases finds the switch to model that the request sent at start with
// time to first token ttft caused, and times its phases. It fails the
// benchmark when the request evicted nothing.
func (l *swapLogs) phases(b *testing.B, model string, start time.Time, ttft time.Duration) swapPhases {
	b.Helper()
	ev, n := l.q.logs.wait(b, l.qFrom, "worker evicted", map[string]string{"for": model})
	stopped, _ := l.q.logs.wait(b, l.qFrom, "lifecycle row changed", map[string]string{"lifecycle_id": ev.Attrs["lifecycle_id"], "to": "STOPPED"})
	placed, n := l.q.logs.wait(b, n, "worker placed on demand", map[string]string{"model_ref": model})
	running, m := l.q.logs.wait(b, l.qFrom, "lifecycle row changed", map[string]string{"lifecycle_id": placed.Attrs["lifecycle_id"], "to": "RUNNING"})
	spawned, h := l.hive.logs.wait(b, l.hiveFrom, "worker spawned", map[string]string{"model_ref": model})
	l.qFrom, l.hiveFrom = max(n, m), h
	marks := []time.Time{start, recordTime(b, ev), recordTime(b, stopped), recordTime(b, spawned), recordTime(b, running), start.Add(ttft)}
	var p swapPhases
	for i := range p {
		p[i] = marks[i+1].Sub(marks[i])
	}
	return p
}

// fmtMS is d in milliseconds, two decimals.
func fmtMS(d time.Duration) string { return strconv.FormatFloat(inMS(d), 'f', 2, 64) }

// inMS is d in milliseconds.
func inMS(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
