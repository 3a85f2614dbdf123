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
	"github.com/apiary-llm/apiary/internal/rpc"
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
	resp, err := j.raw(ctx, http.MethodPost, "/v1/files", body.Bytes(), mw.FormDataContentType())
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

// raw sends a request whose body or answer is not JSON to the active
// queen (queens.call); an answer other than 200 is the queen's *APIError.
func (j *Jobs) raw(ctx context.Context, method, path string, body []byte, contentType string) (*http.Response, error) {
	var resp *http.Response
	err := j.c.qs.call(ctx, safeMethod(method), false, func(base string) error {
		req, err := http.NewRequestWithContext(ctx, method, base+path, bytes.NewReader(body))
		if err != nil {
			return err
		}
		if contentType != "" {
			req.Header.Set("Content-Type", contentType)
		}
		if j.token != "" {
			req.Header.Set("Authorization", "Bearer "+j.token)
		}
		if resp, err = j.c.hc.Do(req); err != nil {
			return fmt.Errorf("%w: %w", rpc.ErrUnreachable, err)
		}
		if resp.StatusCode != http.StatusOK {
			defer resp.Body.Close()
			data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
			if sb := standbyAnswer(resp.StatusCode, resp.Header, data); sb != nil {
				return sb
			}
			return apiError(resp.StatusCode, data)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
}
