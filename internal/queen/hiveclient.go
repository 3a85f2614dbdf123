package queen

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/rpc"
	"github.com/apiary-llm/apiary/internal/store"
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
	// fence is the queen's store once it holds the database: every
	// call proves the lease first and carries its epoch
	// (api.QueenEpochHeader). Set before the queen serves.
	fence atomic.Pointer[store.Store]
}

// fenced is a HiveClient whose calls the queen's lease fences.
type fenced interface{ setFence(*store.Store) }

func (c *httpHiveClient) setFence(st *store.Store) { c.fence.Store(st) }

// NewHTTPHiveClient is the HiveClient of a running queen.
func NewHTTPHiveClient(clusterToken string, timeout time.Duration) HiveClient {
	return &httpHiveClient{token: clusterToken, hc: transport.NewClient(nil, timeout)}
}

// CloseIdleConnections closes the keep-alive connections to hives that
// no call uses now (the queen's shutdown).
func (c *httpHiveClient) CloseIdleConnections() { c.hc.CloseIdleConnections() }

func (c *httpHiveClient) StartWorker(ctx context.Context, endpoint string, req api.StartWorkerRequest) (api.StartWorkerResponse, error) {
	var resp api.StartWorkerResponse
	err := c.post(ctx, endpoint, "/v2/workers/start", req, &resp)
	return resp, err
}

func (c *httpHiveClient) StopWorker(ctx context.Context, endpoint, workerID string, req api.StopWorkerRequest) error {
	return c.post(ctx, endpoint, "/v2/workers/"+url.PathEscape(workerID)+"/stop", req, nil)
}

func (c *httpHiveClient) post(ctx context.Context, endpoint, path string, body, out any) error {
	return c.call(ctx, rpc.Call{Method: http.MethodPost, URL: strings.TrimSuffix(endpoint, "/") + path, In: body, Out: out, MaxAnswer: maxHiveAnswer})
}

// call makes one call to a hive with the cluster token: an answer that is
// not 2xx is the hive's refusal (*HiveError); no answer is
// ErrHiveUnreachable.
func (c *httpHiveClient) call(ctx context.Context, rc rpc.Call) error {
	rc.Token = c.token
	if st := c.fence.Load(); st != nil {
		// A queen whose lease ran out sends nothing: another may hold
		// the database. A hive that has seen a newer epoch refuses an
		// older one (a call that left just before the lease ran out).
		if err := st.Fence(); err != nil {
			return fmt.Errorf("not sent to the hive: %w", err)
		}
		if e := st.Epoch(); e > 0 {
			rc.Header = http.Header{api.QueenEpochHeader: {strconv.FormatInt(e, 10)}}
		}
	}
	err := rpc.Do(ctx, c.hc, rc)
	var se *rpc.StatusError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &se):
		return &HiveError{Status: se.Status, Code: se.Code, Message: se.Message}
	case errors.Is(err, rpc.ErrUnreachable):
		return fmt.Errorf("%w: %w", ErrHiveUnreachable, err)
	}
	return err
}

// hiveDown reports whether err is a call to a hive that could not
// connect (refused, unreachable, no route, a dial that timed out): no
// hive listens there. A hive that answered, even with an error, or that
// took the connection and then failed to answer in time, is not down.
func hiveDown(err error) bool {
	var oe *net.OpError
	return errors.Is(err, ErrHiveUnreachable) && errors.As(err, &oe) && oe.Op == "dial"
}

// poolDownError answers a start whose hive did not take the connection:
// the caller learns the pool, that it is unhealthy now and the row that
// failed, never the hive's address or the network's error (which the
// log, the audit entry and the row's reason keep).
type poolDownError struct {
	pool, row string
}

func (e *poolDownError) Error() string {
	return fmt.Sprintf("pool %s did not answer (marked unhealthy); lifecycle row %s is FAILED", e.pool, e.row)
}

// Is makes a poolDownError an ErrHiveUnreachable; HTTPStatus and
// ErrorCode are that one's (502 hive_unreachable).
func (e *poolDownError) Is(target error) bool { return target == ErrHiveUnreachable }
func (e *poolDownError) HTTPStatus() int      { return ErrHiveUnreachable.Status }
func (e *poolDownError) ErrorCode() string    { return ErrHiveUnreachable.Code }

// hiveCode reports whether err is the hive's refusal with code.
func hiveCode(err error, code string) bool {
	var he *HiveError
	return errors.As(err, &he) && he.Code == code
}

// tokenSource is a HiveClient that can ask a hive for its workers'
// tokens (the HTTP one; test hives may not).
type tokenSource interface {
	WorkerTokens(ctx context.Context, endpoint string) (api.WorkerTokens, error)
}

// WorkerTokens implements tokenSource: GET /v2/workers/tokens.
func (c *httpHiveClient) WorkerTokens(ctx context.Context, endpoint string) (api.WorkerTokens, error) {
	var out api.WorkerTokens
	err := c.call(ctx, rpc.Call{URL: strings.TrimSuffix(endpoint, "/") + "/v2/workers/tokens", Out: &out, MaxAnswer: maxHiveAnswer})
	return out, err
}

// Models implements routing.HiveModels: GET /v2/models.
func (c *httpHiveClient) Models(ctx context.Context, endpoint string) ([]api.Model, error) {
	var list api.ModelList
	err := c.call(ctx, rpc.Call{URL: strings.TrimSuffix(endpoint, "/") + "/v2/models", Out: &list, MaxAnswer: 8 << 20})
	return list.Models, err
}

// hivePinger is a HiveClient that can ask whether a hive answers (the
// HTTP one; test hives may not).
type hivePinger interface {
	Ping(ctx context.Context, endpoint string) error
}

// Ping implements hivePinger: GET /health, without the cluster token
// (it needs none). Any answer is nil: something serves there.
func (c *httpHiveClient) Ping(ctx context.Context, endpoint string) error {
	err := rpc.Do(ctx, c.hc, rpc.Call{URL: strings.TrimSuffix(endpoint, "/") + "/health", MaxAnswer: 4096})
	if errors.As(err, new(*rpc.StatusError)) {
		return nil
	}
	return err
}
