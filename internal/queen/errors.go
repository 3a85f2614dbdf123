package queen

import (
	"fmt"
	"net/http"
	"slices"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/openai"
	"github.com/apiary-llm/apiary/internal/routing"
)

// Sentinel errors, each with the status and code it is answered with
// (openai.Coded); handlers return them wrapped with %w, and writeError
// answers the status and code found with one errors.As.
var (
	ErrUnauthorized      = openai.Sentinel(http.StatusUnauthorized, "unauthorized", "unauthorized")
	ErrRowNotFound       = openai.Sentinel(http.StatusNotFound, "worker_not_found", "no such lifecycle row")
	ErrRowEnded          = openai.Sentinel(http.StatusConflict, "worker_ended", "worker has ended")
	ErrNotStarted        = openai.Sentinel(http.StatusConflict, "worker_not_started", "the hive has not accepted the worker yet")
	ErrPoolUnavailable   = openai.Sentinel(http.StatusConflict, "pool_unavailable", "pool is not available")
	ErrNoPool            = routing.ErrNoPool // a start without pool_id found none
	ErrRefused           = openai.Sentinel(http.StatusConflict, "transition_refused", "transition refused")
	ErrHiveUnreachable   = openai.Sentinel(http.StatusBadGateway, "hive_unreachable", "hive unreachable")
	ErrClaimRefused      = openai.Sentinel(http.StatusConflict, "claim_refused", "claim refused")
	ErrClaimUnverified   = openai.Sentinel(http.StatusUnprocessableEntity, "claim_unverified", "the claiming worker could not be verified")
	ErrWorkerUnreachable = openai.Sentinel(http.StatusBadGateway, "worker_unreachable", "worker unreachable")
	ErrModelConfigured   = openai.Sentinel(http.StatusConflict, "model_configured", "the model's replicas are set in the model config")
	ErrShuttingDown      = openai.Sentinel(http.StatusServiceUnavailable, "shutting_down", "shutting down")
	// ErrSteppedDown: the queen lost the database's lock and answers as
	// a standby (the standby's code) while it stops.
	ErrSteppedDown      = openai.Sentinel(http.StatusServiceUnavailable, "standby", "this queen stepped down (it lost the database's lock); another queen takes over")
	errMethodNotAllowed = openai.Sentinel(http.StatusMethodNotAllowed, "method_not_allowed", "method not allowed")
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

// HTTPStatus: the hive's own refusal (model_not_found,
// insufficient_memory, …) reaches the operator with its status; a hive
// failing is a bad gateway.
func (e *HiveError) HTTPStatus() int {
	if e.Status >= 400 && e.Status < 500 || e.Status == http.StatusInsufficientStorage {
		return e.Status
	}
	return http.StatusBadGateway
}

// ErrorCode is the hive's code with its own status, else hive_error.
func (e *HiveError) ErrorCode() string {
	if e.HTTPStatus() == e.Status {
		return e.Code
	}
	return "hive_error"
}

// HiveMessage is the hive's own words.
func (e *HiveError) HiveMessage() string { return e.Message }

// PublicMessage is the refusal in words for API clients (a request the
// controller placed a worker for): the hive's own message may name its
// models directory or other files, and stays in the log and the audit.
func (e *HiveError) PublicMessage() string {
	switch e.Code {
	case "model_not_found":
		return "its hive does not have the model's file"
	case "insufficient_memory":
		return "its hive has not enough memory for it"
	case "max_loaded":
		return "its hive runs its --max-loaded workers"
	case "invalid_model", "unsupported_model":
		return "its hive cannot load the model's file (" + e.Code + ")"
	case "device_unusable", "device_not_found":
		return "its hive cannot use the device (" + e.Code + ")"
	case "unknown_engine":
		return "its hive has no such engine"
	case "shutting_down":
		return "its hive is shutting down"
	}
	return fmt.Sprintf("its hive refused the start (%d %s)", e.Status, api.Printable(e.Code, 64))
}

// writeError answers {"error":{"code","message"}} with the status and code
// err carries. Internal errors say only that something failed; the log
// has the details.
func writeError(w http.ResponseWriter, err error) { api.Fail(w, err, "queen") }

func sortedStrings(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}
