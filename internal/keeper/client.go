// Package keeper is the side of apiary a person types: `apiary infer`
// (Infer: persistent mode against a running queen, or ephemeral mode with
// a queen and a local hive it starts and tears down), and the admin client
// of the queen's API (pools, lifecycle rows, audit log, nodes, shutdown)
// that the `apiary workers|pools|nodes|audit` commands use.
package keeper

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/rpc"
	"github.com/apiary-llm/apiary/internal/transport"
)

// ErrUnreachable means no queen answered at the URL.
var ErrUnreachable = errors.New("queen unreachable")

// unreachable says that nothing answered at base, and why in the
// network's words (connection refused, no such host, a timeout), once.
func unreachable(base string, err error, hint bool) error {
	why, ok := rpc.NetReason(err)
	if !ok {
		why = err.Error()
	}
	msg := ErrUnreachable.Error() + " at " + base + ": " + why
	if hint {
		msg += " (start one with `apiary queen`, or point --queen / APIARY_QUEEN at one)"
	}
	return &unreachableError{msg: msg, err: err}
}

// unreachableError is ErrUnreachable with where and why; it wraps the
// network error too.
type unreachableError struct {
	msg string
	err error
}

func (e *unreachableError) Error() string   { return e.msg }
func (e *unreachableError) Unwrap() []error { return []error{ErrUnreachable, e.err} }

// APIError is the queen's error answer.
type APIError struct {
	Status  int
	Code    string
	Message string
}

func (e *APIError) Error() string {
	return fmt.Sprintf("%s (%d %s)", e.Message, e.Status, e.Code)
}

// Client talks to the active queen of a list (queens).
type Client struct {
	qs           *queens
	adminToken   string
	clusterToken string
	hc           *http.Client
}

// NewClient returns a client of the queen at queen: one URL, or several
// separated by commas (queens sharing one PostgreSQL database), of which
// it follows the active one. A malformed list fails every call with an
// error that is ErrUsage (transport.BaseURLs checks it before). The admin
// token authenticates /api/admin/…; pool commands use it too, or the
// cluster token when there is no admin token.
func NewClient(queen, adminToken, clusterToken string) *Client {
	return &Client{qs: newQueens(queen), adminToken: adminToken, clusterToken: clusterToken,
		hc: transport.NewClient(nil, 60*time.Second)}
}

// SetTimeout bounds each call (default 60s); removing a node waits for its
// hive's cascade.
func (c *Client) SetTimeout(d time.Duration) { c.hc.Timeout = d }

// WorkerFilter selects lifecycle rows.
type WorkerFilter struct {
	Status, Model, PoolID string
	Limit                 int
}

// Workers lists lifecycle rows, newest first.
func (c *Client) Workers(ctx context.Context, f WorkerFilter) ([]api.LifecycleRow, error) {
	v := url.Values{}
	set(v, "status", f.Status)
	set(v, "model", f.Model)
	set(v, "pool_id", f.PoolID)
	if f.Limit > 0 {
		v.Set("limit", strconv.Itoa(f.Limit))
	}
	var out api.LifecycleRowList
	err := c.do(ctx, http.MethodGet, "/api/admin/workers", v, nil, &out, c.adminToken)
	return out.Workers, err
}

// StartWorker asks for a worker; the answer carries its lifecycle id.
func (c *Client) StartWorker(ctx context.Context, model, poolID string, gpu *int, reason string) (api.AdminWorkerResponse, error) {
	var out api.AdminWorkerResponse
	err := c.do(ctx, http.MethodPost, "/api/admin/workers", nil, api.AdminWorkerRequest{
		Action: api.ActionStart, Model: model, PoolID: poolID, GPU: gpu, Reason: reason}, &out, c.adminToken)
	return out, err
}

// CreateWorker writes a row for a worker of model: placement
// api.PlacementAuto (the queen places and starts it, on poolID when not
// "") or api.PlacementOperator (the row waits for a worker run by hand to
// claim it).
func (c *Client) CreateWorker(ctx context.Context, model, placement, poolID, reason string) (api.AdminWorkerResponse, error) {
	var out api.AdminWorkerResponse
	err := c.do(ctx, http.MethodPost, "/api/admin/workers", nil, api.AdminWorkerRequest{
		Action: api.ActionCreate, Model: model, Placement: placement, PoolID: poolID, Reason: reason}, &out, c.adminToken)
	return out, err
}

// StopWorker asks to stop the worker of a lifecycle row.
func (c *Client) StopWorker(ctx context.Context, lifecycleID string, drain bool, reason string) (api.AdminWorkerResponse, error) {
	var out api.AdminWorkerResponse
	err := c.do(ctx, http.MethodPost, "/api/admin/workers", nil, api.AdminWorkerRequest{
		Action: api.ActionStop, LifecycleID: lifecycleID, Drain: drain, Reason: reason}, &out, c.adminToken)
	return out, err
}

// PoolFilter selects pools.
type PoolFilter struct {
	Status, Model string
	MinVRAMBytes  uint64
}

// Pools lists pools by id.
func (c *Client) Pools(ctx context.Context, f PoolFilter) ([]api.Pool, error) {
	v := url.Values{}
	set(v, "status", f.Status)
	set(v, "model", f.Model)
	if f.MinVRAMBytes > 0 {
		v.Set("min_vram_bytes", strconv.FormatUint(f.MinVRAMBytes, 10))
	}
	var out api.PoolList
	err := c.do(ctx, http.MethodGet, "/v2/pools", v, nil, &out, c.poolToken())
	return out.Pools, err
}

// DrainPool drains a pool: it gets no new workers.
func (c *Client) DrainPool(ctx context.Context, id, reason string) (api.Pool, error) {
	return c.DrainPoolNow(ctx, id, reason, false)
}

// DrainPoolNow drains a pool; with now its running workers are stopped
// too (gracefully).
func (c *Client) DrainPoolNow(ctx context.Context, id, reason string, now bool) (api.Pool, error) {
	var out api.Pool
	err := c.do(ctx, http.MethodPost, "/v2/pools/"+url.PathEscape(id)+"/drain", nil, api.PoolAction{Reason: reason, Now: now}, &out, c.adminToken)
	return out, err
}

// UndrainPool takes a drained pool back: it gets new workers again.
func (c *Client) UndrainPool(ctx context.Context, id, reason string) (api.Pool, error) {
	var out api.Pool
	err := c.do(ctx, http.MethodPost, "/v2/pools/"+url.PathEscape(id)+"/undrain", nil, api.PoolAction{Reason: reason}, &out, c.adminToken)
	return out, err
}

// RemovePool deregisters a pool (offline; removed after the retention).
func (c *Client) RemovePool(ctx context.Context, id, reason string) (api.Pool, error) {
	var out api.Pool
	err := c.do(ctx, http.MethodDelete, "/v2/pools/"+url.PathEscape(id), nil, api.PoolAction{Reason: reason}, &out, c.adminToken)
	return out, err
}

// Audit lists audit entries, newest first. since is a duration ("1h") or
// an RFC 3339 time; "" for all.
func (c *Client) Audit(ctx context.Context, since string, limit int) ([]api.AuditEntry, error) {
	return c.AuditQuery(ctx, AuditFilter{Since: since, Limit: limit})
}

// AuditFilter selects audit entries as GET /api/admin/audit does: Since
// and Until are durations or RFC 3339 times; Actor, Action and Target
// exact values; Limit at most this many (0: the queen's default).
type AuditFilter struct {
	Since, Until, Actor, Action, Target string
	Limit                               int
}

// AuditQuery reads the audit entries f selects, newest first.
func (c *Client) AuditQuery(ctx context.Context, f AuditFilter) ([]api.AuditEntry, error) {
	v := url.Values{}
	set(v, "since", f.Since)
	set(v, "until", f.Until)
	set(v, "actor", f.Actor)
	set(v, "action", f.Action)
	set(v, "target", f.Target)
	if f.Limit > 0 {
		v.Set("limit", strconv.Itoa(f.Limit))
	}
	var out api.AuditList
	err := c.do(ctx, http.MethodGet, "/api/admin/audit", v, nil, &out, c.adminToken)
	return out.Entries, err
}

func (c *Client) poolToken() string {
	if c.adminToken != "" {
		return c.adminToken
	}
	return c.clusterToken
}

func set(v url.Values, k, s string) {
	if s != "" {
		v.Set(k, s)
	}
}

// do makes one call of the queen's JSON API, at the active queen
// (queens.call): a GET may go to the next queen whatever went wrong, any
// other only when it was not sent or a standby refused it.
func (c *Client) do(ctx context.Context, method, path string, q url.Values, body, out any, token string) error {
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	return c.qs.call(ctx, safeMethod(method), true, func(base string) error {
		err := rpc.Do(ctx, c.hc, rpc.Call{Method: method, URL: base + path, Token: token, In: body, Out: out, MaxAnswer: 64 << 20})
		var se *rpc.StatusError
		if errors.As(err, &se) {
			if sb := standbyAnswer(se.Status, se.Header, se.Body); sb != nil {
				return sb
			}
			return apiError(se.Status, se.Body)
		}
		return err
	})
}

// safeMethod reports whether a request of method changes nothing at the
// queen, so that it may go to another queen after one that may have
// received it gave no answer.
func safeMethod(method string) bool { return method == http.MethodGet || method == http.MethodHead }

// apiError is the queen's error answer data with status, its text as it
// came: the CLI escapes what it prints (termtext), so a person sees what
// was sent.
func apiError(status int, data []byte) *APIError {
	var e api.Error
	if json.Unmarshal(data, &e) != nil || e.Error.Code == "" {
		return &APIError{Status: status, Code: "http_error", Message: strings.TrimSpace(string(data))}
	}
	return &APIError{Status: status, Code: e.Error.Code, Message: e.Error.Message}
}

// Nodes lists the SSH nodes of the queen (and its local hive), by name.
func (c *Client) Nodes(ctx context.Context) ([]api.Node, error) {
	var out api.NodeList
	err := c.do(ctx, http.MethodGet, "/api/admin/nodes", nil, nil, &out, c.adminToken)
	return out.Nodes, err
}

// AddNode asks the queen to probe a node over SSH, save it and start a
// hive there.
func (c *Client) AddNode(ctx context.Context, req api.AddNodeRequest) (api.Node, error) {
	var out api.Node
	err := c.do(ctx, http.MethodPost, "/api/admin/nodes", nil, req, &out, c.adminToken)
	return out, err
}

// RemoveNode stops the hive the queen runs on node name (it stops its
// workers first) and forgets the node.
func (c *Client) RemoveNode(ctx context.Context, name, reason string) (api.Node, error) {
	var out api.Node
	err := c.do(ctx, http.MethodDelete, "/api/admin/nodes/"+url.PathEscape(name), nil, api.PoolAction{Reason: reason}, &out, c.adminToken)
	return out, err
}

// Shutdown asks the queen for its cascading shutdown.
func (c *Client) Shutdown(ctx context.Context, reason string) (api.ShutdownResponse, error) {
	var out api.ShutdownResponse
	err := c.do(ctx, http.MethodPost, "/api/admin/shutdown", nil, api.ShutdownRequest{Reason: reason}, &out, c.adminToken)
	return out, err
}

// Health asks GET /health; ErrUnreachable when nothing answers.
func (c *Client) Health(ctx context.Context) (api.Health, error) {
	var out api.Health
	err := c.do(ctx, http.MethodGet, "/health", nil, nil, &out, "")
	return out, err
}

// ScaleModel sets model's min workers (and max, when not nil): the queen
// keeps at least min of it live.
func (c *Client) ScaleModel(ctx context.Context, model string, minWorkers int, maxWorkers *int, reason string) (api.ModelSetting, error) {
	var out api.ModelSetting
	err := c.do(ctx, http.MethodPut, "/api/admin/models/"+url.PathEscape(model), nil,
		api.ModelScaleRequest{MinWorkers: &minWorkers, MaxWorkers: maxWorkers, Reason: reason}, &out, c.adminToken)
	return out, err
}

// ModelSettings lists the models' settings, by model.
func (c *Client) ModelSettings(ctx context.Context) ([]api.ModelSetting, error) {
	var out api.ModelSettingList
	err := c.do(ctx, http.MethodGet, "/api/admin/models", nil, nil, &out, c.adminToken)
	return out.Models, err
}

// PullModel asks the queen to have pool poolID's hive pull a model in the
// background (POST /api/admin/pools/{id}/models/pull).
func (c *Client) PullModel(ctx context.Context, poolID string, req api.PullModelRequest) (api.ModelPull, error) {
	var out api.ModelPull
	err := c.do(ctx, http.MethodPost, "/api/admin/pools/"+url.PathEscape(poolID)+"/models/pull", nil, req, &out, c.adminToken)
	return out, err
}

// ModelPulls lists the pulls pool poolID's hive remembers.
func (c *Client) ModelPulls(ctx context.Context, poolID string) ([]api.ModelPull, error) {
	var out api.ModelPullList
	err := c.do(ctx, http.MethodGet, "/api/admin/pools/"+url.PathEscape(poolID)+"/models/pulls", nil, nil, &out, c.adminToken)
	return out.Pulls, err
}

// PoolModels lists every answering pool's models.
func (c *Client) PoolModels(ctx context.Context) ([]api.PoolModels, error) {
	var out api.PoolModelsList
	err := c.do(ctx, http.MethodGet, "/api/admin/pools/models", nil, nil, &out, c.adminToken)
	return out.Pools, err
}
