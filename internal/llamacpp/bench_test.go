package llamacpp_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/engine"
	"github.com/apiary-llm/apiary/internal/llamacpp"
	"github.com/apiary-llm/apiary/internal/testmodel"
)

// BenchmarkWorkerHTTPvsInProcess measures generation speed through a real
// `apiary worker` process's streaming HTTP API against this package's own
// in-process loop on the same model, threads and sampling settings. Rounds
// alternate A/B; it reports the median tokens/s of each and the median of the
// paired ratios (http/in-process). Run it with `make bench-worker`.
func BenchmarkWorkerHTTPvsInProcess(b *testing.B) {
	for _, m := range []struct {
		name        string
		layers, dim int
	}{
		{"tiny-2x64", 2, 64},
		{"small-8x512", 8, 512},
	} {
		b.Run(m.name, func(b *testing.B) { benchHTTPvsInProcess(b, m.layers, m.dim) })
	}
}

const (
	benchThreads = 2
	benchTokens  = 128
	benchCtx     = 512
)

func benchHTTPvsInProcess(b *testing.B, layers, dim int) {
	bin := os.Getenv("APIARY_BIN")
	if bin == "" {
		b.Fatal("APIARY_BIN is not set: run `make bench-worker` (it builds bin/apiary first)")
	}
	path := filepath.Join(b.TempDir(), "bench.gguf")
	if err := testmodel.WriteFile(path, testmodel.Options{Seed: 1, Layers: layers, Dim: dim}); err != nil {
		b.Fatal(err)
	}
	e, err := llamacpp.Load(context.Background(), engine.Options{
		ModelPath: path, CtxSize: benchCtx, Slots: 1, Threads: benchThreads, GPUDevice: -1,
	}, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	uri := startWorker(b, bin, path)
	prompt, err := e.Tokenize("Hello", true)
	if err != nil {
		b.Fatal(err)
	}

	var inproc, viaHTTP, ratios []float64
	for i := 0; i < b.N; i++ {
		a := inProcessTokensPerSecond(b, e, prompt)
		h := httpTokensPerSecond(b, uri)
		inproc, viaHTTP, ratios = append(inproc, a), append(viaHTTP, h), append(ratios, h/a)
	}
	b.ReportMetric(median(inproc), "inproc_tok/s")
	b.ReportMetric(median(viaHTTP), "http_tok/s")
	b.ReportMetric(median(ratios), "http/inproc")
}

// inProcessTokensPerSecond times the engine's loop from the first token to the last.
func inProcessTokensPerSecond(b *testing.B, e *llamacpp.Engine, prompt []int) float64 {
	var first, last time.Time
	n := 0
	_, err := e.Generate(context.Background(), engine.Request{Prompt: prompt, MaxTokens: benchTokens, IgnoreEOS: true},
		func(engine.Token) error {
			last = time.Now()
			if n == 0 {
				first = last
			}
			n++
			return nil
		})
	if err != nil || n != benchTokens {
		b.Fatalf("in-process generation: %d tokens, %v", n, err)
	}
	return float64(n-1) / last.Sub(first).Seconds()
}

// httpTokensPerSecond streams one completion and times the first SSE chunk
// to the last.
func httpTokensPerSecond(b *testing.B, uri string) float64 {
	body := fmt.Sprintf(`{"model":"bench","prompt":"Hello","max_tokens":%d,"temperature":0,"ignore_eos":true,"stream":true}`, benchTokens)
	req, err := http.NewRequest(http.MethodPost, uri+"/v1/completions", strings.NewReader(body))
	if err != nil {
		b.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+benchWorkerToken) // the worker answers only /health without it
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b.Fatalf("worker answered %s", resp.Status)
	}
	var first, last time.Time
	n := 0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Bytes()
		if !bytes.HasPrefix(line, []byte("data: {")) {
			continue
		}
		var chunk struct {
			Choices []struct {
				Text string `json:"text"`
			} `json:"choices"`
		}
		if err := json.Unmarshal(line[len("data: "):], &chunk); err != nil {
			b.Fatal(err)
		}
		if len(chunk.Choices) == 0 || chunk.Choices[0].Text == "" {
			continue // a final chunk without text, or a token still held for UTF-8
		}
		last = time.Now()
		if n == 0 {
			first = last
		}
		n++
	}
	if err := sc.Err(); err != nil {
		b.Fatal(err)
	}
	if n < benchTokens/2 {
		b.Fatalf("only %d text chunks for %d tokens", n, benchTokens)
	}
	return float64(n-1) / last.Sub(first).Seconds()
}

// benchWorkerToken is the token startWorker gives its worker.
const benchWorkerToken = "bench-token"

// startWorker runs `apiary worker` on a free port and returns its URI, which
// it learns from the worker's own ready callback.
func startWorker(b *testing.B, bin, model string) string {
	ready := make(chan string, 1)
	cb := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			URI string `json:"uri"`
		}
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		select {
		case ready <- body.URI:
		default:
		}
	}))
	b.Cleanup(cb.Close)
	cmd := exec.Command(bin, "worker", "--worker-id", "bench", "--model", model, "--port", "0",
		"--gpu-device", "-1", "--threads", fmt.Sprint(benchThreads), "--ctx-size", fmt.Sprint(benchCtx),
		"--callback-url", cb.URL)
	cmd.Env = append(os.Environ(), "APIARY_WORKER_TOKEN="+benchWorkerToken)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	b.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	select {
	case uri := <-ready:
		return uri
	case err := <-exited:
		b.Fatalf("worker exited before ready: %v\n%s", err, stderr.String())
	case <-time.After(2 * time.Minute):
		b.Fatalf("worker not ready after 2 minutes\n%s", stderr.String())
	}
	return ""
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// BenchmarkChoices measures one request of 4 choices (a 400-token prompt,
// 32 tokens each) on an 8×512 model, 2 threads: at once, the prompt
// decoded once (GenerateChoices), against one after another, each
// decoding the prompt (Generate with seeds seed+i). Rounds alternate;
// ns/op is one request.
//
//	go test -run XXX -bench Choices -benchtime 5x ./internal/llamacpp/
func BenchmarkChoices(b *testing.B) {
	path := filepath.Join(b.TempDir(), "bench.gguf")
	if err := testmodel.WriteFile(path, testmodel.Options{Seed: 1, Layers: 8, Dim: 512}); err != nil {
		b.Fatal(err)
	}
	const n = 4
	e, err := llamacpp.Load(context.Background(), engine.Options{
		ModelPath: path, CtxSize: n * benchCtx, Slots: n, Threads: benchThreads, GPUDevice: -1,
	}, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { e.Close() })
	p, err := e.Tokenize(strings.Repeat("the hive keeps its bees warm in winter ", 50), true)
	if err != nil {
		b.Fatal(err)
	}
	p = p[:400]
	req := engine.Request{Prompt: p, MaxTokens: 32, IgnoreEOS: true, Temperature: 1, Seed: 1}
	nop := func(int, engine.Token) error { return nil }
	b.Run("at-once", func(b *testing.B) {
		for b.Loop() {
			if _, err := e.GenerateChoices(b.Context(), req, n, nop); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("one-after-another", func(b *testing.B) {
		for b.Loop() {
			for i := range n {
				ri := req
				ri.Seed += uint32(i)
				if _, err := e.Generate(b.Context(), ri, func(engine.Token) error { return nil }); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
}
