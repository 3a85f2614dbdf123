package keeper

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/rpc"
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
	if s := q.Encode(); s != "" {
		path += "?" + s
	}
	var resp *http.Response
	err := c.qs.call(ctx, true, true, func(base string) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+path, nil)
		if err != nil {
			return err
		}
		if c.adminToken != "" {
			req.Header.Set("Authorization", "Bearer "+c.adminToken)
		}
		if resp, err = transport.OpenStream(c.hc, req); err != nil {
			return fmt.Errorf("%w: %w", rpc.ErrUnreachable, err)
		}
		if resp.StatusCode != http.StatusOK {
			defer resp.Body.Close()
			data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
			if sb := standbyAnswer(resp.StatusCode, resp.Header, data); sb != nil {
				return sb
			}
			return apiError(resp.StatusCode, data)
		}
		return nil
	})
	if err != nil {
		if perr := ctx.Err(); perr != nil {
			return perr // Ctrl+C
		}
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(w, resp.Body); err != nil {
		if perr := ctx.Err(); perr != nil {
			return perr
		}
		return fmt.Errorf("the log of %s broke off: %w", id, err)
	}
	return nil
}
