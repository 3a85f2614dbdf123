package queen

import (
	"context"
	"fmt"
	"strings"

	"github.com/apiary-llm/apiary/internal/registry"
)

// Alive asks the queen's own listener for /health: nil while its HTTP
// server accepts and answers. Valid after Ready; the service manager's
// watchdog is pinged only while it holds.
func (q *Queen) Alive(ctx context.Context) error {
	return q.cfg.TLS.ProbeSelf(ctx, q.addr, "/health")
}

// Summary is one line on the queen's state for the service manager
// (systemctl status): its pools by status and its live worker rows.
// Valid after Ready.
func (q *Queen) Summary() string {
	counts := q.reg.Counts()
	parts := make([]string, 0, len(registry.Statuses))
	for _, s := range registry.Statuses {
		parts = append(parts, fmt.Sprintf("%d %s", counts[s], s))
	}
	return fmt.Sprintf("serving at %s; pools: %s; workers: %d live", q.URL(), strings.Join(parts, ", "), q.rows.liveCount())
}
