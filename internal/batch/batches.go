package batch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
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

// Batch creation writes a batch's jobs in transactions of at most
// createChunkJobs jobs and createChunkBytes of bodies: each holds the
// store's write lock for a few milliseconds, so that other writes (the
// admin API, heartbeats, other batches) go in between.
const (
	createChunkJobs  = 500
	createChunkBytes = 4 << 20
)

// postBatch creates a batch over an uploaded file. The batch row comes
// first, validating (the dispatcher takes no job of it); the file is read
// as a stream and its jobs written queued, a chunk a transaction; then
// the batch goes in_progress with its audit entry (batch.created) in one
// transaction. A creation that fails on the way (a line refused, the
// client gone, the store) removes what it wrote; one cut short by the
// queen's end is removed by the next start (Run), which creations wait
// for.
func (s *Service) postBatch(w http.ResponseWriter, r *http.Request) error {
	body, err := openai.ReadBody(w, r, 1<<20)
	if err != nil {
		return err
	}
	// The start's clean-up first: it removes the batches left validating,
	// and this one will be, for a moment.
	select {
	case <-s.recovered:
	case <-r.Context().Done():
		return r.Context().Err()
	}
	if s.recoverErr != nil {
		return &openai.Error{Status: http.StatusServiceUnavailable, Code: "batches_unavailable", Message: s.recoverErr.Error() + "; the queen's log says more"}
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
	f, err := s.files.open(r.Context(), file)
	if err != nil {
		return err
	}
	defer f.Close()
	now := time.Now()
	b := store.Batch{ID: newID("batch_", now), Endpoint: req.Endpoint, InputFileID: file.ID, CompletionWindow: CompletionWindow,
		Status: string(StatusValidating), Metadata: req.Metadata, CreatedAt: now, ExpiresAt: now.Add(completionWindow)}
	if err := s.st.Update(r.Context(), func(tx *store.Tx) error {
		// Counted with this one, in its transaction, the count locked
		// first: two creations at once (on any queen of the database)
		// cannot both take the last place.
		if err := tx.LockBatchCount(); err != nil {
			return err
		}
		if err := tx.PutBatch(b); err != nil {
			return err
		}
		open, err := tx.CountBatches(openStatuses...)
		if err != nil {
			return err
		}
		if open > s.cfg.MaxOpenBatches {
			return s.tooManyBatches()
		}
		return nil
	}); err != nil {
		return err
	}
	n, models, err := s.writeJobs(r.Context(), b, f)
	if err == nil {
		err = s.st.Update(r.Context(), func(tx *store.Tx) error {
			at := time.Now()
			b.Status, b.Total, b.InProgressAt = string(StatusInProgress), n, &at
			if err := tx.UpdateBatch(b, string(StatusValidating)); err != nil {
				return err
			}
			_, err := tx.Append(store.AuditEntry{Actor: Actor, Action: "batch.created", Target: b.ID,
				Reason:   fmt.Sprintf("%d requests to %s", n, b.Endpoint),
				Metadata: map[string]any{"input_file_id": file.ID, "endpoint": b.Endpoint, "requests": n, "models": models}})
			return err
		})
	}
	if err != nil {
		s.discard(b.ID, err)
		return err
	}
	s.log.Info("batch created", "batch_id", b.ID, "requests", n, "endpoint", b.Endpoint)
	s.signal()
	openai.WriteJSON(w, http.StatusOK, batchObject(b, Counts{Total: b.Total, Queued: b.Total}))
	return nil
}

// maxAuditModels bounds the models a batch's audit entry counts by name;
// the rest are counted together (a file may name thousands).
const maxAuditModels = 16

// writeJobs reads the batch's input file from f and writes its jobs,
// queued, a chunk a transaction. It returns the number of requests and
// how many name each model.
func (s *Service) writeJobs(ctx context.Context, b store.Batch, f io.Reader) (int, map[string]int, error) {
	models := map[string]int{}
	var chunk []store.BatchJob
	size := 0
	flush := func() error {
		if len(chunk) == 0 {
			return nil
		}
		err := s.st.Update(ctx, func(tx *store.Tx) error { return tx.PutBatchJobs(chunk) })
		clear(chunk)
		chunk, size = chunk[:0], 0
		return err
	}
	now := time.Now()
	lim := s.inputLimits()
	lim.Checked = true // at its upload
	n, err := ScanInput(f, lim, func(rq Request) error {
		if rq.URL != b.Endpoint {
			return openai.Invalid("endpoint", "line %d's url is %s but the batch's endpoint is %s: every line must name the batch's endpoint",
				rq.Line, rq.URL, b.Endpoint)
		}
		if _, ok := models[rq.Model]; ok || len(models) < maxAuditModels {
			models[rq.Model]++
		} else {
			models["(others)"]++
		}
		chunk = append(chunk, store.BatchJob{BatchID: b.ID, Line: rq.Line, CustomID: rq.CustomID, ModelRef: rq.Model, Body: string(rq.Body),
			State: string(JobQueued), UpdatedAt: now})
		if size += len(rq.Body); len(chunk) >= createChunkJobs || size >= createChunkBytes {
			return flush()
		}
		return nil
	})
	if err == nil {
		err = flush()
	}
	return n, models, err
}

// discard removes a batch whose creation failed (why), with its jobs (a
// chunk a transaction), on a context of its own: the client may be gone.
// What it cannot remove the next start removes (Run).
func (s *Service) discard(id string, why error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.removeBatch(ctx, id); err != nil {
		s.log.Warn("cannot remove a batch whose creation failed; the next start of the queen removes it", "batch_id", id, "why", why, "err", err)
		return
	}
	s.log.Info("batch creation failed; what it wrote is removed", "batch_id", id, "why", why)
}

// removeBatch deletes a batch's jobs, a chunk a transaction, then the
// batch.
func (s *Service) removeBatch(ctx context.Context, id string) error {
	for {
		var n int
		if err := s.st.Update(ctx, func(tx *store.Tx) (err error) {
			n, err = tx.DeleteBatchJobs(id, deleteChunkJobs)
			return err
		}); err != nil {
			return err
		}
		if n < deleteChunkJobs {
			break
		}
	}
	return s.st.Update(ctx, func(tx *store.Tx) error { return tx.DeleteBatch(id) })
}

// deleteChunkJobs bounds the jobs one transaction deletes.
const deleteChunkJobs = 2000

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

// cancelBatch cancels a batch in progress: it goes cancelling, so the
// dispatcher takes none of its jobs; its queued requests are cancelled
// (a chunk a transaction), those the dispatcher took are cancelled where
// they are, waiting for a slot or running on a worker; then the partial
// results are written and the batch is cancelled. Cancelling a batch
// that is cancelling or cancelled answers it as it is; an ended one is a
// 409.
func (s *Service) cancelBatch(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	var o BatchObject
	cancelling := false
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
		byState, err := tx.BatchJobCounts(id)
		if err != nil {
			return err
		}
		n := byState[string(JobQueued)]
		if _, err := tx.Append(store.AuditEntry{Actor: Actor, Action: "batch.cancelling", Target: id,
			Reason: fmt.Sprintf("cancelled by the client: %d queued requests cancelled", n), Metadata: map[string]any{"cancelled": n}}); err != nil {
			return err
		}
		cancelling = true
		return nil
	})
	if errors.Is(err, store.ErrNotFound) {
		return errNotFound("batch", id)
	}
	if err != nil {
		return err
	}
	if cancelling {
		s.withdraw(id)
		if err := s.endQueued(r.Context(), id, JobCancelled); err != nil {
			// The rest is ended by the next sweep or start.
			return err
		}
		select {
		case s.cancelled <- id:
		default:
		}
		s.signal()
		if err := s.st.View(r.Context(), func(tx *store.Tx) (err error) {
			o, err = view(tx, id)
			return err
		}); err != nil {
			return err
		}
	}
	openai.WriteJSON(w, http.StatusOK, o)
	return nil
}

// endQueued ends the queued jobs of a batch cancelled (to cancelled) or
// expired (to failed), a chunk a transaction; the dispatcher takes no
// job of such a batch meanwhile.
func (s *Service) endQueued(ctx context.Context, id string, to JobState) error {
	for {
		var n int
		if err := s.st.Update(ctx, func(tx *store.Tx) (err error) {
			n, err = tx.MoveBatchJobs(id, string(JobQueued), string(to), moveChunkJobs, time.Now())
			return err
		}); err != nil {
			return err
		}
		if n < moveChunkJobs {
			return nil
		}
	}
}

// moveChunkJobs bounds the jobs one transaction of endQueued moves.
const moveChunkJobs = 2000

// endAllQueued ends the queued jobs of every batch cancelling or expired
// whose cancel or expiry was cut short (by the queen's end, or the
// store); it returns the first error.
func (s *Service) endAllQueued(ctx context.Context) error {
	var bs []store.Batch
	if err := s.st.View(ctx, func(tx *store.Tx) (err error) {
		bs, err = tx.Batches("", listAll, string(StatusCancelling), string(StatusInProgress))
		return err
	}); err != nil {
		return err
	}
	for _, b := range bs {
		to := JobCancelled
		if Status(b.Status) == StatusInProgress {
			if b.ExpiredAt == nil {
				continue
			}
			to = JobFailed
		}
		if err := s.endQueued(ctx, b.ID, to); err != nil {
			return err
		}
	}
	return nil
}

// openStatuses are the statuses of the batches --batch-max-open-batches
// counts: those being created and the active ones.
var openStatuses = []string{string(StatusValidating), string(StatusInProgress), string(StatusFinalizing), string(StatusCancelling)}

// activeStatuses are the statuses of batches whose requests may still run
// or whose files are not written yet.
var activeStatuses = []string{string(StatusInProgress), string(StatusFinalizing), string(StatusCancelling)}

func isActive(s Status) bool { return slices.Contains(activeStatuses, string(s)) }
