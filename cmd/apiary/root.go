package main

import (
	"fmt"
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
		// Cobra's own "unknown command" is a plain error (exit 1); as
		// every other usage error, it exits 2.
		Args:                       cobra.ArbitraryArgs,
		SuggestionsMinimumDistance: 2,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return cmd.Help()
			}
			hint := ""
			if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
				hint = fmt.Sprintf("; did you mean %s?", strings.Join(s, ", "))
			}
			return usagef("unknown command %q for %q%s (see apiary --help)", args[0], cmd.CommandPath(), hint)
		},
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &usageError{err: err} })
	root.AddCommand(
		newQueenCmd(),
		newHiveCmd(),
		newWorkerCmd(),
		newEngineFrontCmd(),
		newInferCmd(),
		newWorkersCmd(),
		newPoolsCmd(),
		newNodesCmd(),
		newAuditCmd(),
		newJobsCmd(),
		newModelsCmd(),
		newServiceCmd(),
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
