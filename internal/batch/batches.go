package batch

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"slices"
	"time"

	"github.com/apiary-llm/apiary/internal/openai"
	"github.com/apiary-llm/apiary/internal/store"
)

// Routes adds the Batch API, authenticated as the other /v1 routes.
func (s *Service) Routes(mux *http.ServeMux) {
	h := s.cfg.Router.Handle
	h(mux, "POST /v1/files", "files", s.postFile)
	h(mux, "GET /v1/files", "files", s.getFiles)
	h(mux, "GET /v1/files/{id}", "files", s.getFile)
	h(mux, "GET /v1/files/{id}/content", "files", s.getFileContent)
	h(mux, "DELETE /v1/files/{id}", "files", s.deleteFile)
	h(mux, "POST /v1/batches", "batches", s.postBatch)
	h(mux, "GET /v1/batches", "batches", s.getBatches)
	h(mux, "GET /v1/batches/{id}", "batches", s.getBatch)
	h(mux, "POST /v1/batches/{id}/cancel", "batches", s.cancelBatch)
}

// batchRequest is the body of POST /v1/batches.
type batchRequest struct {
	InputFileID      string            `json:"input_file_id"`
	Endpoint         string            `json:"endpoint"`
	CompletionWindow string            `json:"completion_window"`
	Metadata         map[string]string `json:"metadata"`
}

func (req batchRequest) check() error {
	switch {
	case req.InputFileID == "":
		return &openai.Error{Status: http.StatusBadRequest, Code: openai.CodeMissingParameter, Param: "input_file_id",
			Message: "input_file_id is required: the id of an uploaded file (purpose batch)"}
	case req.Endpoint == "":
		return &openai.Error{Status: http.StatusBadRequest, Code: openai.CodeMissingParameter, Param: "endpoint",
			Message: "endpoint is required: " + endpointList}
	case req.CompletionWindow != CompletionWindow:
		return openai.Invalid("completion_window", `must be "24h"`)
	case len(req.Metadata) > 16:
		return openai.Invalid("metadata", "holds at most 16 keys")
	}
	for k, v := range req.Metadata {
		if len(k) > 64 || len(v) > 512 {
			return openai.Invalid("metadata", "keys are at most 64 characters and values at most 512")
		}
	}
	return checkEndpoint("endpoint", req.Endpoint)
}

// postBatch creates a batch over an uploaded file: the batch row, one
// queued job a request and the audit entry, in one transaction.
func (s *Service) postBatch(w http.ResponseWriter, r *http.Request) error {
	body, err := openai.ReadBody(w, r, 1<<20)
	if err != nil {
		return err
	}
	var req batchRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return &openai.Error{Status: http.StatusBadRequest, Code: openai.CodeInvalidJSON, Message: "the body is not a JSON batch request: " + err.Error()}
	}
	if err := req.check(); err != nil {
		return err
	}
	var file store.BatchFile
	err = s.st.View(r.Context(), func(tx *store.Tx) (err error) {
		file, err = tx.BatchFile(req.InputFileID)
		return err
	})
	if errors.Is(err, store.ErrNotFound) {
		return &openai.Error{Status: http.StatusBadRequest, Code: openai.CodeInvalidValue, Param: "input_file_id",
			Message: fmt.Sprintf("no file %q (upload one with POST /v1/files, purpose batch)", req.InputFileID)}
	}
	if err != nil {
		return err
	}
	if file.Purpose != PurposeBatch {
		return openai.Invalid("input_file_id", "file %s has purpose %s, not batch", file.ID, file.Purpose)
	}
	f, err := os.Open(s.path(file.ID))
	if err != nil {
		return fmt.Errorf("batch: the bytes of file %s: %w", file.ID, err)
	}
	reqs, err := ParseInput(f)
	f.Close()
	if err != nil {
		return err
	}
	if reqs[0].URL != req.Endpoint {
		return openai.Invalid("endpoint", "line %d's url is %s but the batch's endpoint is %s: every line must name the batch's endpoint",
			reqs[0].Line, reqs[0].URL, req.Endpoint)
	}
	now := time.Now()
	b := store.Batch{ID: newID("batch_", now), Endpoint: req.Endpoint, InputFileID: file.ID, CompletionWindow: CompletionWindow,
		Status: string(StatusInProgress), Metadata: req.Metadata, Total: len(reqs), CreatedAt: now, ExpiresAt: now.Add(completionWindow),
		InProgressAt: &now}
	jobs := make([]store.BatchJob, len(reqs))
	models := map[string]int{}
	for i, rq := range reqs {
		jobs[i] = store.BatchJob{BatchID: b.ID, Line: rq.Line, CustomID: rq.CustomID, ModelRef: rq.Model, Body: string(rq.Body),
			State: string(JobQueued), UpdatedAt: now}
		models[rq.Model]++
	}
	err = s.st.Update(r.Context(), func(tx *store.Tx) error {
		if err := tx.PutBatch(b); err != nil {
			return err
		}
		if err := tx.PutBatchJobs(jobs); err != nil {
			return err
		}
		_, err := tx.Append(store.AuditEntry{Actor: Actor, Action: "batch.created", Target: b.ID,
			Reason:   fmt.Sprintf("%d requests to %s", len(reqs), b.Endpoint),
			Metadata: map[string]any{"input_file_id": file.ID, "endpoint": b.Endpoint, "requests": len(reqs), "models": models}})
		return err
	})
	if err != nil {
		return err
	}
	s.log.Info("batch created", "batch_id", b.ID, "requests", len(reqs), "endpoint", b.Endpoint)
	s.signal()
	openai.WriteJSON(w, http.StatusOK, batchObject(b, Counts{Total: b.Total, Queued: b.Total}))
	return nil
}

// view reads a batch with its counts.
func view(tx *store.Tx, id string) (BatchObject, error) {
	b, err := tx.Batch(id)
	if err != nil {
		return BatchObject{}, err
	}
	byState, err := tx.BatchJobCounts(id)
	if err != nil {
		return BatchObject{}, err
	}
	return batchObject(b, countJobs(b.Total, byState)), nil
}

func (s *Service) getBatch(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	var o BatchObject
	err := s.st.View(r.Context(), func(tx *store.Tx) (err error) {
		o, err = view(tx, id)
		return err
	})
	if errors.Is(err, store.ErrNotFound) {
		return errNotFound("batch", id)
	}
	if err != nil {
		return err
	}
	openai.WriteJSON(w, http.StatusOK, o)
	return nil
}

func (s *Service) getBatches(w http.ResponseWriter, r *http.Request) error {
	limit, err := listLimit(r, 20, 100)
	if err != nil {
		return err
	}
	out := List[BatchObject]{Object: "list", Data: []BatchObject{}}
	err = s.st.View(r.Context(), func(tx *store.Tx) error {
		bs, err := tx.Batches(r.URL.Query().Get("after"), limit+1)
		if err != nil {
			return err
		}
		out.HasMore = len(bs) > limit
		for _, b := range bs[:min(len(bs), limit)] {
			o, err := view(tx, b.ID)
			if err != nil {
				return err
			}
			out.Data = append(out.Data, o)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if len(out.Data) > 0 {
		out.FirstID, out.LastID = out.Data[0].ID, out.Data[len(out.Data)-1].ID
	}
	openai.WriteJSON(w, http.StatusOK, out)
	return nil
}

// cancelBatch cancels a batch in progress: its queued requests are
// cancelled at once, and so are those the dispatcher took that still
// wait for a slot; those running finish, then the partial results are
// written and the batch is cancelled. Cancelling a batch that is
// cancelling or cancelled answers it as it is; an ended one is a 409.
func (s *Service) cancelBatch(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	var o BatchObject
	err := s.st.Update(r.Context(), func(tx *store.Tx) error {
		b, err := tx.Batch(id)
		if err != nil {
			return err
		}
		from := Status(b.Status)
		if from == StatusCancelling || from == StatusCancelled {
			o, err = view(tx, id)
			return err
		}
		if err := CheckMove(from, StatusCancelling); err != nil {
			return &openai.Error{Status: http.StatusConflict, Code: "batch_not_cancellable",
				Message: fmt.Sprintf("batch %s is %s: only a batch in progress can be cancelled", id, from)}
		}
		now := time.Now()
		b.Status, b.CancellingAt = string(StatusCancelling), &now
		if err := tx.UpdateBatch(b, string(from)); err != nil {
			return err
		}
		n, err := tx.SetBatchJobsState(id, string(JobQueued), string(JobCancelled), now)
		if err != nil {
			return err
		}
		if _, err := tx.Append(store.AuditEntry{Actor: Actor, Action: "batch.cancelling", Target: id,
			Reason: fmt.Sprintf("cancelled by the client: %d queued requests cancelled", n), Metadata: map[string]any{"cancelled": n}}); err != nil {
			return err
		}
		o, err = view(tx, id)
		return err
	})
	if errors.Is(err, store.ErrNotFound) {
		return errNotFound("batch", id)
	}
	if err != nil {
		return err
	}
	s.withdraw(id)
	select {
	case s.cancelled <- id:
	default:
	}
	s.signal()
	openai.WriteJSON(w, http.StatusOK, o)
	return nil
}

// activeStatuses are the statuses of batches whose requests may still run
// or whose files are not written yet.
var activeStatuses = []string{string(StatusInProgress), string(StatusFinalizing), string(StatusCancelling)}

func isActive(s Status) bool { return slices.Contains(activeStatuses, string(s)) }
