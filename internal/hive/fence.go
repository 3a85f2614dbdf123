package hive

import (
	"fmt"
	"net/http"
	"strconv"

	"github.com/apiary-llm/apiary/internal/api"
)

// Commands from queens are fenced by the queens' epoch: a queen on
// PostgreSQL sends its fencing epoch with every command
// (api.QueenEpochHeader) and in its heartbeat answers
// (api.HeartbeatAnswer.QueenEpoch). The hive keeps the newest it has
// seen and refuses a command of an older one: that queen was deposed and
// has not noticed yet, and must not stop the new active's workers. A
// command without the header (a queen on SQLite, an operator's tool) is
// not fenced.

// seeQueenEpoch raises the newest epoch seen to e.
func (h *Hive) seeQueenEpoch(e int64) {
	for {
		cur := h.queenEpoch.Load()
		if e <= cur || h.queenEpoch.CompareAndSwap(cur, e) {
			return
		}
	}
}

// checkQueenEpoch refuses a request of an older epoch than the newest
// seen (409 stale_queen), and learns a newer one.
func (h *Hive) checkQueenEpoch(r *http.Request) error {
	v := r.Header.Get(api.QueenEpochHeader)
	if v == "" {
		return nil
	}
	e, err := strconv.ParseInt(v, 10, 64)
	if err != nil || e < 1 {
		return api.BadRequest("%s %q: want a positive whole number", api.QueenEpochHeader, v)
	}
	if newest := h.queenEpoch.Load(); e < newest {
		h.log.Warn("refused a command of a deposed queen", "method", r.Method, "path", r.URL.Path, "epoch", e, "newest_epoch", newest)
		return fmt.Errorf("%w: its fencing epoch %d is older than epoch %d, which this hive has seen; the active queen holds the newer one",
			ErrStaleQueen, e, newest)
	}
	h.seeQueenEpoch(e)
	return nil
}
