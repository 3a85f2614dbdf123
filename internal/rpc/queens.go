package rpc

import (
	"errors"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/apiary-llm/apiary/internal/api"
)

// Queens is the list of queens a hive or a worker run by hand speaks to
// (--queen URL1,URL2: queens sharing one PostgreSQL database, one of them
// active, the others standing by), and the one it speaks to now.
type Queens struct {
	urls []string // checked base URLs (transport.BaseURLs), at least one
	cur  atomic.Int32
}

// NewQueens follows urls, from the first.
func NewQueens(urls []string) *Queens { return &Queens{urls: urls} }

// Base is the URL of the queen spoken to now.
func (q *Queens) Base() string { return q.urls[int(q.cur.Load())%len(q.urls)] }

// Follow moves to another queen of the list after err from the one
// spoken to: no answer (ErrUnreachable), or a 503 (*StatusError: a
// standby, or a queen stepping down). A standby that names the active
// queen (api.ActiveQueenHeader), one of the list, sends it there;
// otherwise it goes to the next. It returns the queen it left and whether
// it moved; with one queen, or after another error, it stays.
func (q *Queens) Follow(err error) (from string, moved bool) {
	var se *StatusError
	answered := errors.As(err, &se)
	if len(q.urls) < 2 || !(errors.Is(err, ErrUnreachable) || answered && se.Status == http.StatusServiceUnavailable) {
		return "", false
	}
	from = q.Base()
	next := int(q.cur.Load()) + 1
	if answered {
		if active := strings.TrimSuffix(se.Header.Get(api.ActiveQueenHeader), "/"); active != "" {
			if i := slices.Index(q.urls, active); i >= 0 {
				next = i
			}
		}
	}
	q.cur.Store(int32(next % len(q.urls)))
	return from, true
}

// Len is the number of queens.
func (q *Queens) Len() int { return len(q.urls) }
