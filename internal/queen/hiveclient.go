package queen

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/transport"
)

// HiveClient is every effect the queen has on a hive. endpoint is the
// pool's registered base URL.
type HiveClient interface {
	StartWorker(ctx context.Context, endpoint string, req api.StartWorkerRequest) (api.StartWorkerResponse, error)
	StopWorker(ctx context.Context, endpoint, workerID string, req api.StopWorkerRequest) error
}

// maxHiveAnswer bounds what the queen reads of a hive's answer.
const maxHiveAnswer = 1 << 20

// httpHiveClient speaks the hive's HTTP API with the cluster token.
type httpHiveClient struct {
	token string
	hc    *http.Client
}

// NewHTTPHiveClient is the HiveClient of a running queen.
func NewHTTPHiveClient(clusterToken string, timeout time.Duration) HiveClient {
	return &httpHiveClient{token: clusterToken, hc: transport.NewClient(nil, timeout)}
}

func (c *httpHiveClient) StartWorker(ctx context.Context, endpoint string, req api.StartWorkerRequest) (api.StartWorkerResponse, error) {
	var resp api.StartWorkerResponse
	err := c.post(ctx, endpoint, "/v2/workers/start", req, &resp)
	return resp, err
}

func (c *httpHiveClient) StopWorker(ctx context.Context, endpoint, workerID string, req api.StopWorkerRequest) error {
	return c.post(ctx, endpoint, "/v2/workers/"+url.PathEscape(workerID)+"/stop", req, nil)
}

func (c *httpHiveClient) post(ctx context.Context, endpoint, path string, body, out any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(endpoint, "/")+path, bytes.NewReader(b))
	if err != nil {
		return fmt.Errorf("%w: %w", ErrHiveUnreachable, err)
	}
	req.Header.Set("Content-Type", "application/json")
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("%w: POST %s%s: %w", ErrHiveUnreachable, endpoint, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxHiveAnswer))
	if err != nil {
		return fmt.Errorf("%w: POST %s%s: %w", ErrHiveUnreachable, endpoint, path, err)
	}
	if resp.StatusCode/100 != 2 {
		d := api.RemoteError(resp.StatusCode, data)
		return &HiveError{Status: resp.StatusCode, Code: d.Code, Message: d.Message}
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("%w: POST %s%s: bad answer: %w", ErrHiveUnreachable, endpoint, path, err)
		}
	}
	return nil
}

// hiveCode reports whether err is the hive's refusal with code.
func hiveCode(err error, code string) bool {
	var he *HiveError
	return errors.As(err, &he) && he.Code == code
}

// Models implements HiveModels.
func (c *httpHiveClient) Models(ctx context.Context, endpoint string) ([]api.Model, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(endpoint, "/")+"/v2/models", nil)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrHiveUnreachable, err)
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%w: GET %s/v2/models: %w", ErrHiveUnreachable, endpoint, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return nil, fmt.Errorf("%w: GET %s/v2/models: %w", ErrHiveUnreachable, endpoint, err)
	}
	if resp.StatusCode != http.StatusOK {
		d := api.RemoteError(resp.StatusCode, data)
		return nil, &HiveError{Status: resp.StatusCode, Code: d.Code, Message: d.Message}
	}
	var list api.ModelList
	if err := json.Unmarshal(data, &list); err != nil {
		return nil, fmt.Errorf("%w: GET %s/v2/models: bad answer: %w", ErrHiveUnreachable, endpoint, err)
	}
	return list.Models, nil
}
