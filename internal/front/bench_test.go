package front_test

import (
	"bufio"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/testbin"
	"github.com/apiary-llm/apiary/internal/testmodel"
)

// BenchmarkFrontTTFT measures what the front's loopback hop adds to the
// time to first token: llama-server on the test model behind a real
// `apiary engine-front`, asked for a streamed chat completion of one
// token directly and through the front, in turn, side by side on the
// same engine:
//
//	go test -run '^$' -bench FrontTTFT -benchtime 400x ./internal/front
func BenchmarkFrontTTFT(b *testing.B) {
	server := testbin.LlamaServer(b)
	dir := b.TempDir()
	model := filepath.Join(dir, "tiny.gguf")
	if err := testmodel.WriteFile(model, testmodel.Options{}); err != nil {
		b.Fatal(err)
	}
	enginePort := testbin.FreePort(b)
	engineURL := "http://127.0.0.1:" + strconv.Itoa(enginePort)
	p := testbin.Start(b, "engine-front", nil, "engine-front", "--log-json", "--engine-url", engineURL,
		"--", server, "-m", model, "--host", "127.0.0.1", "--port", strconv.Itoa(enginePort), "-c", "512", "-np", "1", "-t", "1")
	p.Lines.Wait(b, 0, "engine healthy", nil)
	started, _ := p.Lines.Wait(b, 0, "engine started", nil)
	frontURL := "http://" + started.Attrs["listen"]

	// Straight to llama-server a connection per request, as the front
	// itself connects to it (llama-server may close a kept-alive
	// connection under the next request); to the front one kept alive,
	// as the queen's relay keeps it.
	direct := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	via := &http.Client{}
	var d, f []time.Duration
	for b.Loop() {
		d = append(d, ttft(b, direct, engineURL))
		f = append(f, ttft(b, via, frontURL))
	}
	b.StopTimer()
	pd, pf := pct(d, 0.5), pct(f, 0.5)
	b.ReportMetric(ms(pd), "direct-p50-ms")
	b.ReportMetric(ms(pf), "front-p50-ms")
	b.ReportMetric(ms(pf-pd), "added-p50-ms")
	b.ReportMetric(ms(pct(d, 0.9)), "direct-p90-ms")
	b.ReportMetric(ms(pct(f, 0.9)), "front-p90-ms")
	b.ReportMetric(0, "ns/op")
	p.Signal(15)
	p.Wait(b)
}

// ttft posts a streamed one-token chat completion and returns the time
// to its first data line.
func ttft(b *testing.B, c *http.Client, base string) time.Duration {
	body := `{"messages":[{"role":"user","content":"Once upon a time"}],"max_tokens":1,"stream":true,"temperature":0}`
	t0 := time.Now()
	resp, err := c.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b.Fatalf("%s: %s", base, resp.Status)
	}
	sc := bufio.NewScanner(resp.Body)
	var first time.Duration
	for sc.Scan() {
		if first == 0 && strings.HasPrefix(sc.Text(), "data: ") {
			first = time.Since(t0)
		}
	}
	if first == 0 {
		b.Fatalf("%s: no data line", base)
	}
	return first
}

func pct(d []time.Duration, p float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(p*float64(len(s))))]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
