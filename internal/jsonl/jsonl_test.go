package jsonl

import (
	"errors"
	"io"
	"strings"
	"testing"
)

func TestNext(t *testing.T) {
	long := strings.Repeat("x", 40)
	r := NewReader(strings.NewReader("{}\n"+long+"\n\n{\"a\":1}\n"), 16, 64)
	for _, want := range []string{"{}", long, "", `{"a":1}`} {
		got, err := r.Next()
		if err != nil || string(got) != want {
			t.Fatalf("Next = %q, %v; want %q", got, err, want)
		}
	}
	if _, err := r.Next(); !errors.Is(err, io.EOF) {
		t.Fatalf("after the last line: %v, want io.EOF", err)
	}
}

func TestNextRefusesALongLine(t *testing.T) {
	r := NewReader(strings.NewReader(strings.Repeat("x", 65)+"\n"), 16, 64)
	if _, err := r.Next(); !errors.Is(err, ErrTooLong) {
		t.Fatalf("a 66-byte line with a bound of 64: %v, want ErrTooLong", err)
	}
	// The bound counts the newline: a 63-byte line fits.
	r = NewReader(strings.NewReader(strings.Repeat("y", 63)+"\n"), 16, 64)
	if got, err := r.Next(); err != nil || len(got) != 63 {
		t.Fatalf("a 64-byte line with a bound of 64: %d bytes, %v", len(got), err)
	}
}

func TestNextCutLine(t *testing.T) {
	r := NewReader(strings.NewReader("{}\n{\"a\""), 16, 64)
	if _, err := r.Next(); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Next(); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("a stream that ends inside a line: %v, want io.ErrUnexpectedEOF", err)
	}
}
