package main

import (
	"errors"
	"io"

	"github.com/spf13/cobra"
)

var errNotImplemented = errors.New("not implemented yet")

func newRootCmd(stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:           "apiary",
		Short:         "Turn machines with GPUs (or CPUs) into one OpenAI-compatible LLM endpoint",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &usageError{err: err} })
	root.AddCommand(
		newQueenCmd(),
		newHiveCmd(),
		newWorkerCmd(),
		newInferCmd(),
		newWorkersCmd(),
		newPoolsCmd(),
		newNodesCmd(),
		newAuditCmd(),
		newModelsCmd(),
		newVersionCmd(),
	)
	return root
}

// notImplemented is the body of commands that later issues fill in: they
// answer with exit code 2 so scripts can tell them apart from failures.
func notImplemented(use, short string) *cobra.Command {
	return &cobra.Command{
		Use:                use,
		Short:              short + " (not implemented yet)",
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return &exitError{code: 2, err: errors.Join(errors.New(cmd.CommandPath() + ": " + errNotImplemented.Error()))}
		},
	}
}
