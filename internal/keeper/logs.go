package keeper

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/transport"
)

// WorkerLogs writes the log of a lifecycle row's worker to w, as the
// queen relays it from the worker's hive (GET
// /api/admin/workers/{id}/logs): the end of it as q asks and, with
// q.Follow, every new line until the worker ends or ctx does. The
// client's time limit bounds the wait for the answer to begin, not the
// stream.
func (c *Client) WorkerLogs(ctx context.Context, id string, q api.LogQuery, w io.Writer) error {
	path := "/api/admin/workers/" + url.PathEscape(id) + "/logs"
	u := c.base + path
	if s := q.Encode(); s != "" {
		u += "?" + s
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	if c.adminToken != "" {
		req.Header.Set("Authorization", "Bearer "+c.adminToken)
	}
	resp, err := transport.OpenStream(c.hc, req)
	if err != nil {
		if perr := ctx.Err(); perr != nil {
			return perr // Ctrl+C
		}
		return unreachable(c.base, err, true)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return apiError(resp.StatusCode, data)
	}
	if _, err := io.Copy(w, resp.Body); err != nil {
		if perr := ctx.Err(); perr != nil {
			return perr
		}
		return fmt.Errorf("the log of %s broke off: %w", id, err)
	}
	return nil
}
