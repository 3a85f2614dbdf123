// Command apiary is the single binary of the apiary system: the queen
// (orchestrator), the hive (pool manager), the worker (one model on one
// device) and the keeper (the commands a person types).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(exitCode(err, os.Stderr))
}

// run builds the command tree and executes it with args.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	root := newRootCmd(stdout, stderr)
	root.SetArgs(args)
	return root.ExecuteContext(ctx)
}

// exitCode maps an error to the contract's exit codes (0 success, 1 runtime
// failure, 2 usage error) and prints it as one line (printError: a daemon's
// message shows as printable text).
func exitCode(err error, stderr io.Writer) int {
	if err == nil || errors.Is(err, context.Canceled) {
		return 0
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.err != nil {
			printError(stderr, ee.err)
		}
		return ee.code
	}
	var ue *usageError
	if errors.As(err, &ue) {
		printError(stderr, err)
		return 2
	}
	printError(stderr, err)
	return 1
}

// usageError marks a mistake in the command line (exit code 2).
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

func usagef(format string, a ...any) error {
	return &usageError{err: fmt.Errorf(format, a...)}
}

// exitError carries an explicit exit code (e.g. 130 after Ctrl+C).
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit %d", e.code)
	}
	return e.err.Error()
}
func (e *exitError) Unwrap() error { return e.err }
