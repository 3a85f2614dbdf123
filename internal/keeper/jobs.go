package keeper

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/url"
	"path/filepath"

	"github.com/apiary-llm/apiary/internal/batch"
)

// Jobs is the client of the queen's Batch API (/v1/files, /v1/batches)
// that `apiary jobs` uses, with the API token.
type Jobs struct {
	c     *Client
	token string
}

// Jobs returns the Batch API client with apiToken ($APIARY_API_TOKEN).
func (c *Client) Jobs(apiToken string) *Jobs { return &Jobs{c: c, token: apiToken} }

// Upload sends a batch input file (purpose batch).
func (j *Jobs) Upload(ctx context.Context, name string, data []byte) (batch.FileObject, error) {
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	if err := mw.WriteField("purpose", batch.PurposeBatch); err != nil {
		return batch.FileObject{}, err
	}
	fw, err := mw.CreateFormFile("file", filepath.Base(name))
	if err != nil {
		return batch.FileObject{}, err
	}
	if _, err := fw.Write(data); err != nil {
		return batch.FileObject{}, err
	}
	if err := mw.Close(); err != nil {
		return batch.FileObject{}, err
	}
	resp, err := j.raw(ctx, http.MethodPost, "/v1/files", &body, mw.FormDataContentType())
	if err != nil {
		return batch.FileObject{}, err
	}
	defer resp.Body.Close()
	var f batch.FileObject
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&f); err != nil {
		return f, fmt.Errorf("the queen's answer to the upload: %w", err)
	}
	return f, nil
}

// Create starts a batch over an uploaded file.
func (j *Jobs) Create(ctx context.Context, fileID, endpoint string) (batch.BatchObject, error) {
	var out batch.BatchObject
	in := map[string]string{"input_file_id": fileID, "endpoint": endpoint, "completion_window": batch.CompletionWindow}
	err := j.c.do(ctx, http.MethodPost, "/v1/batches", nil, in, &out, j.token)
	return out, err
}

// Get reads one batch.
func (j *Jobs) Get(ctx context.Context, id string) (batch.BatchObject, error) {
	var out batch.BatchObject
	err := j.c.do(ctx, http.MethodGet, "/v1/batches/"+url.PathEscape(id), nil, nil, &out, j.token)
	return out, err
}

// List reads the newest batches, at most limit.
func (j *Jobs) List(ctx context.Context, limit int) ([]batch.BatchObject, error) {
	var out batch.List[batch.BatchObject]
	err := j.c.do(ctx, http.MethodGet, "/v1/batches", url.Values{"limit": {fmt.Sprint(limit)}}, nil, &out, j.token)
	return out.Data, err
}

// Cancel cancels a batch.
func (j *Jobs) Cancel(ctx context.Context, id string) (batch.BatchObject, error) {
	var out batch.BatchObject
	err := j.c.do(ctx, http.MethodPost, "/v1/batches/"+url.PathEscape(id)+"/cancel", nil, struct{}{}, &out, j.token)
	return out, err
}

// Content copies a file's bytes to w.
func (j *Jobs) Content(ctx context.Context, fileID string, w io.Writer) error {
	resp, err := j.raw(ctx, http.MethodGet, "/v1/files/"+url.PathEscape(fileID)+"/content", nil, "")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, err = io.Copy(w, resp.Body)
	return err
}

// raw sends a request whose body or answer is not JSON; an answer other
// than 200 is the queen's *APIError.
func (j *Jobs) raw(ctx context.Context, method, path string, body io.Reader, contentType string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, j.c.base+path, body)
	if err != nil {
		return nil, err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if j.token != "" {
		req.Header.Set("Authorization", "Bearer "+j.token)
	}
	resp, err := j.c.hc.Do(req)
	if err != nil {
		return nil, unreachable(j.c.base, err, false)
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		return nil, apiError(resp.StatusCode, data)
	}
	return resp, nil
}
