package llamacpp_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/apiary-llm/apiary/internal/engine"
	"github.com/apiary-llm/apiary/internal/llamacpp"
	"github.com/apiary-llm/apiary/internal/testbin"
	"github.com/apiary-llm/apiary/internal/testmodel"
	"github.com/google/go-cmp/cmp"
)

// writeModel generates the deterministic test model into a temp dir.
func writeModel(t testing.TB) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tiny.gguf")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := testmodel.Write(f, testmodel.Options{Seed: 1, Layers: 2, Dim: 64}); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

func load(t testing.TB, slots int) *llamacpp.Engine {
	t.Helper()
	return loadCtx(t, slots, 256)
}

func loadCtx(t testing.TB, slots, ctxPerSlot int) *llamacpp.Engine {
	t.Helper()
	e, err := llamacpp.Load(context.Background(), engine.Options{
		ModelPath: writeModel(t), CtxSize: ctxPerSlot * slots, Slots: slots, Threads: 1, GPUDevice: -1, // one thread: no spin-waiting when tests share the CPU
	}, nil)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// collect runs one generation and returns the token ids.
func collect(t *testing.T, e *llamacpp.Engine, req engine.Request) ([]int, engine.Result) {
	t.Helper()
	var ids []int
	res, err := e.Generate(t.Context(), req, func(tok engine.Token) error {
		ids = append(ids, tok.ID)
		return nil
	})
	if err != nil {
		t.Fatalf("Generate: %v", err)
	}
	return ids, res
}

func prompt(t *testing.T, e *llamacpp.Engine, text string) []int {
	t.Helper()
	ids, err := e.Tokenize(text, true)
	if err != nil {
		t.Fatalf("Tokenize: %v", err)
	}
	return ids
}

func TestLoadReportsModel(t *testing.T) {
	e := load(t, 1)
	info := e.Info()
	if info.Architecture != "llama" {
		t.Errorf("architecture = %q, want llama", info.Architecture)
	}
	if info.CtxSize != 256 {
		t.Errorf("ctx per slot = %d, want 256", info.CtxSize)
	}
	if info.Vocab < 259 {
		t.Errorf("vocab = %d, want the byte-level vocabulary (>= 259)", info.Vocab)
	}
	if info.MemoryBytes < 500_000 {
		t.Errorf("memory = %d bytes, less than the weights", info.MemoryBytes)
	}
}

func TestTokenizeAddsBOSAndCoversText(t *testing.T) {
	e := load(t, 1)
	ids := prompt(t, e, "Hello, world")
	if len(ids) < 2 || ids[0] != 1 {
		t.Fatalf("tokens = %v, want BOS (1) first and the text after it", ids)
	}
}

func TestTokenizeKeepsOneBOSWhenTextStartsWithIt(t *testing.T) {
	e := load(t, 1)
	ids := prompt(t, e, "<s>Hi")
	if len(ids) < 2 || ids[0] != 1 || ids[1] == 1 {
		t.Fatalf("tokens = %v, want exactly one BOS (1) first", ids)
	}
}

func TestLoadStopsWhenContextIsCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := llamacpp.Load(ctx, engine.Options{ModelPath: writeModel(t), GPUDevice: -1}, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("Load with a cancelled context: %v, want context.Canceled", err)
	}
}

func TestGreedyIsDeterministicAndHonoursMaxTokens(t *testing.T) {
	e := load(t, 1)
	req := engine.Request{Prompt: prompt(t, e, "The bees"), MaxTokens: 24, IgnoreEOS: true}
	a, res := collect(t, e, req)
	b, _ := collect(t, e, req)
	if len(a) != 24 || res.CompletionTokens != 24 || res.FinishReason != engine.FinishLength {
		t.Fatalf("got %d tokens, result %+v; want 24 and finish length", len(a), res)
	}
	if res.PromptTokens != len(req.Prompt) {
		t.Errorf("prompt tokens = %d, want %d", res.PromptTokens, len(req.Prompt))
	}
	if diff := cmp.Diff(a, b); diff != "" {
		t.Errorf("greedy runs differ (-first +second):\n%s", diff)
	}
}

// frequency_penalty and presence_penalty change what is generated (they
// were once accepted and ignored), greedy included, and stay
// deterministic.
func TestPenaltiesChangeGreedyOutput(t *testing.T) {
	e := load(t, 1)
	base := engine.Request{Prompt: prompt(t, e, "The bees"), MaxTokens: 48, IgnoreEOS: true}
	plain, _ := collect(t, e, base)
	for _, req := range []engine.Request{
		{Prompt: base.Prompt, MaxTokens: 48, IgnoreEOS: true, FrequencyPenalty: 2},
		{Prompt: base.Prompt, MaxTokens: 48, IgnoreEOS: true, PresencePenalty: 2},
	} {
		a, _ := collect(t, e, req)
		b, _ := collect(t, e, req)
		if cmp.Equal(a, plain) {
			t.Errorf("penalties %v/%v left the greedy output as it was", req.FrequencyPenalty, req.PresencePenalty)
		}
		if !cmp.Equal(a, b) {
			t.Errorf("penalties %v/%v: two greedy runs differ", req.FrequencyPenalty, req.PresencePenalty)
		}
	}
}

func TestSeededSamplingRepeats(t *testing.T) {
	e := load(t, 1)
	req := engine.Request{Prompt: prompt(t, e, "x"), MaxTokens: 32, Temperature: 1, TopK: 40, TopP: 0.95, Seed: 42, IgnoreEOS: true}
	a, _ := collect(t, e, req)
	b, _ := collect(t, e, req)
	if diff := cmp.Diff(a, b); diff != "" {
		t.Errorf("same seed, different tokens (-first +second):\n%s", diff)
	}
	req.Seed = 43
	c, _ := collect(t, e, req)
	if cmp.Equal(a, c) {
		t.Errorf("seeds 42 and 43 produced the same %d tokens", len(a))
	}
}

// Parallel sequences are decoded in one batch; each must produce exactly
// what it produces alone.
func TestParallelSlotsMatchSequentialRuns(t *testing.T) {
	e := load(t, 3)
	texts := []string{"alpha", "a much longer prompt about hives and queens", "z"}
	want := make([][]int, len(texts))
	for i, s := range texts {
		want[i], _ = collect(t, e, engine.Request{Prompt: prompt(t, e, s), MaxTokens: 20, IgnoreEOS: true})
	}
	got := make([][]int, len(texts))
	var wg sync.WaitGroup
	for i, s := range texts {
		p := prompt(t, e, s)
		wg.Go(func() {
			ids, _, err := generate(t.Context(), e, engine.Request{Prompt: p, MaxTokens: 20, IgnoreEOS: true})
			if err != nil {
				t.Errorf("slot %d: %v", i, err)
			}
			got[i] = ids
		})
	}
	wg.Wait()
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("batched generations differ from sequential ones (-want +got):\n%s", diff)
	}
}

// Background sequences, whose prompts yield to foreground ones (decoded
// in chunks while a foreground sequence generates), generate what they
// generate alone.
func TestBackgroundPromptsYieldAndMatchSequentialRuns(t *testing.T) {
	e := load(t, 3)
	long := strings.Repeat("a much longer prompt about hives and queens ", 3)
	reqs := []engine.Request{
		{Prompt: prompt(t, e, long), MaxTokens: 20, IgnoreEOS: true, Background: true},
		{Prompt: prompt(t, e, "alpha"), MaxTokens: 20, IgnoreEOS: true},
		{Prompt: prompt(t, e, long+"z"), MaxTokens: 20, IgnoreEOS: true, Background: true},
	}
	want := make([][]int, len(reqs))
	for i, r := range reqs {
		want[i], _ = collect(t, e, r)
	}
	got := make([][]int, len(reqs))
	var wg sync.WaitGroup
	for i, r := range reqs {
		wg.Go(func() {
			ids, _, err := generate(t.Context(), e, r)
			if err != nil {
				t.Errorf("slot %d: %v", i, err)
			}
			got[i] = ids
		})
	}
	wg.Wait()
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("batched generations differ from sequential ones (-want +got):\n%s", diff)
	}
}

func generate(ctx context.Context, e *llamacpp.Engine, req engine.Request) ([]int, engine.Result, error) {
	var ids []int
	res, err := e.Generate(ctx, req, func(tok engine.Token) error {
		ids = append(ids, tok.ID)
		return nil
	})
	return ids, res, err
}

func TestEmitStopEndsGeneration(t *testing.T) {
	e := load(t, 1)
	n := 0
	res, err := e.Generate(t.Context(), engine.Request{Prompt: prompt(t, e, "q"), MaxTokens: 100, IgnoreEOS: true},
		func(engine.Token) error {
			n++
			if n == 5 {
				return engine.ErrStop
			}
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	if n != 5 || res.FinishReason != engine.FinishStop {
		t.Fatalf("emitted %d tokens, finish %q; want 5 and stop", n, res.FinishReason)
	}
}

func TestCancelledContextEndsGenerationAtNextToken(t *testing.T) {
	e := load(t, 1)
	ctx, cancel := context.WithCancel(t.Context())
	n := 0
	_, err := e.Generate(ctx, engine.Request{Prompt: prompt(t, e, "q"), MaxTokens: 200, IgnoreEOS: true},
		func(engine.Token) error {
			n++
			if n == 3 {
				cancel()
			}
			return nil
		})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if n >= 200 {
		t.Fatalf("generation ran to the end (%d tokens) despite cancellation", n)
	}
	// The slot is free again.
	if _, res := collect(t, e, engine.Request{Prompt: prompt(t, e, "q"), MaxTokens: 3, IgnoreEOS: true}); res.CompletionTokens != 3 {
		t.Fatalf("after cancel: %+v", res)
	}
}

func TestContextFullFinishesWithLength(t *testing.T) {
	e := load(t, 1)
	p := prompt(t, e, "q")
	_, res := collect(t, e, engine.Request{Prompt: p, MaxTokens: 10_000, IgnoreEOS: true})
	if res.FinishReason != engine.FinishLength || len(p)+res.CompletionTokens > 257 {
		t.Fatalf("result %+v with %d prompt tokens; want finish length within the 256-token context", res, len(p))
	}
}

func TestPromptTooLong(t *testing.T) {
	e := load(t, 1)
	long := make([]int, 300)
	for i := range long {
		long[i] = 70
	}
	_, _, err := generate(t.Context(), e, engine.Request{Prompt: long, MaxTokens: 1})
	if !errors.Is(err, engine.ErrPromptTooLong) {
		t.Fatalf("err = %v, want ErrPromptTooLong", err)
	}
}

func TestCloseEndsGenerationsInFlight(t *testing.T) {
	e := loadCtx(t, 1, 2048) // long enough that the generation is still running at Close
	first := make(chan struct{})
	errc := make(chan error, 1)
	go func() {
		var once sync.Once
		_, err := e.Generate(context.Background(), engine.Request{Prompt: []int{1, 70}, MaxTokens: 1_000_000, IgnoreEOS: true},
			func(engine.Token) error {
				once.Do(func() { close(first) })
				return nil
			})
		errc <- err
	}()
	<-first
	if err := e.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := <-errc; !errors.Is(err, engine.ErrClosed) {
		t.Fatalf("err = %v, want ErrClosed", err)
	}
	if err := e.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, _, err := generate(t.Context(), e, engine.Request{Prompt: []int{1}, MaxTokens: 1}); !errors.Is(err, engine.ErrClosed) {
		t.Fatalf("Generate after Close: %v, want ErrClosed", err)
	}
}

func TestChatPromptFallbackWithoutTemplate(t *testing.T) {
	e := load(t, 1)
	got, err := e.ChatPrompt([]engine.Message{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "Hi"}})
	if err != nil {
		t.Fatal(err)
	}
	want := "System: Be brief.\n\nUser: Hi\n\nAssistant:"
	if got != want {
		t.Fatalf("prompt = %q, want %q", got, want)
	}
}

func TestLoadRejectsMissingAndNonGGUFFiles(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.gguf")
	if err := os.WriteFile(bad, []byte("this is not a model"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{filepath.Join(dir, "missing.gguf"), bad} {
		if _, err := llamacpp.Load(context.Background(), engine.Options{ModelPath: path, GPUDevice: -1}, nil); err == nil {
			t.Errorf("Load(%s) succeeded, want an error", path)
		}
	}
}

// choices runs n choices of req at once and returns each one's token ids.
func choices(t *testing.T, e *llamacpp.Engine, req engine.Request, n int, emit func(i int, ids []int) error) ([][]int, []engine.Result) {
	t.Helper()
	ids := make([][]int, n)
	res, err := e.GenerateChoices(t.Context(), req, n, func(i int, tok engine.Token) error {
		ids[i] = append(ids[i], tok.ID)
		if emit != nil {
			return emit(i, ids[i])
		}
		return nil
	})
	if err != nil {
		t.Fatalf("GenerateChoices: %v", err)
	}
	return ids, res
}

// Several choices of one request decode the prompt once and each
// generates what a request of its own with its seed generates.
func TestChoicesShareThePromptAndMatchSeparateRuns(t *testing.T) {
	e := load(t, 3)
	p := prompt(t, e, strings.Repeat("a much longer prompt about hives and queens ", 3))
	req := engine.Request{Prompt: p, MaxTokens: 20, IgnoreEOS: true, Temperature: 1, TopK: 40, Seed: 7}
	want := make([][]int, 3)
	for i := range want {
		ri := req
		ri.Seed += uint32(i)
		want[i], _ = collect(t, e, ri)
	}
	before := e.PromptTokensDecoded()
	got, res := choices(t, e, req, 3, nil)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("choices differ from separate runs with their seeds (-want +got):\n%s", diff)
	}
	// The earlier runs left the prompt in a slot's memory: what it held
	// (CachedTokens) is not decoded again.
	if decoded := e.PromptTokensDecoded() - before; decoded != int64(len(p)-res[0].CachedTokens) {
		t.Errorf("three choices decoded %d prompt tokens and found %d cached, want the prompt's %d once", decoded, res[0].CachedTokens, len(p))
	}
	for i, r := range res {
		if r.CompletionTokens != 20 || r.PromptTokens != len(p) || r.FinishReason != engine.FinishLength {
			t.Errorf("choice %d: %+v", i, r)
		}
	}
	if slices.Equal(got[0], got[1]) {
		t.Errorf("choices 0 and 1 sampled the same tokens: their seeds differ")
	}

	// Greedy choices are the same, and the same as one greedy run.
	greedy := engine.Request{Prompt: p, MaxTokens: 12, IgnoreEOS: true}
	one, _ := collect(t, e, greedy)
	two, _ := choices(t, e, greedy, 2, nil)
	if !slices.Equal(two[0], one) || !slices.Equal(two[1], one) {
		t.Errorf("greedy choices %v, want %v twice", two, one)
	}
}

// A choice that stops ends alone; the others go on. More choices than
// slots is an error; choices that find too few slots free wait for them.
func TestChoicesStopAloneAndWaitForSlots(t *testing.T) {
	e := load(t, 2)
	p := prompt(t, e, "The bees")
	req := engine.Request{Prompt: p, MaxTokens: 16, IgnoreEOS: true}
	got, res := choices(t, e, req, 2, func(i int, ids []int) error {
		if i == 1 && len(ids) == 3 {
			return engine.ErrStop
		}
		return nil
	})
	if len(got[0]) != 16 || len(got[1]) != 3 || res[1].FinishReason != engine.FinishStop || res[0].FinishReason != engine.FinishLength {
		t.Errorf("tokens %d and %d, results %+v; want 16 (length) and 3 (stop)", len(got[0]), len(got[1]), res)
	}
	if _, err := e.GenerateChoices(t.Context(), req, 3, func(int, engine.Token) error { return nil }); err == nil {
		t.Errorf("three choices on two slots: no error")
	}

	// One slot busy with a long generation: two choices wait for both.
	started := make(chan struct{})
	done := make(chan int)
	go func() {
		n := 0
		_, err := e.Generate(t.Context(), engine.Request{Prompt: p, MaxTokens: 64, IgnoreEOS: true}, func(engine.Token) error {
			if n++; n == 1 {
				close(started)
			}
			return nil
		})
		if err != nil {
			t.Error(err)
		}
		done <- n
	}()
	<-started
	want, _ := collect(t, e, engine.Request{Prompt: p, MaxTokens: 16, IgnoreEOS: true})
	two, _ := choices(t, e, req, 2, nil)
	if !slices.Equal(two[0], want) || !slices.Equal(two[1], want) {
		t.Errorf("choices after waiting for a slot: %v, want %v twice", two, want)
	}
	if n := <-done; n != 64 {
		t.Errorf("the long generation beside them made %d tokens, want 64", n)
	}
}

// An interactive (foreground) request that arrives while background
// sequences generate has its prompt and first tokens decoded in steps of
// their own: the background sequences sit out until its first character
// is out, then go on.
func TestBackgroundSitsOutUntilForegroundSpeaks(t *testing.T) {
	e := load(t, 3)
	type step struct{ fg, bg int }
	var mu sync.Mutex
	var steps []step
	e.OnStep(func(fg, bg int) {
		mu.Lock()
		steps = append(steps, step{fg, bg})
		mu.Unlock()
	})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	started := make(chan struct{}, 2)
	var wg sync.WaitGroup
	for _, p := range []string{"the batch's first job", "the batch's second job"} {
		wg.Go(func() {
			n := 0
			_, _ = e.Generate(ctx, engine.Request{Prompt: prompt(t, e, p), MaxTokens: 1_000_000, IgnoreEOS: true, Background: true},
				func(engine.Token) error {
					if n++; n == 3 {
						started <- struct{}{}
					}
					return nil
				})
		})
	}
	<-started
	<-started
	mu.Lock()
	before := len(steps)
	mu.Unlock()
	// k: the foreground tokens until its first whole character.
	var lead []byte
	k := 0
	_, err := e.Generate(t.Context(), engine.Request{Prompt: prompt(t, e, "an interactive question about hives"), MaxTokens: 8, IgnoreEOS: true},
		func(tok engine.Token) error {
			if k == 0 || !utf8.Valid(lead) || len(lead) == 0 {
				if k < 4 {
					lead = append(lead, tok.Piece...)
					k++
				}
			}
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	first := -1 // the step of the foreground prompt
	for i := before; i < len(steps); i++ {
		if steps[i].fg > 1 {
			first = i
			break
		}
	}
	if first < 0 || first+k >= len(steps) {
		t.Fatalf("no step decoded the foreground prompt, or none came after its first %d tokens: %v", k, steps[before:])
	}
	for i := first; i < first+k; i++ {
		if steps[i].bg != 0 {
			t.Errorf("step %d (of the foreground prompt and its first %d tokens) decoded %d background tokens: %v",
				i-first, k, steps[i].bg, steps[first:min(len(steps), first+k+2)])
		}
	}
	if steps[first+k].bg == 0 {
		t.Errorf("the background sequences did not go on once the foreground one spoke: %v", steps[first:min(len(steps), first+k+2)])
	}
}

// While interactive requests come (a foreground sequence ran within the
// engine's foreground window), a background prompt is decoded in chunks
// of a few tokens a step, so that the step an interactive request waits
// for is short; with none lately, it goes whole, as fast as it can.
func TestBackgroundPromptsChunkedWhileForegroundRecent(t *testing.T) {
	long := strings.Repeat("a much longer prompt about hives and queens ", 3)
	for _, tc := range []struct {
		name       string
		recent     time.Duration
		foreground bool
		chunked    bool
	}{
		{"after a foreground request, within the window", time.Hour, true, true},
		{"after a foreground request, the window over", time.Nanosecond, true, false},
		{"no foreground request", time.Hour, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := load(t, 2)
			e.SetForegroundRecent(tc.recent)
			var mu sync.Mutex
			var bg []int
			e.OnStep(func(_, b int) {
				mu.Lock()
				bg = append(bg, b)
				mu.Unlock()
			})
			if tc.foreground {
				if _, _, err := generate(t.Context(), e, engine.Request{Prompt: prompt(t, e, "alpha"), MaxTokens: 2, IgnoreEOS: true}); err != nil {
					t.Fatal(err)
				}
			}
			p := prompt(t, e, long)
			if len(p) <= 8 {
				t.Fatalf("prompt of %d tokens: too short to be chunked", len(p))
			}
			mu.Lock()
			bg = nil
			mu.Unlock()
			_, res, err := generate(t.Context(), e, engine.Request{Prompt: p, MaxTokens: 1, IgnoreEOS: true, Background: true})
			if err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(bg) == 0 {
				t.Fatal("no step decoded the background prompt")
			}
			if most := slices.Max(bg); tc.chunked && most > 8 {
				t.Errorf("a step decoded %d background tokens, want at most 8: %v", most, bg)
			} else if !tc.chunked && most != len(p)-res.CachedTokens {
				t.Errorf("the %d-token prompt (%d of them cached) took steps of %v, want one step", len(p), res.CachedTokens, bg)
			}
		})
	}
}

// A foreground request that comes while the loop decodes a step of
// background tokens only ends that step (llama.cpp aborts it between the
// nodes of its graph) or, when it comes just before, the step is not
// begun: it waits for a fraction of a step, not for the batch's. The
// background sequences take the step again after it and generate what
// they generate alone, as does the foreground one.
func TestForegroundEndsBackgroundStep(t *testing.T) {
	long := strings.Repeat("a much longer prompt about hives and queens ", 3)
	for _, tc := range []struct {
		name  string
		abort bool // the request comes during the step's decode, not just before it
	}{{"during the step", true}, {"before the step begins", false}} {
		t.Run(tc.name, func(t *testing.T) {
			var logs testbin.SyncBuffer // llama.cpp's warning of the ended step goes out at Debug (lineLevel)
			e, err := llamacpp.Load(context.Background(), engine.Options{ModelPath: writeModel(t), CtxSize: 512, Slots: 2, Threads: 1, GPUDevice: -1},
				slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { e.Close() })
			bgReq := engine.Request{Prompt: prompt(t, e, long), MaxTokens: 20, IgnoreEOS: true, Background: true}
			fgReq := engine.Request{Prompt: prompt(t, e, "an interactive question"), MaxTokens: 8, IgnoreEOS: true}
			wantBg, _ := collect(t, e, bgReq)
			wantFg, _ := collect(t, e, fgReq)

			var once sync.Once
			var fgGot []int
			var fgErr error
			fgDone := make(chan struct{})
			// comeNow sends the foreground request and waits until the
			// engine has it on its way (and, during a step, asked the
			// step to end).
			comeNow := func() {
				once.Do(func() {
					go func() {
						defer close(fgDone)
						fgGot, _, fgErr = generate(t.Context(), e, fgReq)
					}()
					for e.ForegroundComing() == 0 || tc.abort && !e.StepAbortAsked() {
						time.Sleep(100 * time.Microsecond)
					}
				})
			}
			if tc.abort {
				e.OnBackgroundStep(comeNow) // the step is armed: the request asks it to end
			} else {
				e.OnStep(func(fg, bg int) { // before the step is armed
					if fg == 0 && bg > 0 {
						comeNow()
					}
				})
			}
			bgGot, _, err := generate(t.Context(), e, bgReq)
			if err != nil {
				t.Fatal(err)
			}
			<-fgDone
			if fgErr != nil {
				t.Fatal(fgErr)
			}
			if n := e.StepsYielded(); n != 1 {
				t.Errorf("%d background steps yielded, want 1", n)
			}
			if diff := cmp.Diff(wantBg, bgGot); diff != "" {
				t.Errorf("the background sequence generated otherwise after its step was ended (-alone +after):\n%s", diff)
			}
			if diff := cmp.Diff(wantFg, fgGot); diff != "" {
				t.Errorf("the foreground sequence generated otherwise (-alone +got):\n%s", diff)
			}
			out := logs.String()
			if tc.abort && !strings.Contains(out, "level=DEBUG msg=\"decode: removing memory module entries") {
				t.Errorf("llama.cpp's line for the ended step is not in the log at Debug:\n%s", out)
			}
			if strings.Contains(out, "level=WARN msg=\"decode: removing") {
				t.Errorf("an ended step logged a warning:\n%s", out)
			}
		})
	}
}

// KVCacheUsage counts what a running sequence holds (its prompt and the
// tokens made so far, of every slot's context) and is 0 once nothing
// runs: the kept memory of an ended sequence is free to take.
func TestKVCacheUsage(t *testing.T) {
	e := load(t, 2)
	var mu sync.Mutex
	var most float64
	e.OnStep(func(int, int) { // in the decode loop, each step
		mu.Lock()
		most = max(most, e.KVCacheUsage())
		mu.Unlock()
	})
	p := prompt(t, e, "a prompt that fills some of the cache")
	if _, err := e.Generate(t.Context(), engine.Request{Prompt: p, MaxTokens: 16, IgnoreEOS: true}, func(engine.Token) error { return nil }); err != nil {
		t.Fatal(err)
	}
	ctxPerSlot, slots, _ := e.KVLayout()
	mu.Lock()
	during := most
	mu.Unlock()
	if least := float64(len(p)) / float64(ctxPerSlot*slots); during < least || during > 1 {
		t.Errorf("usage while it ran at most %v; want at least its prompt's share %v", during, least)
	}
	for deadline := time.Now().Add(10 * time.Second); e.KVCacheUsage() != 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("usage %v with nothing running", e.KVCacheUsage())
		}
	}
}
