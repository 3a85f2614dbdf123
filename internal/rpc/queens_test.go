package rpc

import (
	"errors"
	"fmt"
	"net/http"
	"testing"

	"github.com/apiary-llm/apiary/internal/api"
)

func TestQueensFollow(t *testing.T) {
	a, b, c := "http://a:8080", "http://b:8080", "http://c:8080"
	standby := func(active string) error {
		h := http.Header{}
		if active != "" {
			h.Set(api.ActiveQueenHeader, active)
		}
		return fmt.Errorf("wrapped: %w", &StatusError{Status: http.StatusServiceUnavailable, Code: "standby", Header: h})
	}
	q := NewQueens([]string{a, b, c})
	steps := []struct {
		err   error
		moved bool
		base  string
	}{
		{fmt.Errorf("%w: connection refused", ErrUnreachable), true, b}, // no answer: the next
		{standby(c + "/"), true, c},                                     // a standby naming a listed queen: that one
		{standby("http://elsewhere:8080"), true, a},                     // naming one not listed: the next
		{standby(""), true, b},                                          // naming none: the next
		{&StatusError{Status: http.StatusNotFound}, false, b},           // an answer of the active: stay
		{errors.New("decode"), false, b},                                // another error: stay
	}
	for i, s := range steps {
		from := q.Base()
		got, moved := q.Follow(s.err)
		if moved != s.moved || q.Base() != s.base || moved && got != from {
			t.Errorf("step %d (%v): moved %v from %q to %s, want moved %v to %s", i, s.err, moved, got, q.Base(), s.moved, s.base)
		}
	}
	one := NewQueens([]string{a})
	if _, moved := one.Follow(ErrUnreachable); moved || one.Base() != a {
		t.Errorf("one queen: moved %v to %s", moved, one.Base())
	}
}
