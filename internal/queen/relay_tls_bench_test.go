//go:build !race

package queen

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/testbin"
)

// BenchmarkRelayTLS: what TLS adds to time to first token through the
// queen. Two clusters run side by side, each a queen, a hive and one
// worker (64 slots, 1 thread, tiny model) as processes: one plain HTTP,
// one with queen, hive and worker on TLS (a throwaway CA). Rounds of 1
// and 8 concurrent streams of 64 tokens alternate between them (plain
// first, then TLS first, …); the client keeps its connections alive on
// both sides, so handshakes are paid once (the dials are reported).
// Reported: TTFT and inter-token p50/p99 on each side, TLS minus plain,
// and TLS/plain for the TTFT p50. -benchtime Nx runs N times the rounds.
//
//	go test -run '^$' -bench RelayTLS -benchtime 5x ./internal/queen/
func BenchmarkRelayTLS(b *testing.B) {
	certs := testbin.MakeTLS(b, b.TempDir(), "127.0.0.1", "localhost")
	slots := []string{"--worker-slots", "64", "--queue-size", "512"}
	plainURL, _, _ := benchClusterTLS(b, testbin.TLSFiles{}, slots, "--worker-slots", "64", "--worker-ports", "24000-24499")
	tlsURL, _, _ := benchClusterTLS(b, certs, slots, "--worker-slots", "64", "--worker-ports", "24500-24999")
	var dials [2]atomic.Int64
	client := func(side int, cfg *tls.Config) *http.Client {
		dial := (&net.Dialer{}).DialContext
		return &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256, DisableCompression: true, TLSClientConfig: cfg,
			DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				dials[side].Add(1)
				return dial(ctx, network, addr)
			}}}
	}
	plainHC := client(0, nil)
	ca, err := os.ReadFile(certs.CA)
	if err != nil {
		b.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca)
	tlsHC := client(1, &tls.Config{RootCAs: roots})
	defer plainHC.CloseIdleConnections()
	defer tlsHC.CloseIdleConnections()
	ctx := context.Background()
	const body = `{"model":"tiny","prompt":"Once upon a time","max_tokens":64,"temperature":0,"ignore_eos":true,"stream":true}`
	// The first request starts each cluster's worker; then warm both paths.
	round(ctx, b, plainHC, plainURL, body, 1, &sample{})
	round(ctx, b, tlsHC, tlsURL, body, 1, &sample{})
	for range 3 {
		round(ctx, b, plainHC, plainURL, body, 8, &sample{})
		round(ctx, b, tlsHC, tlsURL, body, 8, &sample{})
	}
	levels := []struct{ streams, rounds int }{{1, 200}, {8, 40}}
	plain, viaTLS := make([]sample, len(levels)), make([]sample, len(levels))
	warmDials := [2]int64{dials[0].Load(), dials[1].Load()}
	b.ResetTimer()
	for b.Loop() {
		for l, c := range levels {
			for i := range c.rounds {
				if i%2 == 0 {
					round(ctx, b, plainHC, plainURL, body, c.streams, &plain[l])
					round(ctx, b, tlsHC, tlsURL, body, c.streams, &viaTLS[l])
				} else {
					round(ctx, b, tlsHC, tlsURL, body, c.streams, &viaTLS[l])
					round(ctx, b, plainHC, plainURL, body, c.streams, &plain[l])
				}
			}
		}
	}
	var report []string
	ms := func(d time.Duration) string { return fmt.Sprintf("%.3f", float64(d.Microseconds())/1000) }
	for l, c := range levels {
		p, s := plain[l], viaTLS[l]
		add50, add99 := pct(s.ttft, .5)-pct(p.ttft, .5), pct(s.ttft, .99)-pct(p.ttft, .99)
		ratio := float64(pct(s.ttft, .5)) / float64(pct(p.ttft, .5))
		report = append(report, fmt.Sprintf("%d streams: TTFT p50 %s / %s ms (added %s, ratio %.3f), p99 %s / %s ms (added %s); ITL p50 %s / %s ms (added %s), p99 %s / %s ms (added %s) [plain / TLS; %d TTFT samples a side]",
			c.streams, ms(pct(p.ttft, .5)), ms(pct(s.ttft, .5)), ms(add50), ratio, ms(pct(p.ttft, .99)), ms(pct(s.ttft, .99)), ms(add99),
			ms(pct(p.itl, .5)), ms(pct(s.itl, .5)), ms(pct(s.itl, .5)-pct(p.itl, .5)), ms(pct(p.itl, .99)), ms(pct(s.itl, .99)), ms(pct(s.itl, .99)-pct(p.itl, .99)), len(p.ttft)))
		b.ReportMetric(float64(add50.Microseconds()), fmt.Sprintf("tls-added-ttft-p50-µs/%d", c.streams))
		b.ReportMetric(float64(add99.Microseconds()), fmt.Sprintf("tls-added-ttft-p99-µs/%d", c.streams))
		b.ReportMetric(ratio, fmt.Sprintf("tls/plain-ttft-p50/%d", c.streams))
	}
	report = append(report, fmt.Sprintf("client dials while measured: plain %d, TLS %d (keep-alive: 0 expected)",
		dials[0].Load()-warmDials[0], dials[1].Load()-warmDials[1]))
	b.Log("\n" + strings.Join(report, "\n"))
}
