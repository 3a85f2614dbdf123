// The benchmarks' helpers: streams timed to the token, CPU time of a
// process, percentiles. The benchmarks of apiary processes are built
// !race (as the process tests are: under the race detector only this
// test binary, not the daemons, would be checked); the in-process ones
// use these too.
package queen

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// cpuTime is the time pid's threads have run on a CPU
// (/proc/<pid>/task/*/schedstat), to the nanosecond.
func cpuTime(b *testing.B, pid int) time.Duration {
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	if err != nil || len(tasks) == 0 {
		b.Fatalf("cpu time of pid %d: %v (no task)", pid, err)
	}
	var sum time.Duration
	for _, t := range tasks {
		data, err := os.ReadFile(t)
		if err != nil {
			continue // the thread ended
		}
		var ns int64
		if _, err := fmt.Sscan(string(data), &ns); err != nil {
			b.Fatalf("%s: %q: %v", t, data, err)
		}
		sum += time.Duration(ns)
	}
	return sum
}

// chatDirect sends the n chat requests of batchFile(n, maxTokens) to
// /v1/chat/completions all at once, as a client at full concurrency does,
// and returns when every one has answered 200.
func chatDirect(b *testing.B, hc *http.Client, qURL string, n, maxTokens int) {
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			body := fmt.Sprintf(`{"model":"tiny","messages":[{"role":"user","content":"Tell me about %d"}],"max_tokens":%d,"temperature":0,"ignore_eos":true}`, i, maxTokens)
			resp, err := hc.Post(qURL+"/v1/chat/completions", "application/json", strings.NewReader(body))
			if err != nil {
				b.Error(err)
				return
			}
			defer resp.Body.Close()
			if _, err := io.Copy(io.Discard, resp.Body); err != nil || resp.StatusCode != http.StatusOK {
				b.Errorf("chat completion %d: %d %v", i, resp.StatusCode, err)
			}
		})
	}
	wg.Wait()
}

func poolName(i int) string { return fmt.Sprintf("pool-%05d", i) }

// sample collects latencies of one side.
type sample struct{ ttft, itl []time.Duration }

// round runs n concurrent streams against base and adds their times to s.
func round(ctx context.Context, b *testing.B, hc *http.Client, base, body string, n int, s *sample) {
	roundAs(ctx, b, hc, base, "", body, n, s)
}

func pct(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(p*float64(len(s))))]
}

// roundAs is round with token as the bearer token (a worker's, to ask it
// straight).
func roundAs(ctx context.Context, b *testing.B, hc *http.Client, base, token, body string, n int, s *sample) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			ttft, gaps, err := streamTimes(ctx, hc, base, token, body)
			if err != nil {
				b.Error(err)
				return
			}
			mu.Lock()
			s.ttft = append(s.ttft, ttft)
			s.itl = append(s.itl, gaps...)
			mu.Unlock()
		})
	}
	wg.Wait()
}

// streamTimes sends one streamed completion to base (with token as its
// bearer token when set: a worker asked straight needs its own) and
// returns the time to its first event and the gaps between its events.
func streamTimes(ctx context.Context, hc *http.Client, base, token, body string) (time.Duration, []time.Duration, error) {
	return streamTimesAt(ctx, hc, base, "/v1/completions", token, body)
}

// streamTimesAt is streamTimes for the streamed endpoint path (e.g.
// /v1/chat/completions). An answer other than 200 is an error naming its
// status.
func streamTimesAt(ctx context.Context, hc *http.Client, base, path, token, body string) (time.Duration, []time.Duration, error) {
	start := time.Now()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+path, strings.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, nil, fmt.Errorf("%s answered %d", base, resp.StatusCode)
	}
	br := bufio.NewReaderSize(resp.Body, 32<<10)
	var ttft time.Duration
	var gaps []time.Duration
	var last time.Time
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			return ttft, gaps, fmt.Errorf("stream from %s ended without [DONE]: %w", base, err)
		}
		if !bytes.HasPrefix(line, []byte("data: ")) {
			continue
		}
		if bytes.HasPrefix(line, []byte("data: [DONE]")) {
			// Read to the end, or the transport closes the connection
			// instead of keeping it for the next request.
			_, _ = io.Copy(io.Discard, br)
			return ttft, gaps, nil
		}
		now := time.Now()
		if last.IsZero() {
			ttft = now.Sub(start)
		} else {
			gaps = append(gaps, now.Sub(last))
		}
		last = now
	}
}
