package benchmark

import (
	"slices"
)

// Median of xs; 0 for none. xs is not changed.
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// Paired holds one metric measured on both sides, one value a round each:
// A[i] and B[i] come from the same round.
type Paired struct {
	A, B []float64
}

// Add records one round.
func (p *Paired) Add(a, b float64) {
	p.A = append(p.A, a)
	p.B = append(p.B, b)
}

// Ratios are B[i]/A[i] for the rounds where A[i] is not 0.
func (p Paired) Ratios() []float64 {
	var r []float64
	for i := range min(len(p.A), len(p.B)) {
		if p.A[i] != 0 {
			r = append(r, p.B[i]/p.A[i])
		}
	}
	return r
}

// Summary is what the report shows of a Paired.
type Summary struct {
	MedianA, MedianB float64
	// Ratio is the median of the per-round ratios B/A; RatioMin and
	// RatioMax their range.
	Ratio, RatioMin, RatioMax float64
	Rounds                    int
}

// Summary computes the medians and the paired ratio.
func (p Paired) Summary() Summary {
	r := p.Ratios()
	s := Summary{MedianA: Median(p.A), MedianB: Median(p.B), Ratio: Median(r), Rounds: len(r)}
	if len(r) > 0 {
		s.RatioMin, s.RatioMax = slices.Min(r), slices.Max(r)
	}
	return s
}
