package dashboard

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestRingKeepsTheLastN(t *testing.T) {
	r := NewRing[int](3)
	if _, ok := r.Last(); ok || r.Len() != 0 || len(r.All()) != 0 {
		t.Fatalf("an empty ring: len %d, all %v", r.Len(), r.All())
	}
	for i := 1; i <= 2; i++ {
		r.Add(i)
	}
	if diff := cmp.Diff([]int{1, 2}, r.All()); diff != "" {
		t.Fatalf("two values (-want +got):\n%s", diff)
	}
	for i := 3; i <= 1000; i++ {
		r.Add(i)
		if r.Len() > r.Cap() || r.Cap() != 3 {
			t.Fatalf("after %d values: len %d, cap %d", i, r.Len(), r.Cap())
		}
	}
	if diff := cmp.Diff([]int{998, 999, 1000}, r.All()); diff != "" {
		t.Fatalf("after 1000 values (-want +got):\n%s", diff)
	}
	if last, ok := r.Last(); !ok || last != 1000 {
		t.Fatalf("last = %d, %v; want 1000", last, ok)
	}
	if NewRing[int](0).Cap() != 1 {
		t.Fatal("a ring of 0 keeps nothing; want at least 1")
	}
}
