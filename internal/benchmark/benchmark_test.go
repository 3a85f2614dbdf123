package benchmark

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// fakeServerEnv makes the test binary a fake server (see runFakeServer):
// StartServer's tests re-exec it.
const fakeServerEnv = "BENCHMARK_FAKE_SERVER_PORT"

func TestMain(m *testing.M) {
	if port := os.Getenv(fakeServerEnv); port != "" {
		runFakeServer(port)
		return
	}
	goleak.VerifyTestMain(m)
}

// fake is an OpenAI-ish completion server: one "x" a token, usage in the
// last chunk, and a /tokenize that counts one token a character.
type fake struct {
	name   string
	health string // the /health "status"

	mu    sync.Mutex
	calls []string // guarded by mu: name + prompt of each completion
}

func (f *fake) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {
		json.NewEncoder(w).Encode(map[string]string{"status": f.health})
	})
	mux.HandleFunc("POST /tokenize", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Content string `json:"content"`
		}
		json.NewDecoder(r.Body).Decode(&req)
		toks := make([]int, len(req.Content))
		json.NewEncoder(w).Encode(map[string]any{"tokens": toks})
	})
	mux.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Prompt    string `json:"prompt"`
			MaxTokens int    `json:"max_tokens"`
			IgnoreEOS bool   `json:"ignore_eos"`
			Stream    bool   `json:"stream"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || !req.Stream || !req.IgnoreEOS {
			http.Error(w, "want a streamed ignore_eos request", http.StatusBadRequest)
			return
		}
		f.mu.Lock()
		f.calls = append(f.calls, f.name+":"+req.Prompt)
		f.mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		send := func(v any) {
			b, _ := json.Marshal(v)
			fmt.Fprintf(w, "data: %s\n\n", b)
			w.(http.Flusher).Flush()
		}
		for i := range req.MaxTokens {
			c := map[string]any{"text": "x"}
			if i == req.MaxTokens-1 {
				c["finish_reason"] = "length"
			}
			send(map[string]any{"choices": []any{c}})
		}
		send(map[string]any{"choices": []any{},
			"usage":   map[string]int{"prompt_tokens": len(req.Prompt) + 1, "completion_tokens": req.MaxTokens},
			"timings": map[string]any{"prompt_n": len(req.Prompt) + 1, "prompt_ms": 10.0, "predicted_n": req.MaxTokens, "predicted_ms": 20.0}})
		fmt.Fprint(w, "data: [DONE]\n\n")
	})
	return mux
}

func (f *fake) log() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.calls...)
}

func startFake(t *testing.T, name string) (*fake, *httptest.Server) {
	t.Helper()
	f := &fake{name: name, health: "ok"}
	srv := httptest.NewServer(f.handler())
	t.Cleanup(srv.Close)
	return f, srv
}

// runFakeServer serves the fake on port until SIGTERM, then exits 0.
func runFakeServer(port string) {
	f := &fake{name: "child", health: "ready"}
	l, err := net.Listen("tcp", "127.0.0.1:"+port)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(3)
	}
	srv := &http.Server{Handler: f.handler()}
	go srv.Serve(l)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	<-ctx.Done()
	srv.Close()
	os.Exit(0)
}

func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		in   []float64
		want float64
	}{
		{nil, 0},
		{[]float64{3}, 3},
		{[]float64{3, 1, 2}, 2},
		{[]float64{4, 1, 3, 2}, 2.5},
	} {
		if got := Median(tc.in); got != tc.want {
			t.Errorf("Median(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

func TestPairedSummaryIsTheMedianOfPerRoundRatios(t *testing.T) {
	var p Paired
	p.Add(100, 80)  // 0.8
	p.Add(200, 190) // 0.95
	p.Add(100, 90)  // 0.9
	s := p.Summary()
	want := Summary{MedianA: 100, MedianB: 90, Ratio: 0.9, RatioMin: 0.8, RatioMax: 0.95, Rounds: 3}
	if s != want {
		t.Errorf("Summary() = %+v, want %+v", s, want)
	}
}

func TestReplaceSection(t *testing.T) {
	sec := SectionBegin + "\nnew\n" + SectionEnd + "\n"
	for _, tc := range []struct{ name, doc, want string }{
		{"empty doc gets a title", "", "# Benchmarks\n\n" + sec},
		{"appended after other sections", "# B\n\nother\n", "# B\n\nother\n\n" + sec},
		{"replaced in place, others kept",
			"# B\n\n" + SectionBegin + "\nold\n" + SectionEnd + "\n\n## later\n",
			"# B\n\n" + sec + "\n## later\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ReplaceSection(tc.doc, sec); got != tc.want {
				t.Errorf("ReplaceSection:\n%q\nwant\n%q", got, tc.want)
			}
		})
	}
}

func TestUpdateFileCreatesTheFileAndDirectory(t *testing.T) {
	path := filepath.Join(t.TempDir(), "docs", "benchmarks.md")
	sec := SectionBegin + "\n1\n" + SectionEnd
	if err := UpdateFile(path, sec); err != nil {
		t.Fatal(err)
	}
	if err := UpdateFile(path, strings.Replace(sec, "1", "2", 1)); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	if got := string(b); strings.Contains(got, "\n1\n") || strings.Count(got, SectionBegin) != 1 || !strings.Contains(got, "\n2\n") {
		t.Errorf("file after two updates:\n%s", got)
	}
}

func TestCompleteMeasuresTheStream(t *testing.T) {
	_, srv := startFake(t, "a")
	s, err := Complete(t.Context(), srv.Client(), srv.URL, Request{Prompt: "hello", MaxTokens: 5})
	if err != nil {
		t.Fatal(err)
	}
	if s.PromptTokens != 6 || s.CompletionTokens != 5 || s.Text != "xxxxx" || s.Chunks != 5 {
		t.Errorf("sample = %+v, want 6 prompt tokens, 5 completion tokens, text xxxxx in 5 chunks", s)
	}
	if s.FirstChunk <= 0 || s.Decode <= 0 || s.Total < s.FirstChunk+s.Decode {
		t.Errorf("times: first %v, decode %v, total %v", s.FirstChunk, s.Decode, s.Total)
	}
	if s.Server == nil || s.Server.PredictedPerSecond() != 250 || s.Server.PromptPerSecond() != 600 {
		t.Errorf("server timings = %+v, want 250 tok/s generation, 600 tok/s prompt", s.Server)
	}
}

func TestCompleteFailsOnAnErrorStatus(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, `{"error":{"message":"no"}}`, http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	_, err := Complete(t.Context(), srv.Client(), srv.URL, Request{Prompt: "p", MaxTokens: 2})
	if err == nil || !strings.Contains(err.Error(), "503") {
		t.Errorf("err = %v, want one naming the 503", err)
	}
}

func TestCompleteFailsWithoutUsage(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, "data: {\"choices\":[{\"text\":\"x\",\"finish_reason\":\"length\"}]}\n\ndata: [DONE]\n\n")
	}))
	defer srv.Close()
	_, err := Complete(t.Context(), srv.Client(), srv.URL, Request{Prompt: "p", MaxTokens: 1})
	if !errors.Is(err, ErrStream) {
		t.Errorf("err = %v, want ErrStream", err)
	}
}

func TestPromptOfTokensHitsTheCount(t *testing.T) {
	chars := func(_ context.Context, s string) (int, error) { return len(s), nil }
	for _, n := range []int{1, 7, 100, 511} {
		p, got, err := PromptOfTokens(t.Context(), chars, 42, n)
		if err != nil {
			t.Fatal(err)
		}
		// Trailing spaces are trimmed, so a count may fall one short.
		if got != len(p) || got > n || got < n-1 {
			t.Errorf("PromptOfTokens(%d) = %d tokens (%q)", n, got, p)
		}
	}
}

func TestWordsDifferAcrossSeeds(t *testing.T) {
	a, b := Words(1, 5), Words(2, 5)
	if a == b || a[:2] == b[:2] && strings.Fields(a)[0] == strings.Fields(b)[0] {
		t.Errorf("Words(1) = %q and Words(2) = %q share their first word", a, b)
	}
	if Words(1, 5) != a {
		t.Error("Words is not deterministic")
	}
}

func TestCompareAlternatesAndPairs(t *testing.T) {
	fa, sa := startFake(t, "A")
	fb, sb := startFake(t, "B")
	cfg := Config{Rounds: 3, GenTokens: 4, PromptTokens: 20, Pause: 1,
		Tokenizer: LlamaServerTokenizer(sa.Client(), sa.URL)}
	res, err := Compare(t.Context(), cfg, Side{Name: "A", URL: sa.URL}, Side{Name: "B", URL: sb.URL})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Rounds) != 3 || len(res.Generation.Ratios()) != 3 || len(res.Prompt.Ratios()) != 3 {
		t.Fatalf("rounds = %d, ratios %d/%d, want 3", len(res.Rounds), len(res.Generation.Ratios()), len(res.Prompt.Ratios()))
	}
	if res.SameText != 3 {
		t.Errorf("SameText = %d, want 3", res.SameText)
	}
	for i, rd := range res.Rounds {
		if rd.AFirst != (i%2 == 0) {
			t.Errorf("round %d: AFirst = %v", i, rd.AFirst)
		}
		if got := rd.Prompt[1].PromptTokens; got != cfg.PromptTokens {
			t.Errorf("round %d: prompt of %d tokens, want %d", i, got, cfg.PromptTokens)
		}
	}
	// Both sides got the same prompts; warm-up plus two requests a round.
	la, lb := fa.log(), fb.log()
	if len(la) != 2+2*3 || len(lb) != len(la) {
		t.Fatalf("requests: A %d, B %d, want 8 each", len(la), len(lb))
	}
	for i := range la {
		if strings.TrimPrefix(la[i], "A:") != strings.TrimPrefix(lb[i], "B:") {
			t.Errorf("request %d: A got %q, B %q", i, la[i], lb[i])
		}
	}
	if g := res.ServerGeneration(1); len(g) != 3 || g[0] != 200 {
		t.Errorf("ServerGeneration(B) = %v, want 3 × 200", g)
	}
	md := Markdown(ReportInfo{A: SideInfo{Name: "A"}, B: SideInfo{Name: "B"}}, res)
	if !strings.HasPrefix(md, SectionBegin) || !strings.Contains(md, SectionEnd) || !strings.Contains(md, "| 3 | A |") {
		t.Errorf("Markdown:\n%s", md)
	}
}

func TestStartServerWaitsForReadyAndCloseStopsIt(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	port, err := FreePort()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(fakeServerEnv, strconv.Itoa(port))
	s, err := StartServer(t.Context(), ServerConfig{Name: "child", Path: exe, Port: port})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Complete(t.Context(), http.DefaultClient, s.URL, Request{Prompt: "p", MaxTokens: 2}); err != nil {
		t.Errorf("Complete on the started server: %v", err)
	}
	if s.PeakRSS() == 0 {
		t.Error("PeakRSS = 0 for a running process")
	}
	if err := s.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	http.DefaultClient.CloseIdleConnections()
}

func TestStartServerReportsAnEarlyExit(t *testing.T) {
	_, err := StartServer(t.Context(), ServerConfig{Name: "false", Path: "/bin/false", Port: 1})
	if err == nil || !strings.Contains(err.Error(), "exited before it was ready") {
		t.Errorf("err = %v, want an early-exit error", err)
	}
}

func TestForeignCores(t *testing.T) {
	t0 := time.Unix(0, 0)
	snap := func(secs float64, busy uint64, procs ...uint64) cpuSnapshot {
		return cpuSnapshot{at: t0.Add(time.Duration(secs * float64(time.Second))), busy: busy, procs: procs, ok: true}
	}
	// 2 s; the machine used 400 ticks, the measured processes 350: others
	// took 50 ticks, 0.25 CPUs.
	if got := foreignCores(snap(0, 1000, 10, 20), snap(2, 1400, 300, 80)); got != 0.25 {
		t.Errorf("foreignCores = %v, want 0.25", got)
	}
	if got := foreignCores(cpuSnapshot{}, snap(1, 1)); got != -1 {
		t.Errorf("foreignCores of an unread snapshot = %v, want -1", got)
	}
	if s := takeCPUSnapshot(os.Getpid()); !s.ok || s.busy == 0 {
		t.Errorf("takeCPUSnapshot(self) = %+v, want a reading", s)
	}
}

func TestCompareRunsBusyRoundsAgain(t *testing.T) {
	_, sa := startFake(t, "A")
	_, sb := startFake(t, "B")
	// Each request takes two snapshots, 1 s apart on a fake clock. The
	// four warm-up requests take snapshots 1–8; during the first round's
	// first request (snapshots 9 and 10) others take 100 ticks, 1 CPU.
	var n int
	busyFirstRound := func(_ ...int) cpuSnapshot {
		n++
		s := cpuSnapshot{at: time.Unix(int64(n), 0), procs: []uint64{0, 0}, ok: true}
		if n >= 10 {
			s.busy = 100
		}
		return s
	}
	cfg := Config{Rounds: 2, GenTokens: 3, PromptTokens: 10, Pause: 1, Retries: 1,
		Tokenizer: LlamaServerTokenizer(sa.Client(), sa.URL), snapshot: busyFirstRound}
	res, err := Compare(t.Context(), cfg, Side{Name: "A", URL: sa.URL, PID: 1}, Side{Name: "B", URL: sb.URL, PID: 1})
	if err != nil {
		t.Fatal(err)
	}
	if res.Discarded != 1 || res.Disturbed != 0 || len(res.Rounds) != 2 {
		t.Errorf("discarded %d, disturbed %d, rounds %d; want 1, 0, 2", res.Discarded, res.Disturbed, len(res.Rounds))
	}
	for i, rd := range res.Rounds {
		if rd.Foreign != 0 {
			t.Errorf("round %d kept with others at %.2f CPUs", i, rd.Foreign)
		}
	}
}

func TestCompareLeavesRoundsBusyToTheEndOutOfTheMedians(t *testing.T) {
	_, sa := startFake(t, "A")
	_, sb := startFake(t, "B")
	var n int
	alwaysBusy := func(_ ...int) cpuSnapshot { // others take 1 CPU, always
		n++
		return cpuSnapshot{at: time.Unix(int64(n), 0), busy: uint64(100 * n), procs: []uint64{0, 0}, ok: true}
	}
	cfg := Config{Rounds: 2, GenTokens: 3, PromptTokens: 10, Pause: 1, Retries: 1,
		Tokenizer: LlamaServerTokenizer(sa.Client(), sa.URL), snapshot: alwaysBusy}
	res, err := Compare(t.Context(), cfg, Side{Name: "A", URL: sa.URL, PID: 1}, Side{Name: "B", URL: sb.URL, PID: 1})
	if err != nil {
		t.Fatal(err)
	}
	if res.Discarded != 1 || res.Disturbed != 2 || len(res.Rounds) != 2 || len(res.Generation.A) != 0 || len(res.Prompt.A) != 0 {
		t.Errorf("discarded %d, disturbed %d, rounds %d, counted %d/%d; want 1, 2, 2, 0/0",
			res.Discarded, res.Disturbed, len(res.Rounds), len(res.Generation.A), len(res.Prompt.A))
	}
	for i, rd := range res.Rounds {
		if !rd.Busy {
			t.Errorf("round %d not marked busy", i)
		}
	}
}
