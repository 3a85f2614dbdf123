package dashboard

import (
	"sync"
	"time"
)

// Counts are one model's running totals since start: what Window turns
// into rates over the last minutes.
type Counts struct {
	Requests  uint64
	Tokens    uint64
	TTFTCount uint64
	TTFTSum   float64 // seconds
	ITLCount  uint64
	ITLSum    float64 // seconds
}

// Window keeps, per model, what happened in each of the last Buckets
// intervals of Step: requests, tokens, the mean time to first token and
// the mean time between tokens. It is fed the running totals every Step
// (Sample) and keeps the differences; memory is bounded by the models
// times Buckets.
type Window struct {
	Step    time.Duration
	Buckets int

	mu      sync.Mutex
	started bool                // guarded by mu; the baseline is taken
	prev    map[string]Counts   // guarded by mu; the totals at the last sample
	series  map[string][]bucket // guarded by mu; oldest first, each of length n
	n       int                 // guarded by mu; buckets kept, at most Buckets
	end     time.Time           // guarded by mu; the last bucket's end
}

type bucket struct {
	requests, tokens uint64
	ttftN, itlN      uint64
	ttftSum, itlSum  float64
}

// NewWindow keeps buckets intervals of step.
func NewWindow(step time.Duration, buckets int) *Window {
	return &Window{Step: step, Buckets: buckets, prev: map[string]Counts{}, series: map[string][]bucket{}}
}

// Sample records the totals at now: the bucket that ends at now holds
// what changed since the last sample. The first sample only takes the
// baseline. A model's totals that went down (its counters started over)
// count from zero.
func (w *Window) Sample(now time.Time, totals map[string]Counts) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.started {
		w.started, w.prev, w.end = true, totals, now
		return
	}
	for model := range totals {
		if _, ok := w.series[model]; !ok {
			w.series[model] = make([]bucket, w.n) // nothing before it was seen
		}
	}
	keep := min(w.n+1, w.Buckets)
	for model, s := range w.series {
		var b bucket
		if c, ok := totals[model]; ok {
			p := w.prev[model]
			if c.Requests < p.Requests || c.Tokens < p.Tokens || c.TTFTCount < p.TTFTCount || c.ITLCount < p.ITLCount {
				p = Counts{}
			}
			b = bucket{requests: c.Requests - p.Requests, tokens: c.Tokens - p.Tokens,
				ttftN: c.TTFTCount - p.TTFTCount, ttftSum: c.TTFTSum - p.TTFTSum,
				itlN: c.ITLCount - p.ITLCount, itlSum: c.ITLSum - p.ITLSum}
		}
		s = append(s, b)
		s = s[len(s)-keep:]
		if _, ok := totals[model]; !ok && idle(s) {
			delete(w.series, model) // gone, and nothing left in the window
			continue
		}
		w.series[model] = s
	}
	w.n, w.prev, w.end = keep, totals, now
}

func idle(s []bucket) bool {
	for _, b := range s {
		if b != (bucket{}) {
			return false
		}
	}
	return true
}

// Series is one model's buckets as the page draws them, oldest first:
// per second rates and mean latencies in milliseconds (null where no
// stream ended a token in the bucket).
type Series struct {
	Requests []float64  `json:"requests_per_s"`
	Tokens   []float64  `json:"tokens_per_s"`
	TTFT     []*float64 `json:"ttft_ms"`
	ITL      []*float64 `json:"itl_ms"`
}

// View is the window for the page.
type View struct {
	StepSeconds float64           `json:"step_s"`
	Buckets     int               `json:"buckets"` // the most buckets a series has: the window is Buckets × StepSeconds
	End         time.Time         `json:"end"`
	Models      map[string]Series `json:"models"`
}

// View returns the window's buckets.
func (w *Window) View() View {
	w.mu.Lock()
	defer w.mu.Unlock()
	v := View{StepSeconds: w.Step.Seconds(), Buckets: w.Buckets, Models: map[string]Series{}}
	v.End = w.end
	step := w.Step.Seconds()
	for model, s := range w.series {
		var out Series
		for _, b := range s {
			out.Requests = append(out.Requests, float64(b.requests)/step)
			out.Tokens = append(out.Tokens, float64(b.tokens)/step)
			out.TTFT = append(out.TTFT, mean(b.ttftSum, b.ttftN))
			out.ITL = append(out.ITL, mean(b.itlSum, b.itlN))
		}
		v.Models[model] = out
	}
	return v
}

func mean(sum float64, n uint64) *float64 {
	if n == 0 {
		return nil
	}
	ms := sum / float64(n) * 1000
	return &ms
}
