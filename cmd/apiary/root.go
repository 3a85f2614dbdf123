package main

import (
	"io"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/apiary-llm/apiary/internal/secret"
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
	addCAFlag(root)
	redactDefaults(root)
	return root
}

// redactDefaults keeps secrets out of --help: a flag whose default is a
// URL (--queen takes $APIARY_QUEEN) shows it without its password. A flag
// whose default is a secret itself takes no default from the environment
// (see envDefault).
func redactDefaults(c *cobra.Command) {
	redact := func(f *pflag.Flag) {
		if strings.Contains(f.DefValue, "://") {
			f.DefValue = secret.RedactURL(f.DefValue)
		}
	}
	c.Flags().VisitAll(redact)
	c.PersistentFlags().VisitAll(redact)
	for _, sub := range c.Commands() {
		redactDefaults(sub)
	}
}
