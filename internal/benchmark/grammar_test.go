package benchmark

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/testbin"
	"github.com/apiary-llm/apiary/internal/testmodel"
)

// grammarSchema is the benchmark's JSON schema: at least 24 strings of at
// least 8 characters, so that no answer can end within its tokens.
const grammarSchema = `{"type":"object","properties":{"notes":{"type":"array","minItems":24,
	"items":{"type":"string","minLength":8}}},"required":["notes"],"additionalProperties":false}`

// BenchmarkGrammarOverhead measures what a json_schema costs generation:
// the apiary worker and llama-server (the one `make test` builds, the
// same llama.cpp release), each on the same generated 91 M model (768 ×
// 12 layers, 12 heads, feed-forward 2048, vocab 4000), 2 threads, send
// 128 tokens greedy with and without the schema (the worker through
// response_format, llama-server through its json_schema field: both
// compile it with llama.cpp's own converter), in rounds that alternate
// the order. It reports each server's median decode rate with and
// without, and the median of its per-round ratios.
//
//	go test -run XXX -bench GrammarOverhead -benchtime 1x ./internal/benchmark/
//
// GRAMMAR_ROUNDS sets the rounds (default 6).
func BenchmarkGrammarOverhead(b *testing.B) {
	apiaryBin := os.Getenv("APIARY_BIN")
	if apiaryBin == "" {
		b.Fatal("APIARY_BIN is not set: `make build`, then point it at bin/apiary")
	}
	rounds := 6
	if v := os.Getenv("GRAMMAR_ROUNDS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			b.Fatalf("GRAMMAR_ROUNDS=%q: want a positive integer", v)
		}
		rounds = n
	}
	lsBin := testbin.LlamaServer(b)
	model := filepath.Join(b.TempDir(), "bench.gguf")
	if err := testmodel.WriteFile(model, testmodel.Options{Seed: 1, Dim: 768, Layers: 12, Heads: 12, FF: 2048, Vocab: 4000}); err != nil {
		b.Fatal(err)
	}
	var schema map[string]any
	if err := json.Unmarshal([]byte(grammarSchema), &schema); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	type side struct {
		name   string
		srv    *Server
		schema map[string]any // the fields that ask for the schema
	}
	start := func(name, bin string, args func(port int) []string) *Server {
		port, err := FreePort()
		if err != nil {
			b.Fatal(err)
		}
		s, err := StartServer(ctx, ServerConfig{Name: name, Path: bin, Args: args(port), Port: port})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { s.Close() })
		return s
	}
	sides := []side{
		{"apiary", start("apiary", apiaryBin, func(port int) []string {
			return []string{"worker", "--worker-id", "bench", "--model", model, "--gpu-device", "-1", "--host", "127.0.0.1",
				"--port", strconv.Itoa(port), "--threads", "2", "--ctx-size", "512", "--slots", "1"}
		}), map[string]any{"response_format": map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "notes", "schema": schema}}}},
		{"llama-server", start("llama-server", lsBin, func(port int) []string {
			return []string{"-m", model, "-t", "2", "-c", "512", "--host", "127.0.0.1", "--port", strconv.Itoa(port), "-np", "1"}
		}), map[string]any{"json_schema": schema, "cache_prompt": false}},
	}
	// A connection per request: llama-server closes kept-alive
	// connections under the next request.
	client := &http.Client{Timeout: 5 * time.Minute, Transport: &http.Transport{DisableKeepAlives: true}}
	const tokens = 128
	type rates struct{ plain, schema, ratio []float64 }
	got := make([]rates, len(sides))
	run := func(s side, constrained bool) float64 {
		r := Request{Prompt: "Notes about the hive:", MaxTokens: tokens, Extra: map[string]any{"ignore_eos": false}}
		if constrained {
			for k, v := range s.schema {
				r.Extra[k] = v
			}
		} else if s.name == "llama-server" {
			r.Extra["cache_prompt"] = false
		}
		smp, err := Complete(ctx, client, s.srv.URL, r)
		if err != nil {
			b.Fatal(err)
		}
		if smp.CompletionTokens != tokens {
			b.Fatalf("%s (schema %v) generated %d tokens, want %d: %q", s.name, constrained, smp.CompletionTokens, tokens, smp.Text)
		}
		if constrained && (len(smp.Text) == 0 || smp.Text[0] != '{') {
			b.Fatalf("%s: the schema's answer %q is not JSON", s.name, smp.Text)
		}
		return smp.GenerationRate()
	}
	for range b.N {
		for round := range rounds {
			for i, s := range sides {
				order := []bool{false, true}
				if round%2 == 1 {
					order = []bool{true, false}
				}
				var plain, constrained float64
				for _, c := range order {
					if c {
						constrained = run(s, true)
					} else {
						plain = run(s, false)
					}
				}
				got[i].plain = append(got[i].plain, plain)
				got[i].schema = append(got[i].schema, constrained)
				got[i].ratio = append(got[i].ratio, constrained/plain)
			}
		}
	}
	for i, s := range sides {
		r := got[i]
		b.Logf("%s: %.1f tok/s plain, %.1f with the schema (medians of %d rounds); schema/plain %.3f (per-round %s)",
			s.name, Median(r.plain), Median(r.schema), len(r.ratio), Median(r.ratio), spread(r.ratio))
		b.ReportMetric(Median(r.ratio), s.name+"-schema/plain")
	}
}

// spread is the range of xs, as "min–max".
func spread(xs []float64) string {
	return fmt.Sprintf("%.3f–%.3f", slices.Min(xs), slices.Max(xs))
}
