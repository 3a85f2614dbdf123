package batch

import (
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/apiary-llm/apiary/internal/openai"
	"github.com/apiary-llm/apiary/internal/store"
)

// errNotFound is a file or batch that does not exist.
func errNotFound(what, id string) error {
	return &openai.Error{Status: http.StatusNotFound, Code: openai.CodeNotFound, Message: fmt.Sprintf("no %s %q", what, id)}
}

// expiry is when a file made at now expires; nil: never.
func (s *Service) expiry(now time.Time) *time.Time {
	if s.cfg.FileRetention <= 0 {
		return nil
	}
	t := now.Add(s.cfg.FileRetention)
	return &t
}

// postFile takes a multipart upload (purpose, file) of a batch input
// file, checks it line by line (ScanInput, as a stream) and keeps it.
func (s *Service) postFile(w http.ResponseWriter, r *http.Request) error {
	ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if ct != "multipart/form-data" {
		return openai.Invalid("file", "upload the file as multipart/form-data with the fields purpose and file")
	}
	// Refused before its bytes are read when the queen holds as many as
	// it keeps; counted again with its row.
	if err := s.st.View(r.Context(), s.checkFiles(0)); err != nil {
		return err
	}
	r.Body = http.MaxBytesReader(w, r.Body, s.cfg.MaxFileBytes+1<<20)
	mr, err := r.MultipartReader()
	if err != nil {
		return openai.Invalid("file", "cannot read the multipart form: %v", err)
	}
	if err := os.MkdirAll(s.cfg.Dir, 0o700); err != nil {
		return fmt.Errorf("files dir: %w", err)
	}
	now := time.Now()
	id := newID("file-", now)
	tmp := s.files.temp(id)
	defer os.Remove(tmp)
	var purpose, filename string
	var size int64
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return s.uploadError(err)
		}
		switch part.FormName() {
		case "purpose":
			b, err := io.ReadAll(io.LimitReader(part, 64))
			if err != nil {
				return s.uploadError(err)
			}
			purpose = strings.TrimSpace(string(b))
		case "file":
			filename = part.FileName()
			if size, err = s.copyPart(tmp, part); err != nil {
				return err
			}
		}
		part.Close()
	}
	switch {
	case purpose == "":
		return &openai.Error{Status: http.StatusBadRequest, Code: openai.CodeMissingParameter, Param: "purpose", Message: `purpose is required: "batch"`}
	case purpose != PurposeBatch:
		return openai.Unsupported("purpose", `purpose %q is not supported: apiary keeps files for batches only ("batch")`, purpose)
	case filename == "" && size == 0:
		return &openai.Error{Status: http.StatusBadRequest, Code: openai.CodeMissingParameter, Param: "file", Message: "file is required: the batch's JSONL file"}
	}
	f, err := os.Open(tmp)
	if err != nil {
		return fmt.Errorf("read the upload: %w", err)
	}
	_, perr := ScanInput(f, s.inputLimits(), nil)
	f.Close()
	if perr != nil {
		return perr
	}
	if err := s.files.place(id); err != nil {
		return err
	}
	row := store.BatchFile{ID: id, Purpose: PurposeBatch, Filename: filepath.Base(filename), Bytes: size, CreatedAt: now, ExpiresAt: s.expiry(now)}
	if err := s.st.Update(r.Context(), func(tx *store.Tx) error {
		// The count locked first, as a batch's creation does: two uploads
		// at once cannot both take the last place.
		if err := tx.LockBatchCount(); err != nil {
			return err
		}
		if err := tx.PutBatchFile(row); err != nil {
			return err
		}
		if err := s.checkFiles(1)(tx); err != nil {
			return err
		}
		return s.files.put(tx, id)
	}); err != nil {
		s.files.unplace(id)
		return err
	}
	s.log.Info("file uploaded", "file_id", id, "bytes", size, "filename", row.Filename)
	openai.WriteJSON(w, http.StatusOK, fileObject(row))
	return nil
}

// copyPart writes the file part to path, refusing more than MaxFileBytes.
func (s *Service) copyPart(path string, part io.Reader) (int64, error) {
	out, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return 0, fmt.Errorf("write the upload: %w", err)
	}
	n, err := io.Copy(out, io.LimitReader(part, s.cfg.MaxFileBytes+1))
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return n, s.uploadError(err)
	}
	if n > s.cfg.MaxFileBytes {
		return n, s.tooLarge()
	}
	return n, nil
}

// inputLimits are the bounds of an input file.
func (s *Service) inputLimits() InputLimits {
	return InputLimits{MaxLines: s.cfg.MaxLines, MaxLineBytes: int(s.cfg.MaxLineBytes)}
}

// checkFiles refuses an upload when the queen keeps more than MaxFiles
// input files, counting mine of its own in the transaction (0 before its
// row is written, 1 with it).
func (s *Service) checkFiles(mine int) func(tx *store.Tx) error {
	return func(tx *store.Tx) error {
		n, err := tx.CountBatchFiles(PurposeBatch)
		if err != nil {
			return err
		}
		if n-mine >= s.cfg.MaxFiles {
			return &openai.Error{Status: http.StatusTooManyRequests, Code: "too_many_files", Param: "file",
				Message: fmt.Sprintf("the queen already keeps %d batch input files, its limit (--batch-max-files %d, for every caller together); delete files you no longer need (DELETE /v1/files/{id}) or wait for them to expire",
					n-mine, s.cfg.MaxFiles)}
		}
		return nil
	}
}

// tooManyBatches refuses a batch past MaxOpenBatches.
func (s *Service) tooManyBatches() error {
	return &openai.Error{Status: http.StatusTooManyRequests, Code: "too_many_batches",
		Message: fmt.Sprintf("the queen already has %d batches that have not ended, its limit (--batch-max-open-batches %d, for every caller together); wait for one to end or cancel one",
			s.cfg.MaxOpenBatches, s.cfg.MaxOpenBatches)}
}

func (s *Service) tooLarge() error {
	return &openai.Error{Status: http.StatusRequestEntityTooLarge, Code: openai.CodeBodyTooLarge, Param: "file",
		Message: fmt.Sprintf("the file is larger than the queen's limit of %d bytes (--batch-max-file-bytes); split it into several batches", s.cfg.MaxFileBytes)}
}

func (s *Service) uploadError(err error) error {
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return s.tooLarge()
	}
	return openai.Invalid("file", "cannot read the upload: %v", err)
}

// listLimit reads ?limit= (1 to max, default def).
func listLimit(r *http.Request, def, most int) (int, error) {
	v := r.URL.Query().Get("limit")
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > most {
		return 0, openai.Invalid("limit", "must be a whole number from 1 to %d", most)
	}
	return n, nil
}

func (s *Service) getFiles(w http.ResponseWriter, r *http.Request) error {
	limit, err := listLimit(r, 10000, 10000)
	if err != nil {
		return err
	}
	var files []store.BatchFile
	err = s.st.View(r.Context(), func(tx *store.Tx) error {
		files, err = tx.BatchFiles(r.URL.Query().Get("purpose"), r.URL.Query().Get("after"), limit+1)
		return err
	})
	if err != nil {
		return err
	}
	out := List[FileObject]{Object: "list", Data: []FileObject{}, HasMore: len(files) > limit}
	for _, f := range files[:min(len(files), limit)] {
		out.Data = append(out.Data, fileObject(f))
	}
	if len(out.Data) > 0 {
		out.FirstID, out.LastID = out.Data[0].ID, out.Data[len(out.Data)-1].ID
	}
	openai.WriteJSON(w, http.StatusOK, out)
	return nil
}

func (s *Service) file(r *http.Request) (store.BatchFile, error) {
	id := r.PathValue("id")
	var f store.BatchFile
	err := s.st.View(r.Context(), func(tx *store.Tx) (err error) {
		f, err = tx.BatchFile(id)
		return err
	})
	if errors.Is(err, store.ErrNotFound) {
		return f, errNotFound("file", id)
	}
	return f, err
}

func (s *Service) getFile(w http.ResponseWriter, r *http.Request) error {
	f, err := s.file(r)
	if err != nil {
		return err
	}
	openai.WriteJSON(w, http.StatusOK, fileObject(f))
	return nil
}

func (s *Service) getFileContent(w http.ResponseWriter, r *http.Request) error {
	f, err := s.file(r)
	if err != nil {
		return err
	}
	data, err := s.files.open(r.Context(), f)
	if err != nil {
		return err
	}
	defer data.Close()
	// The first bytes before the answer's head: a file whose bytes are
	// gone is an error answer, not a 200 cut short.
	head := make([]byte, 64<<10)
	n, err := io.ReadFull(data, head)
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("the bytes of file %s: %w", f.ID, err)
	}
	w.Header().Set("Content-Type", "application/jsonl")
	w.Header().Set("Content-Length", strconv.FormatInt(f.Bytes, 10))
	w.WriteHeader(http.StatusOK)
	if _, err := w.Write(head[:n]); err != nil {
		return nil
	}
	if _, err := io.Copy(w, data); err != nil && r.Context().Err() == nil {
		s.log.Warn("the content of a file broke off", "file_id", f.ID, "err", err)
	}
	return nil
}

func (s *Service) deleteFile(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	err := s.st.Update(r.Context(), func(tx *store.Tx) error { return tx.DeleteBatchFile(id) })
	if errors.Is(err, store.ErrNotFound) {
		return errNotFound("file", id)
	}
	if err != nil {
		return err
	}
	if err := s.files.removed(id); err != nil {
		s.log.Warn("cannot remove a deleted file's bytes", "file_id", id, "err", err)
	}
	openai.WriteJSON(w, http.StatusOK, FileDeleted{ID: id, Object: "file", Deleted: true})
	return nil
}
