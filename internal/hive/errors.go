package hive

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/apiary-llm/apiary/internal/api"
)

// Sentinel errors. Handlers return them (wrapped with %w); writeError maps
// each to a status and code once.
var (
	ErrWorkerNotFound   = errors.New("hive: worker not found")
	ErrModelNotFound    = errors.New("hive: model not found")
	ErrInvalidModelRef  = errors.New("hive: invalid model_ref")
	ErrInvalidModel     = errors.New("hive: model is not a readable GGUF")
	ErrUnsupportedModel = errors.New("hive: unsupported model architecture")
	ErrDeviceNotFound   = errors.New("hive: no such device")
	ErrNoFreePort       = errors.New("hive: no free port in the worker range")
	ErrShuttingDown     = errors.New("hive: shutting down")
	ErrUnauthorized     = errors.New("hive: unauthorized")
	ErrNotStarting      = errors.New("hive: worker is not starting")
	ErrImplausibleReady = errors.New("hive: implausible ready callback")
	ErrWorkerEnded      = errors.New("hive: worker has ended")
	ErrSpawn            = errors.New("hive: cannot start worker process")
)

// InsufficientMemoryError is a preflight refusal naming the shortfall.
type InsufficientMemoryError struct {
	Device    int
	Kind      string
	Need      uint64 // the model's estimate
	Available uint64 // what the device can give
	Held      uint64 // what the hive's workers already hold there
}

func (e *InsufficientMemoryError) Error() string {
	return fmt.Sprintf("hive: model needs %s but %s device %d has %s available (%s held by its workers); short by %s",
		api.FormatBytes(e.Need), e.Kind, e.Device, api.FormatBytes(e.Available), api.FormatBytes(e.Held), api.FormatBytes(e.Need-e.Available))
}

// statusOf maps an error to its HTTP status and snake_case code.
func statusOf(err error) (int, string) {
	var re *api.RequestError
	var me *InsufficientMemoryError
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &re):
		return re.Status, re.Code
	case errors.As(err, &mbe):
		return http.StatusRequestEntityTooLarge, "body_too_large"
	case errors.As(err, &me):
		return http.StatusInsufficientStorage, "insufficient_memory"
	case errors.Is(err, ErrWorkerNotFound):
		return http.StatusNotFound, "worker_not_found"
	case errors.Is(err, ErrModelNotFound):
		return http.StatusNotFound, "model_not_found"
	case errors.Is(err, ErrInvalidModelRef):
		return http.StatusBadRequest, "invalid_model_ref"
	case errors.Is(err, ErrInvalidModel):
		return http.StatusUnprocessableEntity, "invalid_model"
	case errors.Is(err, ErrUnsupportedModel):
		return http.StatusUnprocessableEntity, "unsupported_model"
	case errors.Is(err, ErrDeviceNotFound):
		return http.StatusBadRequest, "device_not_found"
	case errors.Is(err, ErrNoFreePort):
		return http.StatusServiceUnavailable, "no_free_port"
	case errors.Is(err, ErrShuttingDown):
		return http.StatusServiceUnavailable, "shutting_down"
	case errors.Is(err, ErrUnauthorized):
		return http.StatusUnauthorized, "unauthorized"
	case errors.Is(err, ErrNotStarting):
		return http.StatusConflict, "worker_not_starting"
	case errors.Is(err, ErrWorkerEnded):
		return http.StatusConflict, "worker_ended"
	case errors.Is(err, ErrImplausibleReady):
		return http.StatusUnprocessableEntity, "implausible_ready"
	}
	return http.StatusInternalServerError, "internal_error"
}

// writeError answers {"error":{"code","message"}}.
func writeError(w http.ResponseWriter, err error) {
	status, code := statusOf(err)
	api.WriteError(w, status, code, err.Error())
}
