//go:build llamaserver

package benchmark

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/gguf"
)

// BenchmarkLlamaServer runs the side-by-side comparison once (whatever
// b.N) and, with BENCH_B=apiary, writes its section of BENCH_DOCS. Run it
// through scripts/bench-llama-server.sh, which builds llama-server and the
// model and sets the environment:
//
//	BENCH_LLAMA_SERVER  llama-server binary (required)
//	BENCH_MODEL         GGUF both servers load (required)
//	BENCH_B             apiary (default): A is llama-server, B the apiary
//	                    worker; llama-server: B is a second llama-server, to
//	                    test the harness (ratios should be ~1)
//	APIARY_BIN          apiary binary (required for BENCH_B=apiary)
//	BENCH_SESSIONS      times both servers are started afresh (4)
//	BENCH_ROUNDS        A/B rounds a session (3)
//	BENCH_THREADS, BENCH_CTX, BENCH_GEN_TOKENS, BENCH_PROMPT_TOKENS
//	BENCH_STREAMS       streams at once for aggregate throughput (16; 0 skips)
//	BENCH_STREAM_ROUNDS its rounds (5)
//	BENCH_MAX_FOREIGN   CPUs others may use during a request before its round
//	                    is run again (0.25; negative: no check)
//	BENCH_DOCS          markdown file to update (BENCH_B=apiary only)
//	BENCH_LLAMA_BUILD_INFO, BENCH_LLAMA_BENCH_MD, BENCH_LOG_DIR
func BenchmarkLlamaServer(b *testing.B) {
	env := func(name string) string { return os.Getenv(name) }
	num := func(name string, def int) int {
		v := env(name)
		if v == "" {
			return def
		}
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			b.Fatalf("%s=%q: want a positive integer", name, v)
		}
		return n
	}
	lsBin, model, mode := env("BENCH_LLAMA_SERVER"), env("BENCH_MODEL"), env("BENCH_B")
	if mode == "" {
		mode = "apiary"
	}
	if lsBin == "" || model == "" {
		b.Fatal("BENCH_LLAMA_SERVER and BENCH_MODEL are not set: run scripts/bench-llama-server.sh, " +
			"which builds llama-server (cached in ~/.cache/apiary/llama-server) and the model")
	}
	if _, err := os.Stat(lsBin); err != nil {
		b.Fatalf("llama-server is not built (%v): run `scripts/bench-llama-server.sh build`", err)
	}
	if mode != "apiary" && mode != "llama-server" {
		b.Fatalf("BENCH_B=%q: want apiary or llama-server", mode)
	}
	apiaryBin := env("APIARY_BIN")
	if mode == "apiary" && apiaryBin == "" {
		b.Fatal("APIARY_BIN is not set: `make build`, then point it at bin/apiary")
	}
	threads, ctxSize := num("BENCH_THREADS", 2), num("BENCH_CTX", 512)
	sessions := num("BENCH_SESSIONS", 4)
	cfg := Config{
		Rounds:       num("BENCH_ROUNDS", 3),
		GenTokens:    num("BENCH_GEN_TOKENS", 256),
		PromptTokens: num("BENCH_PROMPT_TOKENS", 500),
		// Progress goes to stderr at once: a benchmark's own log is
		// printed only when it ends, minutes later.
		Logf: func(format string, args ...any) {
			fmt.Fprintf(os.Stderr, "%s bench: %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
		},
		Client:    &http.Client{Timeout: 10 * time.Minute, Transport: &http.Transport{DisableKeepAlives: true}},
		QuietWait: 3 * time.Minute,
	}
	if v := env("BENCH_MAX_FOREIGN"); v != "" {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			b.Fatalf("BENCH_MAX_FOREIGN=%q: want a number of CPUs (negative: no check)", v)
		}
		cfg.MaxForeign = f
	}
	if cfg.PromptTokens+1 > ctxSize || cfg.GenTokens+16 > ctxSize {
		b.Fatalf("BENCH_PROMPT_TOKENS %d + 1 and BENCH_GEN_TOKENS %d + a short prompt must fit BENCH_CTX %d",
			cfg.PromptTokens, cfg.GenTokens, ctxSize)
	}
	f, err := gguf.Open(model)
	if err != nil {
		b.Fatalf("model: %v", err)
	}
	logDir := env("BENCH_LOG_DIR")
	if logDir == "" {
		logDir = b.TempDir()
	}
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		b.Fatal(err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel) // after the servers' Close, which cleanups run first

	llamaServerArgs := func(port int) []string {
		return []string{"-m", model, "-t", strconv.Itoa(threads), "-c", strconv.Itoa(ctxSize),
			"--host", "127.0.0.1", "--port", strconv.Itoa(port), "-np", "1"}
	}
	apiaryArgs := func(port int) []string {
		return []string{"worker", "--worker-id", "bench", "--model", model, "--gpu-device", "-1",
			"--host", "127.0.0.1", "--port", strconv.Itoa(port), "--threads", strconv.Itoa(threads),
			"--ctx-size", strconv.Itoa(ctxSize), "--slots", "1"}
	}
	// start starts a server; the caller closes it, a cleanup too if the
	// benchmark fails first.
	start := func(name, bin string, args func(port int) []string) (*Server, string) {
		port, err := FreePort()
		if err != nil {
			b.Fatal(err)
		}
		logPath := filepath.Join(logDir, name+".log")
		log, err := os.Create(logPath)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { log.Close() })
		a := args(port)
		s, err := StartServer(ctx, ServerConfig{Name: name, Path: bin, Args: a, Port: port, Log: log})
		if err != nil {
			b.Fatalf("%v (log: %s)", err, logPath)
		}
		b.Cleanup(func() { s.Close() })
		return s, filepath.Base(bin) + " " + strings.Join(a, " ")
	}

	lsVersion := strings.Join(strings.Fields(firstLines(commandOutput(lsBin, "--version"), 2)), " ")
	nameB, binB, argsB, extraB, versionB := "apiary", apiaryBin, apiaryArgs, map[string]any(nil), ""
	if mode == "apiary" {
		// The worker links llama.cpp of the same source and commit as
		// the llama-server it is compared with, and loads the same CPU
		// backend; `apiary version` says which.
		versionB = fmt.Sprintf("apiary %s (%s), %s",
			strings.TrimSpace(firstLines(commandOutput(apiaryBin, "version"), 1)), sourceOf(apiaryBin),
			strings.Join(strings.Split(strings.TrimSpace(commandOutput(apiaryBin, "version")), "\n")[1:], ", "))
	} else {
		nameB, binB, argsB, extraB, versionB = "llama-server-2", lsBin, llamaServerArgs, map[string]any{"cache_prompt": false}, lsVersion
	}
	sideA := SideInfo{Name: "llama-server", Version: lsVersion}
	sideB := SideInfo{Name: nameB, Version: versionB}

	loadBefore := LoadAverage()
	var res Result
	b.ResetTimer()
	for session := range sessions {
		a, aCmd := start(fmt.Sprintf("llama-server.%d", session+1), lsBin, llamaServerArgs)
		bs, bCmd := start(fmt.Sprintf("%s.%d", nameB, session+1), binB, argsB)
		sideA.Command, sideB.Command = aCmd, bCmd
		cfg.Logf("session %d/%d: %s at %s, %s at %s (logs in %s)", session+1, sessions, sideA.Name, a.URL, sideB.Name, bs.URL, logDir)
		cfg.FirstRound = session * cfg.Rounds
		cfg.Tokenizer = LlamaServerTokenizer(cfg.Client, a.URL)
		r, err := Compare(ctx, cfg,
			Side{Name: sideA.Name, URL: a.URL, PID: a.PID(), Extra: map[string]any{"cache_prompt": false}},
			Side{Name: sideB.Name, URL: bs.URL, PID: bs.PID(), Extra: extraB})
		if err != nil {
			b.Fatal(err)
		}
		res.Merge(r)
		sideA.PeakRSS, sideB.PeakRSS = max(sideA.PeakRSS, a.PeakRSS()), max(sideB.PeakRSS, bs.PeakRSS())
		for _, s := range []*Server{a, bs} {
			if err := s.Close(); err != nil {
				b.Errorf("%v (log in %s)", err, logDir)
			}
		}
	}

	// Aggregate throughput: both servers again, with BENCH_STREAMS slots,
	// that many generation streams at once, alternating round by round.
	var agg Paired
	aggSame, streams, aggRounds := 0, num("BENCH_STREAMS", 16), num("BENCH_STREAM_ROUNDS", 5)
	if streams > 0 {
		slotArgs := func(args func(int) []string, flag string) func(int) []string {
			return func(port int) []string {
				a := args(port)
				for i := range a {
					switch {
					case a[i] == "-c" || a[i] == "--ctx-size":
						a[i+1] = strconv.Itoa(ctxSize * streams)
					case a[i] == flag:
						a[i+1] = strconv.Itoa(streams)
					}
				}
				return a
			}
		}
		slotsB := "-np"
		if mode == "apiary" {
			slotsB = "--slots"
		}
		a, _ := start("llama-server.streams", lsBin, slotArgs(llamaServerArgs, "-np"))
		bs, _ := start(nameB+".streams", binB, slotArgs(argsB, slotsB))
		c := cfg
		c.Rounds, c.FirstRound = aggRounds, 0
		var err error
		agg, aggSame, err = Concurrent(ctx, c, streams,
			Side{Name: sideA.Name, URL: a.URL, Extra: map[string]any{"cache_prompt": false}},
			Side{Name: sideB.Name, URL: bs.URL, Extra: extraB})
		if err != nil {
			b.Fatal(err)
		}
		for _, s := range []*Server{a, bs} {
			if err := s.Close(); err != nil {
				b.Errorf("%v (log in %s)", err, logDir)
			}
		}
	}
	b.StopTimer()

	buildInfo, _ := os.ReadFile(env("BENCH_LLAMA_BUILD_INFO"))
	llamaBench, _ := os.ReadFile(env("BENCH_LLAMA_BENCH_MD"))
	st, _ := os.Stat(model)
	ri := ReportInfo{
		Date:       time.Now(),
		Machine:    ThisMachine(),
		LoadBefore: loadBefore,
		LoadAfter:  LoadAverage(),
		A:          sideA,
		B:          sideB,
		Model:      ModelInfo{Path: model, Size: st.Size(), Info: f.Info()},
		Sessions:   sessions,
		Threads:    threads,
		CtxSize:    ctxSize,
		BuildInfo:  string(buildInfo),
		LlamaBench: string(llamaBench),
		Reproduce: fmt.Sprintf("make build\nBENCH_SESSIONS=%d BENCH_ROUNDS=%d BENCH_THREADS=%d BENCH_CTX=%d BENCH_GEN_TOKENS=%d BENCH_PROMPT_TOKENS=%d \\\n  scripts/bench-llama-server.sh   # build llama.cpp (cached), make the model, llama-bench, run",
			sessions, cfg.Rounds, threads, ctxSize, cfg.GenTokens, cfg.PromptTokens),
	}
	md := Markdown(ri, res)
	if streams > 0 {
		as := agg.Summary()
		md = strings.Replace(md, "<!-- llama-server:end -->", fmt.Sprintf(
			"Aggregate throughput, %d generation streams at once (%d slots each, context %d a slot), %d rounds alternating: "+
				"%s %.1f tok/s, %s %.1f tok/s (medians), ratio %.3f (min %.3f, max %.3f); the same text in every stream in %d of %d rounds.\n\n<!-- llama-server:end -->",
			streams, streams, ctxSize, as.Rounds, sideA.Name, as.MedianA, sideB.Name, as.MedianB, as.Ratio, as.RatioMin, as.RatioMax, aggSame, aggRounds), 1)
		b.ReportMetric(as.Ratio, "agg_B/A")
	}
	b.Log("\n" + md)
	gen, pp := res.Generation.Summary(), res.Prompt.Summary()
	b.ReportMetric(gen.MedianA, "gen_A_tok/s")
	b.ReportMetric(gen.MedianB, "gen_B_tok/s")
	b.ReportMetric(gen.Ratio, "gen_B/A")
	b.ReportMetric(pp.MedianA, "pp_A_tok/s")
	b.ReportMetric(pp.MedianB, "pp_B_tok/s")
	b.ReportMetric(pp.Ratio, "pp_B/A")
	b.ReportMetric(0, "ns/op")

	if docs := env("BENCH_DOCS"); docs != "" && mode == "apiary" {
		if err := UpdateFile(docs, md); err != nil {
			b.Fatal(err)
		}
		b.Logf("wrote %s", docs)
	}
}

// commandOutput runs a command and returns its combined output, or the
// error's text.
func commandOutput(name string, args ...string) string {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Sprintf("(%s: %v)", name, err)
	}
	return string(out)
}

func firstLines(s string, n int) string {
	lines := strings.SplitN(strings.TrimSpace(s), "\n", n+1)
	return strings.Join(lines[:min(n, len(lines))], "\n")
}

// sourceOf says what tree bin was built from: the repository's commit if bin
// lies in this repository (bin/apiary), else its path and time.
func sourceOf(bin string) string {
	root, err := filepath.Abs("../..")
	abs, err2 := filepath.Abs(bin)
	if err == nil && err2 == nil && strings.HasPrefix(abs, root+string(filepath.Separator)) {
		return "git " + strings.TrimSpace(commandOutput("git", "describe", "--always", "--dirty"))
	}
	if st, err := os.Stat(bin); err == nil {
		return fmt.Sprintf("%s, built %s", bin, st.ModTime().UTC().Format("2006-01-02 15:04 MST"))
	}
	return bin
}
