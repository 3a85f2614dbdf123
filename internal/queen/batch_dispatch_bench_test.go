package queen

// The queen's own cost of a batch request, in this process: a queen on
// SQLite with a fake worker that answers at once, so that what is
// measured is the dispatcher, the store and the relay, not generation.
//
//	go test -run '^$' -bench BatchDispatch -benchtime 3x -cpuprofile cpu.out ./internal/queen/

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	oai "github.com/openai/openai-go"
	"github.com/openai/openai-go/option"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/openai"
	"github.com/apiary-llm/apiary/internal/routing"
)

// infoLogs keeps a test's log watch to Info and above: a debug line a
// job would be most of what the benchmark measures.
type infoLogs struct{ *logWatch }

func (l infoLogs) Enabled(_ context.Context, lv slog.Level) bool { return lv >= slog.LevelInfo }
func (l infoLogs) WithAttrs(as []slog.Attr) slog.Handler {
	return infoLogs{l.logWatch.WithAttrs(as).(*logWatch)}
}
func (l infoLogs) WithGroup(string) slog.Handler { return l }

// instantWorker answers every chat completion at once with the same
// small answer.
func instantWorker(b *testing.B) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			openai.WriteJSON(w, http.StatusOK, map[string]string{"status": "ready", "model": "tiny"})
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"tiny","choices":[{"index":0,"message":{"role":"assistant","content":"t0 t1 t2 t3 t4 t5 t6 t7 t8 t9 t10 t11 t12 t13 t14 t15"},"finish_reason":"length"}],"usage":{"prompt_tokens":8,"completion_tokens":16,"total_tokens":24}}`))
	}))
	b.Cleanup(srv.Close)
	return srv
}

// BenchmarkBatchDispatch: batches of 500 chat requests through the Batch
// API (create to the batch's end) against the same 500 sent at once to
// /v1/chat/completions, on one instant worker of 4 slots. Reported: the
// CPU time of this process (queen, fake worker and client together) a
// request on each side, and the requests per second of each.
func BenchmarkBatchDispatch(b *testing.B) {
	const n, slots = 500, 4
	x, _ := routeQueen(b, map[string][]api.Model{"http://127.0.0.1:1": {tinyModel}}, func(c *Config) {
		c.Routing = routing.Config{WorkerSlots: slots, MaxWorkers: 1, QueueSize: 2 * n, QueueTimeout: time.Minute}
		c.Logger = slog.New(infoLogs{c.Logger.Handler().(*logWatch)})
	})
	x.registerAt("node-1", "http://127.0.0.1:1")
	x.readyWorker("node-1", instantWorker(b).URL)
	client := oai.NewClient(option.WithBaseURL(x.url+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: n, DisableCompression: true}}
	defer hc.CloseIdleConnections()
	f, err := upload(b, client, batchFile(n, 16))
	if err != nil {
		b.Fatal(err)
	}
	pid := os.Getpid()
	next := 0
	var batchCPU, directCPU, batchTook, directTook time.Duration
	b.ResetTimer()
	for b.Loop() {
		cpu0, start := cpuTime(b, pid), time.Now()
		nb, err := client.Batches.New(context.Background(), oai.BatchNewParams{InputFileID: f.ID, Endpoint: oai.BatchNewParamsEndpointV1ChatCompletions,
			CompletionWindow: oai.BatchNewParamsCompletionWindow24h})
		if err != nil {
			b.Fatal(err)
		}
		rec, nx := x.logs.wait(b, next, "batch ended", map[string]string{"batch_id": nb.ID})
		next = nx
		batchTook += time.Since(start)
		batchCPU += cpuTime(b, pid) - cpu0
		if rec.Attrs["status"] != "completed" || rec.Attrs["succeeded"] != fmt.Sprint(n) {
			b.Fatalf("batch ended: %v", rec.Attrs)
		}
		cpu0, start = cpuTime(b, pid), time.Now()
		chatDirect(b, hc, x.url, n, 16)
		directTook += time.Since(start)
		directCPU += cpuTime(b, pid) - cpu0
	}
	reqs := time.Duration(n * b.N)
	b.ReportMetric(float64((batchCPU / reqs).Microseconds()), "batch-cpu-µs/req")
	b.ReportMetric(float64((directCPU / reqs).Microseconds()), "direct-cpu-µs/req")
	b.ReportMetric(float64(reqs)/batchTook.Seconds(), "batch-req/s")
	b.ReportMetric(float64(reqs)/directTook.Seconds(), "direct-req/s")
}
