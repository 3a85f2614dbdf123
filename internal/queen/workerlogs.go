package queen

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/registry"
	"github.com/apiary-llm/apiary/internal/transport"
)

// HiveLogs reads a worker's log from its hive (GET
// /v2/workers/{worker_id}/logs, api.LogQuery). The HTTP HiveClient
// implements it.
type HiveLogs interface {
	// WorkerLogs returns the log as the hive streams it; the caller
	// closes it. A hive's refusal is a *HiveError.
	WorkerLogs(ctx context.Context, endpoint, workerID string, q api.LogQuery) (io.ReadCloser, error)
}

// WorkerLogs implements HiveLogs. The client's time limit bounds the wait
// for the answer to begin, not the answer: a follower reads until the
// worker ends or ctx does.
func (c *httpHiveClient) WorkerLogs(ctx context.Context, endpoint, workerID string, q api.LogQuery) (io.ReadCloser, error) {
	path := "/v2/workers/" + url.PathEscape(workerID) + "/logs"
	u := strings.TrimSuffix(endpoint, "/") + path
	if s := q.Encode(); s != "" {
		u += "?" + s
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrHiveUnreachable, err)
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := transport.OpenStream(c.hc, req)
	if err != nil {
		return nil, fmt.Errorf("%w: GET %s%s: %w", ErrHiveUnreachable, endpoint, path, err)
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		data, _ := io.ReadAll(io.LimitReader(resp.Body, maxHiveAnswer))
		d := api.RemoteError(resp.StatusCode, data)
		return nil, &HiveError{Status: resp.StatusCode, Code: d.Code, Message: d.Message}
	}
	return resp.Body, nil // closing it ends the request
}

// getWorkerLogs serves GET /api/admin/workers/{id}/logs: the log of a
// lifecycle row's worker, read from its pool's hive by the hive's worker
// id, for live and ended workers (api.LogQuery). A follower's stream ends
// when the worker ends, the client goes away or the queen shuts down.
func (q *Queen) getWorkerLogs(w http.ResponseWriter, r *http.Request, _ caller) error {
	id := r.PathValue("id")
	if err := checkLifecycleID(id); err != nil {
		return err
	}
	qs, err := query(r, "tail", "follow")
	if err != nil {
		return err
	}
	lq, err := api.ParseLogQuery(qs["tail"], qs["follow"])
	if err != nil {
		return err
	}
	row, err := q.rows.get(r.Context(), id)
	if err != nil {
		return err
	}
	if row.WorkerID == "" {
		if row.Status.Terminal() {
			return &api.RequestError{Status: http.StatusNotFound, Code: "log_not_found",
				Err: fmt.Errorf("worker %s never started on its hive (%s: %s): it has no log", id, row.Status, row.Reason)}
		}
		return fmt.Errorf("%w: %s; its log exists once the hive accepted it: retry in a moment", ErrNotStarted, id)
	}
	pool, ok := q.reg.Get(row.PoolID)
	if !ok || pool.Status == registry.Offline {
		why := "is no longer registered"
		if ok {
			why = "is offline"
		}
		return &api.RequestError{Status: http.StatusServiceUnavailable, Code: "pool_unavailable",
			Err: fmt.Errorf("pool %s of worker %s %s: its hive cannot be asked for the log (on its node it is DATA_DIR/hive/logs/%s.log)", row.PoolID, id, why, row.WorkerID)}
	}
	src, ok := q.hives.(HiveLogs)
	if !ok {
		src = q.hivesHTTP
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	if q.followers != nil {
		defer context.AfterFunc(q.followers, cancel)()
	}
	body, err := src.WorkerLogs(ctx, pool.Endpoint, row.WorkerID, lq)
	switch {
	case hiveCode(err, "worker_not_found"):
		what := fmt.Sprintf("worker %s (hive worker %s on pool %s) is %s", id, row.WorkerID, row.PoolID, row.Status)
		if row.Status.Terminal() {
			what = fmt.Sprintf("worker %s (hive worker %s on pool %s) ended (%s)", id, row.WorkerID, row.PoolID, row.Status)
		}
		return &api.RequestError{Status: http.StatusNotFound, Code: "log_not_found",
			Err: fmt.Errorf("%s, but its hive has no log of it any more (removed, or a new data dir): %w", what, err)}
	case errors.Is(err, ErrHiveUnreachable):
		return fmt.Errorf("the hive of pool %s (%s) does not answer for the log of %s: %w", row.PoolID, pool.Endpoint, id, err)
	case err != nil:
		return fmt.Errorf("log of %s from pool %s: %w", id, row.PoolID, err)
	}
	defer body.Close()
	relayLog(w, body, lq.Follow)
	return nil
}

// relayLog copies a hive's log answer to w: a follower's as it comes,
// flushed after each read; otherwise at most api.MaxLogBytes and the
// hive's last line (a hive bounds it; a queen does not trust that).
func relayLog(w http.ResponseWriter, body io.Reader, follow bool) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	if !follow {
		body = io.LimitReader(body, api.MaxLogBytes+64<<10)
	}
	rc := http.NewResponseController(w)
	buf := make([]byte, 32<<10)
	for {
		n, err := body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return
			}
			if follow {
				if rc.Flush() != nil {
					return
				}
			}
		}
		if err != nil {
			return
		}
	}
}
