package main

import (
	"context"
	"log/slog"
	"sync"

	"github.com/apiary-llm/apiary/internal/sdnotify"
)

// notifying runs a daemon (run) while sdnotify reports it to the service
// manager named by $NOTIFY_SOCKET (nothing without one). The reporter
// ends with the daemon.
func notifying(ctx context.Context, n *sdnotify.Notifier, d sdnotify.Daemon, log *slog.Logger, run func(context.Context) error) error {
	if !n.Enabled() {
		return run(ctx)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { sdnotify.Run(ctx, n, d, log) })
	return run(ctx)
}
