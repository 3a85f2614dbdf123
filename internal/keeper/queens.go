package keeper

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/rpc"
	"github.com/apiary-llm/apiary/internal/transport"
)

// queens are the queens a Client talks to: one URL, or several sharing
// one PostgreSQL database (--queen URL1,URL2, APIARY_QUEEN), of which one
// is active and the others stand by. Each call goes to the active one: a
// queen that refuses the connection or answers as a standby is skipped,
// and the active queen a standby names is tried next, listed or not.
type queens struct {
	list string   // as given, for errors
	urls []string // checked (transport.BaseURLs)
	bad  error    // the list is malformed: every call fails with it

	mu     sync.Mutex
	active string // guarded by mu: the queen that answered last; "" none yet
}

func newQueens(list string) *queens {
	urls, err := transport.BaseURLs("--queen", list)
	if err != nil {
		return &queens{list: list, bad: usage{err}}
	}
	return &queens{list: list, urls: urls}
}

// errStandby is a standby queen's refusal: 503 naming the active queen
// (api.ActiveQueenHeader, or "active" in /health's answer), or code
// "standby".
type errStandby struct{ active string }

func (e *errStandby) Error() string {
	if e.active == "" {
		return "a standby, naming no active queen yet"
	}
	return "a standby; the active queen is " + e.active
}

// standbyAnswer reads a 503 answer as a standby's refusal; nil when it is
// not one.
func standbyAnswer(status int, h http.Header, body []byte) *errStandby {
	if status != http.StatusServiceUnavailable {
		return nil
	}
	var shape struct {
		Status string `json:"status"`
		Active string `json:"active"`
		Error  struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	_ = json.Unmarshal(body, &shape)
	active := h.Get(api.ActiveQueenHeader)
	if active == "" && shape.Status == "standby" {
		active = shape.Active
	}
	if active == "" && shape.Status != "standby" && shape.Error.Code != "standby" {
		return nil
	}
	return &errStandby{active: active}
}

// codeNotActive is the error code of a queen that lost the database's
// lock and steps down (store.ErrLockLost): nothing was written.
const codeNotActive = "not_active_queen"

// notSent reports whether err says the request never left: the connection
// could not be made (refused, no such host, no route) or its TLS
// handshake failed, so no queen can have carried it out.
func notSent(err error) bool {
	var op *net.OpError
	var cve *tls.CertificateVerificationError
	var rhe tls.RecordHeaderError
	return errors.As(err, &op) && op.Op == "dial" || errors.As(err, &cve) || errors.As(err, &rhe)
}

// tried is one queen a call went to, and why it went on.
type tried struct {
	url string
	err error
}

func (t tried) String() string {
	var sb *errStandby
	if errors.As(t.err, &sb) {
		return t.url + ": " + sb.Error()
	}
	if why, ok := rpc.NetReason(t.err); ok {
		return t.url + ": " + why
	}
	return t.url + ": " + t.err.Error()
}

// call runs try against the queens until one answers as the active:
// first the one that answered last, then the list in order, with the
// active queen a standby names moved to the front. try returns a
// *errStandby for a standby's answer and an error wrapping
// rpc.ErrUnreachable when no answer came; any other result is the
// active queen's answer, returned as it is. A request that may have
// reached a queen (sent, then no answer) is sent to no other unless safe
// (it changes nothing: GET): the queen may have carried it out. hint adds
// how to start or name a queen to an error of unreachable queens.
func (qs *queens) call(ctx context.Context, safe, hint bool, try func(base string) error) error {
	if qs.bad != nil {
		return qs.bad
	}
	qs.mu.Lock()
	next := slices.Clone(qs.urls)
	if qs.active != "" {
		next = append([]string{qs.active}, slices.DeleteFunc(next, func(u string) bool { return u == qs.active })...)
	}
	qs.mu.Unlock()
	var done []tried
	for len(next) > 0 {
		base := next[0]
		next = next[1:]
		err := try(base)
		var sb *errStandby
		var ae *APIError
		switch {
		case err == nil:
		case errors.As(err, &sb):
			done = append(done, tried{base, err})
			if a, ok := qs.advertised(sb.active, done); ok {
				next = append([]string{a}, slices.DeleteFunc(next, func(u string) bool { return u == a })...)
			}
			continue
		case ctx.Err() != nil:
			return err
		case errors.Is(err, rpc.ErrUnreachable):
			done = append(done, tried{base, err})
			if safe || notSent(err) {
				continue
			}
			return qs.maybeDone(base, err, done)
		case safe && errors.As(err, &ae) && ae.Code == codeNotActive:
			// A queen that lost the database and steps down.
			done = append(done, tried{base, err})
			continue
		}
		// The active queen's answer, a success or its error.
		qs.mu.Lock()
		qs.active = base
		qs.mu.Unlock()
		return err
	}
	return qs.noActive(done, hint)
}

// advertised is the active queen a standby named, checked, unless it was
// tried already.
func (qs *queens) advertised(active string, done []tried) (string, bool) {
	if active == "" {
		return "", false
	}
	u, err := transport.CheckBaseURL("the active queen", active)
	if err != nil {
		return "", false
	}
	a := strings.TrimSuffix(u.String(), "/")
	for _, d := range done {
		if d.url == a {
			return "", false
		}
	}
	return a, true
}

// noActive is the error of a call that no queen took: every queen tried
// and why. It wraps ErrUnreachable.
func (qs *queens) noActive(done []tried, hint bool) error {
	if len(done) == 1 && !errors.As(done[0].err, new(*errStandby)) {
		return unreachable(done[0].url, done[0].err, hint)
	}
	parts := make([]string, len(done))
	var errs []error
	standby := false
	for i, d := range done {
		parts[i] = d.String()
		errs = append(errs, d.err)
		standby = standby || errors.As(d.err, new(*errStandby))
	}
	msg := fmt.Sprintf("%s: no active queen answers at --queen %s (tried %s)", ErrUnreachable, qs.list, strings.Join(parts, "; "))
	switch {
	case hint && standby:
		msg += "; a standby takes over within seconds of the active queen's end: try again, or point --queen / APIARY_QUEEN at the active queen"
	case hint:
		msg += " (start one with `apiary queen`, or point --queen / APIARY_QUEEN at one)"
	}
	return &unreachableError{msg: msg, err: errors.Join(errs...)}
}

// maybeDone is the error of a request that reached base, which gave no
// answer: it is sent to no other queen.
func (qs *queens) maybeDone(base string, err error, done []tried) error {
	why, ok := rpc.NetReason(err)
	if !ok {
		why = err.Error()
	}
	msg := fmt.Sprintf("%s at %s: %s after the request was sent; it was not sent to another queen, as this one may have carried it out: check with apiary audit before you repeat it",
		ErrUnreachable, base, why)
	if len(done) > 1 {
		parts := make([]string, len(done)-1)
		for i, d := range done[:len(done)-1] {
			parts[i] = d.String()
		}
		msg += " (tried before: " + strings.Join(parts, "; ") + ")"
	}
	return &unreachableError{msg: msg, err: err}
}
