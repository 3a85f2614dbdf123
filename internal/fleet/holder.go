package fleet

import (
	"errors"
	"syscall"
	"time"

	"github.com/apiary-llm/apiary/internal/registry"
)

// Who holds a node's pool when the fleet is about to start the node's
// hive. A queen that starts (a restart, or a standby that took over the
// database) loads the pools from the store with their last status and a
// fresh lease: a pool that was healthy looks healthy for a heartbeat
// timeout although nothing may serve it any more. The hive a queen
// started does not outlive it (its lifeline is that queen's SSH session,
// its lease that queen's heartbeats), so after a takeover the node's hive
// is the old queen's, on its way out, or gone; an operator's hive that
// follows the queens (--queen URL1,URL2) registers with the new one
// within its heartbeat interval. So a live pool that has not spoken to
// this queen since it started is no proof of an operator's hive: the
// fleet asks its endpoint. Nothing listening (connection refused, on a
// node that SSH just reached) means its hive is gone: the pool is taken
// offline (its rows FAILED) and the node gets a new hive at once. A hive
// that answers is left alone and asked again shortly, until it registers
// here (then it is an operator's: external) or ends (then the node gets
// one), for at most a heartbeat timeout plus --hive-stop-timeout after
// the queen started: the previous queen's hive has ended by then (its
// lease is a heartbeat timeout, and its cascade is what the queen allows
// a hive for it); after that the fleet starts the node's hive as for any
// pool whose lease ran out. The fleet never stops a hive it did not
// start.

// holder is what the fleet does about the node's pool before it starts
// the node's hive.
type holder int

const (
	// holderNone: no live hive holds the pool; start one.
	holderNone holder = iota
	// holderExternal: a hive this queen did not start serves the pool
	// and speaks to this queen; leave it alone.
	holderExternal
	// holderAsk: the pool is live, or was as the store kept it, but has
	// not spoken to this queen since it started; ask its endpoint.
	holderAsk
	// holderGone: nothing listens at the endpoint of a pool that has not
	// spoken to this queen; take the pool offline, then start a hive.
	holderGone
	// holderWait: a hive answers at the endpoint (or the endpoint does
	// not answer in time) but has not spoken to this queen (the previous
	// queen's, on its way out, or an operator's not yet registered here);
	// leave it alone, ask again.
	holderWait
)

// answer is what the pool's endpoint said when asked.
type answer int

const (
	notAsked answer = iota
	answered        // any HTTP answer
	refused         // connection refused: nothing listens there
	noAnswer        // anything else (a timeout, a reset)
)

// answerOf classifies the error of a ping of a hive's endpoint.
func answerOf(err error) answer {
	switch {
	case err == nil:
		return answered
	case errors.Is(err, syscall.ECONNREFUSED):
		return refused
	}
	return noAnswer
}

// holderOf decides who holds pool p (ok: the queen knows it) for a fleet
// that started at since, at now, given what its endpoint answered
// (notAsked first; holderAsk says to ask and decide again). A hive that
// has not spoken to this queen is waited for while the pool's loaded
// lease runs and, after that, until patience after since: a previous
// queen's hive ends within its lease and its cascade. It is pure.
func holderOf(p registry.Pool, ok bool, since, now time.Time, patience time.Duration, a answer) holder {
	if !ok || p.Status == registry.Offline || p.Endpoint == "" {
		return holderNone
	}
	live := p.Status == registry.Healthy || p.Status == registry.Draining
	if p.RegisteredAt.After(since) || p.LastHeartbeatAt.After(since) {
		// Its hive speaks to this queen: an operator's while it beats,
		// gone once its lease ran out.
		if live {
			return holderExternal
		}
		return holderNone
	}
	switch {
	case a == notAsked:
		return holderAsk
	case a == refused:
		return holderGone
	case live || now.Before(since.Add(patience)):
		return holderWait
	}
	// Whatever answers there so long after is no previous queen's hive
	// on its way out: start the node's as for any pool whose lease ran
	// out.
	return holderNone
}
