package batch

import (
	"encoding/json"
	"time"

	"github.com/apiary-llm/apiary/internal/store"
)

// File purposes.
const (
	PurposeBatch       = "batch"
	PurposeBatchOutput = "batch_output"
	PurposeBatchError  = "batch_error"
)

// FileObject is OpenAI's file object.
type FileObject struct {
	ID            string  `json:"id"`
	Object        string  `json:"object"` // "file"
	Bytes         int64   `json:"bytes"`
	CreatedAt     int64   `json:"created_at"`
	ExpiresAt     *int64  `json:"expires_at,omitempty"`
	Filename      string  `json:"filename"`
	Purpose       string  `json:"purpose"`
	Status        string  `json:"status"` // "processed"
	StatusDetails *string `json:"status_details"`
}

func fileObject(f store.BatchFile) FileObject {
	return FileObject{ID: f.ID, Object: "file", Bytes: f.Bytes, CreatedAt: f.CreatedAt.Unix(), ExpiresAt: unix(f.ExpiresAt),
		Filename: f.Filename, Purpose: f.Purpose, Status: "processed"}
}

// FileDeleted answers DELETE /v1/files/{id}.
type FileDeleted struct {
	ID      string `json:"id"`
	Object  string `json:"object"` // "file"
	Deleted bool   `json:"deleted"`
}

// List is OpenAI's cursor page.
type List[T any] struct {
	Object  string `json:"object"` // "list"
	Data    []T    `json:"data"`
	FirstID string `json:"first_id,omitempty"`
	LastID  string `json:"last_id,omitempty"`
	HasMore bool   `json:"has_more"`
}

// RequestCounts is a batch's requests by outcome.
type RequestCounts struct {
	Total     int `json:"total"`
	Completed int `json:"completed"`
	Failed    int `json:"failed"`
}

// BatchError is one of a batch's errors.
type BatchError struct {
	Code    string  `json:"code"`
	Message string  `json:"message"`
	Param   *string `json:"param"`
	Line    *int    `json:"line"`
}

// BatchErrors is the list of a failed batch's errors.
type BatchErrors struct {
	Object string       `json:"object"` // "list"
	Data   []BatchError `json:"data"`
}

// BatchObject is OpenAI's batch object.
type BatchObject struct {
	ID               string            `json:"id"`
	Object           string            `json:"object"` // "batch"
	Endpoint         string            `json:"endpoint"`
	Errors           *BatchErrors      `json:"errors"`
	InputFileID      string            `json:"input_file_id"`
	CompletionWindow string            `json:"completion_window"`
	Status           Status            `json:"status"`
	OutputFileID     *string           `json:"output_file_id"`
	ErrorFileID      *string           `json:"error_file_id"`
	CreatedAt        int64             `json:"created_at"`
	InProgressAt     *int64            `json:"in_progress_at"`
	ExpiresAt        *int64            `json:"expires_at"`
	FinalizingAt     *int64            `json:"finalizing_at"`
	CompletedAt      *int64            `json:"completed_at"`
	FailedAt         *int64            `json:"failed_at"`
	ExpiredAt        *int64            `json:"expired_at"`
	CancellingAt     *int64            `json:"cancelling_at"`
	CancelledAt      *int64            `json:"cancelled_at"`
	RequestCounts    RequestCounts     `json:"request_counts"`
	Metadata         map[string]string `json:"metadata"`
	// Queued and Running are apiary's: the requests not ended yet.
	Queued  int `json:"queued"`
	Running int `json:"running"`
}

func batchObject(b store.Batch, c Counts) BatchObject {
	o := BatchObject{ID: b.ID, Object: "batch", Endpoint: b.Endpoint, InputFileID: b.InputFileID, CompletionWindow: b.CompletionWindow,
		Status: Status(b.Status), OutputFileID: text(b.OutputFileID), ErrorFileID: text(b.ErrorFileID), CreatedAt: b.CreatedAt.Unix(),
		InProgressAt: unix(b.InProgressAt), ExpiresAt: unix(&b.ExpiresAt), FinalizingAt: unix(b.FinalizingAt), CompletedAt: unix(b.CompletedAt),
		FailedAt: unix(b.FailedAt), ExpiredAt: unix(b.ExpiredAt), CancellingAt: unix(b.CancellingAt), CancelledAt: unix(b.CancelledAt),
		RequestCounts: RequestCounts{Total: c.Total, Completed: c.Completed, Failed: c.Failed}, Metadata: b.Metadata,
		Queued: c.Queued, Running: c.Running}
	if o.Metadata == nil {
		o.Metadata = map[string]string{}
	}
	if b.Failure != "" {
		o.Errors = &BatchErrors{Object: "list", Data: []BatchError{{Code: "batch_failed", Message: b.Failure}}}
	}
	return o
}

func unix(t *time.Time) *int64 {
	if t == nil || t.IsZero() {
		return nil
	}
	v := t.Unix()
	return &v
}

func text(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// ResultLine is one line of a batch's output or error file: the
// request's custom_id with the worker's answer (response) or why there
// is none (error).
type ResultLine struct {
	ID       string          `json:"id"`
	CustomID string          `json:"custom_id"`
	Response *ResultResponse `json:"response"`
	Error    *ResultError    `json:"error"`
}

// ResultResponse is a worker's answer to one request.
type ResultResponse struct {
	StatusCode int             `json:"status_code"`
	RequestID  string          `json:"request_id"`
	Body       json.RawMessage `json:"body"`
}

// ResultError is why a request has no answer.
type ResultError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}
