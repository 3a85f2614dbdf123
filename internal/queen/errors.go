package queen

import (
	"errors"
	"fmt"
	"net/http"
	"slices"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/fleet"
	"github.com/apiary-llm/apiary/internal/registry"
	"github.com/apiary-llm/apiary/internal/routing"
	"github.com/apiary-llm/apiary/internal/store"
)

// Sentinel errors. Handlers return them wrapped with %w; writeError maps
// each to a status and a snake_case code once.
var (
	ErrUnauthorized     = errors.New("queen: unauthorized")
	ErrRowNotFound      = errors.New("queen: no such lifecycle row")
	ErrRowEnded         = errors.New("queen: worker has ended")
	ErrNotStarted       = errors.New("queen: the hive has not accepted the worker yet")
	ErrPoolUnavailable  = errors.New("queen: pool is not available")
	ErrNoPool           = routing.ErrNoPool // a start without pool_id found none
	ErrRefused          = errors.New("queen: transition refused")
	ErrHiveUnreachable  = errors.New("queen: hive unreachable")
	ErrShuttingDown     = errors.New("queen: shutting down")
	errMethodNotAllowed = errors.New("queen: method not allowed")
)

// HiveError is a hive's refusal, with the status and code it answered.
type HiveError struct {
	Status  int
	Code    string
	Message string
}

func (e *HiveError) Error() string {
	return fmt.Sprintf("hive answered %d %s: %s", e.Status, e.Code, e.Message)
}

// statusOf maps an error to its HTTP status and code.
func statusOf(err error) (int, string) {
	var re *api.RequestError
	var he *HiveError
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &re):
		return re.Status, re.Code
	case errors.As(err, &mbe):
		return http.StatusRequestEntityTooLarge, "body_too_large"
	case errors.Is(err, ErrUnauthorized):
		return http.StatusUnauthorized, "unauthorized"
	case errors.Is(err, registry.ErrNotFound):
		return http.StatusNotFound, "pool_not_found"
	case errors.Is(err, registry.ErrOffline):
		return http.StatusGone, "pool_offline"
	case errors.Is(err, ErrRowNotFound):
		return http.StatusNotFound, "worker_not_found"
	case errors.Is(err, ErrRowEnded):
		return http.StatusConflict, "worker_ended"
	case errors.Is(err, ErrNotStarted):
		return http.StatusConflict, "worker_not_started"
	case errors.Is(err, ErrPoolUnavailable):
		return http.StatusConflict, "pool_unavailable"
	case errors.Is(err, ErrRefused):
		return http.StatusConflict, "transition_refused"
	case errors.Is(err, ErrNoPool):
		return http.StatusServiceUnavailable, "no_pool_available"
	case errors.Is(err, ErrShuttingDown), errors.Is(err, registry.ErrClosed), errors.Is(err, fleet.ErrStopping):
		return http.StatusServiceUnavailable, "shutting_down"
	case errors.As(err, &he):
		// The hive's own refusal (model_not_found, insufficient_memory, …)
		// reaches the operator with its status; a hive failing is a bad
		// gateway.
		if he.Status >= 400 && he.Status < 500 || he.Status == http.StatusInsufficientStorage {
			return he.Status, he.Code
		}
		return http.StatusBadGateway, "hive_error"
	case errors.Is(err, ErrHiveUnreachable):
		return http.StatusBadGateway, "hive_unreachable"
	case errors.Is(err, errMethodNotAllowed):
		return http.StatusMethodNotAllowed, "method_not_allowed"
	case errors.Is(err, store.ErrLocked):
		return http.StatusServiceUnavailable, "store_locked"
	}
	return http.StatusInternalServerError, "internal_error"
}

// writeError answers {"error":{"code","message"}}. Internal errors say
// only that something failed; the log has the details.
func writeError(w http.ResponseWriter, err error) {
	status, code := statusOf(err)
	msg := err.Error()
	if status == http.StatusInternalServerError {
		msg = "internal error; see the queen's log"
	}
	api.WriteError(w, status, code, msg)
}

func sortedStrings(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}
