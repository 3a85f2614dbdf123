package fleet

import (
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/registry"
)

// Who holds a node's pool, from the pool as the queen knows it, when the
// fleet started, and what the pool's endpoint answered: a pool loaded
// from the store that has not spoken to this queen is no proof of an
// operator's hive (a takeover regression: the new active took the old
// queen's hive for one and left the node without a hive for a heartbeat
// timeout).
func TestHolderOf(t *testing.T) {
	since := time.Date(2026, 11, 27, 20, 0, 0, 0, time.UTC)
	before, after := since.Add(-time.Minute), since.Add(time.Second)
	const patience = 30 * time.Second // heartbeat timeout + hive stop timeout
	soon, late := since.Add(5*time.Second), since.Add(patience+time.Second)
	pool := func(status registry.Status, registered, beat time.Time) registry.Pool {
		return registry.Pool{ID: "n1", Endpoint: "http://10.0.0.2:9200", Status: status, RegisteredAt: registered, LastHeartbeatAt: beat}
	}
	for _, tc := range []struct {
		name string
		p    registry.Pool
		ok   bool
		now  time.Time
		a    answer
		want holder
	}{
		{"unknown pool", registry.Pool{}, false, soon, notAsked, holderNone},
		{"offline", pool(registry.Offline, before, before), true, soon, notAsked, holderNone},
		{"no endpoint", registry.Pool{ID: "n1", Status: registry.Healthy}, true, soon, notAsked, holderNone},
		{"registered here, healthy", pool(registry.Healthy, after, after), true, soon, notAsked, holderExternal},
		{"beat here, draining", pool(registry.Draining, before, after), true, soon, notAsked, holderExternal},
		{"registered here, lease ran out", pool(registry.Unhealthy, after, after), true, soon, notAsked, holderNone},
		{"loaded healthy: ask", pool(registry.Healthy, before, before), true, soon, notAsked, holderAsk},
		{"loaded unhealthy: ask", pool(registry.Unhealthy, before, before), true, soon, notAsked, holderAsk},
		{"loaded healthy, refused", pool(registry.Healthy, before, before), true, soon, refused, holderGone},
		{"loaded unhealthy, refused", pool(registry.Unhealthy, before, before), true, soon, refused, holderGone},
		{"loaded healthy, answered", pool(registry.Healthy, before, before), true, soon, answered, holderWait},
		{"loaded unhealthy, answered", pool(registry.Unhealthy, before, before), true, soon, answered, holderWait},
		{"loaded unhealthy, answered, past patience", pool(registry.Unhealthy, before, before), true, late, answered, holderNone},
		{"loaded healthy, answered, past patience", pool(registry.Healthy, before, before), true, late, answered, holderWait},
		{"loaded healthy, no answer", pool(registry.Healthy, before, before), true, soon, noAnswer, holderWait},
		{"loaded unhealthy, no answer", pool(registry.Unhealthy, before, before), true, soon, noAnswer, holderWait},
		{"loaded unhealthy, no answer, past patience", pool(registry.Unhealthy, before, before), true, late, noAnswer, holderNone},
		{"loaded unhealthy, refused, past patience", pool(registry.Unhealthy, before, before), true, late, refused, holderGone},
	} {
		if got := holderOf(tc.p, tc.ok, since, tc.now, patience, tc.a); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
}

// A refused connection, however wrapped, is refused; a timeout or any
// other failure is no answer.
func TestAnswerOf(t *testing.T) {
	refusedErr := fmt.Errorf("no answer: GET http://x/health: %w",
		&net.OpError{Op: "dial", Net: "tcp", Err: &os.SyscallError{Syscall: "connect", Err: syscall.ECONNREFUSED}})
	for _, tc := range []struct {
		err  error
		want answer
	}{
		{nil, answered},
		{refusedErr, refused},
		{&net.OpError{Op: "dial", Net: "tcp", Err: os.ErrDeadlineExceeded}, noAnswer},
		{errors.New("queen: this hive client cannot ping a hive"), noAnswer},
	} {
		if got := answerOf(tc.err); got != tc.want {
			t.Errorf("answerOf(%v) = %d, want %d", tc.err, got, tc.want)
		}
	}
}
