package main

import (
	"io"

	"github.com/spf13/cobra"
)

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
