package api

import (
	"net/url"
	"strconv"
	"strings"
)

// Worker logs: a hive's GET /v2/workers/{worker_id}/logs and the queen's
// GET /api/admin/workers/{id}/logs (by lifecycle id) take the same query:
//
//	tail=N    the last N lines (1 to MaxLogTail); absent: all that fits
//	          in MaxLogBytes
//	follow=1  then every new line as the worker writes it, until the
//	          worker ends or the client goes away
//
// The answer is text/plain: the worker's interleaved stdout and stderr, as
// it wrote them.
const (
	// MaxLogTail bounds tail.
	MaxLogTail = 10000
	// MaxLogBytes bounds what is sent before following: the end of the log,
	// whole lines, at most this many bytes.
	MaxLogBytes = 1 << 20
)

// LogQuery is what a logs request asks for.
type LogQuery struct {
	Tail   int  // 0: all that fits in MaxLogBytes
	Follow bool // keep streaming until the worker ends
}

// ParseLogQuery reads tail and follow of a logs request; a bad value is a
// 400 naming it.
func ParseLogQuery(tail, follow string) (LogQuery, error) {
	var q LogQuery
	if tail != "" {
		n, err := strconv.Atoi(tail)
		if err != nil || n < 1 || n > MaxLogTail {
			return q, BadRequest("tail %q: want a number of lines from 1 to %d", Printable(tail, 40), MaxLogTail)
		}
		q.Tail = n
	}
	switch strings.ToLower(follow) {
	case "", "0", "false":
	case "1", "true":
		q.Follow = true
	default:
		return q, BadRequest("follow %q: want 1 or 0", Printable(follow, 40))
	}
	return q, nil
}

// Encode is q as a URL query ("" when empty).
func (q LogQuery) Encode() string {
	v := url.Values{}
	if q.Tail > 0 {
		v.Set("tail", strconv.Itoa(q.Tail))
	}
	if q.Follow {
		v.Set("follow", "1")
	}
	return v.Encode()
}
