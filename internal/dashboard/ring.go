package dashboard

// Ring keeps the last n values added, oldest first: the dashboard's
// recent requests and its per-node samples. Memory is bounded by n from
// the start. It is not safe for concurrent use: its owner guards it.
type Ring[T any] struct {
	buf  []T
	next int  // where the next value goes
	full bool // buf has wrapped: every slot holds a value
}

// NewRing keeps the last n values (n ≥ 1).
func NewRing[T any](n int) *Ring[T] { return &Ring[T]{buf: make([]T, max(n, 1))} }

// Add appends v, dropping the oldest value when the ring is full.
func (r *Ring[T]) Add(v T) {
	r.buf[r.next] = v
	r.next++
	if r.next == len(r.buf) {
		r.next, r.full = 0, true
	}
}

// Len is the number of values kept.
func (r *Ring[T]) Len() int {
	if r.full {
		return len(r.buf)
	}
	return r.next
}

// Cap is the most values kept.
func (r *Ring[T]) Cap() int { return len(r.buf) }

// Last returns the newest value; ok is false when there is none.
func (r *Ring[T]) Last() (v T, ok bool) {
	if r.Len() == 0 {
		return v, false
	}
	return r.buf[(r.next+len(r.buf)-1)%len(r.buf)], true
}

// All returns the values, oldest first, in a new slice.
func (r *Ring[T]) All() []T {
	if !r.full {
		return append([]T(nil), r.buf[:r.next]...)
	}
	out := make([]T, 0, len(r.buf))
	out = append(out, r.buf[r.next:]...)
	return append(out, r.buf[:r.next]...)
}
