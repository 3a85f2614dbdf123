package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"syscall"

	"github.com/apiary-llm/apiary/internal/datadir"
	"github.com/apiary-llm/apiary/internal/sdnotify"
)

// daemonError adds what to do to a daemon's failure where its cause says
// which flag chooses otherwise (the libraries never name flags): an
// address in use (--addr), a data directory that cannot be used
// (--data-dir). The cause stays wrapped.
func daemonError(err error) error {
	switch {
	case errors.Is(err, syscall.EADDRINUSE):
		return fmt.Errorf("%w: another process listens there (another queen or hive?); stop it, or choose another --addr", err)
	case errors.Is(err, datadir.ErrUnusable):
		return fmt.Errorf("%w: give --data-dir a directory this user can create and write", err)
	}
	return err
}

// notifying runs a daemon (run) while sdnotify reports it to the service
// manager named by $NOTIFY_SOCKET (nothing without one). The reporter
// ends with the daemon.
func notifying(ctx context.Context, n *sdnotify.Notifier, d sdnotify.Daemon, log *slog.Logger, run func(context.Context) error) error {
	if !n.Enabled() {
		return daemonError(run(ctx))
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { sdnotify.Run(ctx, n, d, log) })
	return daemonError(run(ctx))
}
