package hive

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/openai"
)

// Sentinel errors, each with the status and code it is answered with
// (openai.Coded); handlers return them wrapped with %w, and writeError
// answers the status and code found with one errors.As.
var (
	ErrWorkerNotFound   = openai.Sentinel(http.StatusNotFound, "worker_not_found", "worker not found")
	ErrModelNotFound    = openai.Sentinel(http.StatusNotFound, "model_not_found", "model not found")
	ErrInvalidModelRef  = openai.Sentinel(http.StatusBadRequest, "invalid_model_ref", "invalid model_ref")
	ErrInvalidModel     = openai.Sentinel(http.StatusUnprocessableEntity, "invalid_model", "model is not a readable GGUF")
	ErrUnsupportedModel = openai.Sentinel(http.StatusUnprocessableEntity, "unsupported_model", "unsupported model architecture")
	ErrUnknownEngine    = openai.Sentinel(http.StatusBadRequest, "unknown_engine", "this hive has no such engine")
	ErrDeviceNotFound   = openai.Sentinel(http.StatusBadRequest, "device_not_found", "no such device")
	ErrBadDevices       = openai.Sentinel(http.StatusBadRequest, "invalid_gpu_devices", "invalid gpu_devices")
	ErrDeviceUnusable   = openai.Sentinel(http.StatusConflict, "device_unusable", "no worker can use this device")
	ErrNoFreePort       = openai.Sentinel(http.StatusServiceUnavailable, "no_free_port", "no free port in the worker range")
	ErrShuttingDown     = openai.Sentinel(http.StatusServiceUnavailable, "shutting_down", "shutting down")
	ErrUnauthorized     = openai.Sentinel(http.StatusUnauthorized, "unauthorized", "unauthorized")
	ErrNotStarting      = openai.Sentinel(http.StatusConflict, "worker_not_starting", "worker is not starting")
	ErrImplausibleReady = openai.Sentinel(http.StatusUnprocessableEntity, "implausible_ready", "implausible ready callback")
	ErrWorkerEnded      = openai.Sentinel(http.StatusConflict, "worker_ended", "worker has ended")
	ErrMaxLoaded        = openai.Sentinel(http.StatusConflict, "max_loaded", "the hive runs its --max-loaded workers")
	ErrStaleQueen       = openai.Sentinel(http.StatusConflict, "stale_queen", "a command from a queen that was deposed")
	ErrSpawn            = errors.New("cannot start worker process") // an internal error
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
	return fmt.Sprintf("model needs %s but %s device %d has %s available (%s held by its workers); short by %s",
		api.FormatBytes(e.Need), e.Kind, e.Device, api.FormatBytes(e.Available), api.FormatBytes(e.Held), api.FormatBytes(e.Need-e.Available))
}

func (e *InsufficientMemoryError) HTTPStatus() int   { return http.StatusInsufficientStorage }
func (e *InsufficientMemoryError) ErrorCode() string { return "insufficient_memory" }

// writeError answers {"error":{"code","message"}}.
func writeError(w http.ResponseWriter, err error) {
	status, code := api.StatusOf(err)
	api.WriteError(w, status, code, err.Error())
}
