package benchmark

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"
)

// Concurrent measures aggregate throughput: each round sends n generation
// requests at once to one side, then the same n to the other (A first in
// even rounds), and takes the completion tokens of all n over the time
// from the first request to the last answer. Same counts the rounds in
// which both sides generated the same text for every stream. Both sides
// must serve n requests at once (n slots).
func Concurrent(ctx context.Context, cfg Config, n int, a, b Side) (p Paired, same int, err error) {
	if cfg.Rounds < 1 || cfg.GenTokens < 2 || n < 1 {
		return p, 0, errors.New("Concurrent needs Rounds ≥ 1, GenTokens ≥ 2 and n ≥ 1")
	}
	if cfg.Pause == 0 {
		cfg.Pause = 300 * time.Millisecond
	}
	client := cfg.Client
	if client == nil {
		client = &http.Client{Timeout: 10 * time.Minute, Transport: &http.Transport{DisableKeepAlives: true}}
	}
	logf := cfg.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	// burst sends the round's n requests to s at once.
	burst := func(s Side, seed uint64) (float64, []string, error) {
		if err := sleep(ctx, cfg.Pause); err != nil {
			return 0, nil, err
		}
		texts := make([]string, n)
		tokens := make([]int, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		start := time.Now()
		for i := range n {
			wg.Go(func() {
				r := Request{Prompt: Words(seed+uint64(i)<<20, 8), MaxTokens: cfg.GenTokens, Extra: s.Extra}
				smp, err := Complete(ctx, client, s.URL, r)
				texts[i], tokens[i], errs[i] = smp.Text, smp.CompletionTokens, err
			})
		}
		wg.Wait()
		wall := time.Since(start).Seconds()
		if err := errors.Join(errs...); err != nil {
			return 0, nil, fmt.Errorf("%s: %w", s.Name, err)
		}
		total := 0
		for _, t := range tokens {
			total += t
		}
		return float64(total) / wall, texts, nil
	}
	sides := [2]Side{a, b}
	for _, s := range sides { // warm-up
		if _, _, err := burst(s, 1<<40); err != nil {
			return p, 0, fmt.Errorf("warm-up: %w", err)
		}
	}
	for r := range cfg.Rounds {
		i := cfg.FirstRound + r
		order := []int{0, 1}
		if i%2 == 1 {
			order = []int{1, 0}
		}
		var rate [2]float64
		var texts [2][]string
		for _, k := range order {
			if rate[k], texts[k], err = burst(sides[k], uint64(i+1)<<8); err != nil {
				return p, same, err
			}
		}
		p.Add(rate[0], rate[1])
		equal := true
		for j := range n {
			equal = equal && texts[0][j] == texts[1][j]
		}
		if equal {
			same++
		}
		logf("%d streams, round %d: %s %.1f tok/s, %s %.1f tok/s (%.3f), same text: %v", n, i+1, a.Name, rate[0], b.Name, rate[1], rate[1]/rate[0], equal)
	}
	return p, same, nil
}
