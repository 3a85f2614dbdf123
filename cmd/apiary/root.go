package main

import (
	"errors"
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
	root.SetFlagErrorFunc(flagError)
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

// flagError is a flag that cobra could not parse, as a usage error (exit
// 2). A value of the wrong kind is told as what the flag takes: pflag's
// own message names the Go function that refused it ("strconv.ParseInt:
// parsing "x": invalid syntax"). The cause stays wrapped.
func flagError(_ *cobra.Command, err error) error {
	var ive *pflag.InvalidValueError
	if !errors.As(err, &ive) {
		return &usageError{err: err}
	}
	f := ive.GetFlag()
	msg := fmt.Sprintf("--%s %q: %v", f.Name, ive.GetValue(), errors.Unwrap(ive))
	if want, ok := flagKinds[f.Value.Type()]; ok {
		msg = fmt.Sprintf("--%s %q is not %s", f.Name, ive.GetValue(), want)
	}
	return &usageError{err: &toldError{msg: msg, err: err}}
}

// flagKinds says what a flag of each pflag type takes, in a person's words.
var flagKinds = map[string]string{
	"int": "a whole number", "int32": "a whole number", "int64": "a whole number",
	"uint": "a whole number of 0 or more", "uint32": "a whole number of 0 or more", "uint64": "a whole number of 0 or more",
	"float32": "a number", "float64": "a number",
	"duration": "a duration (Go syntax: 500ms, 2s, 5m, 1h30m)",
	"bool":     "true or false",
}

// toldError is an error whose message is written for a person while the
// error it replaces stays wrapped for errors.Is and errors.As.
type toldError struct {
	msg string
	err error
}

func (e *toldError) Error() string { return e.msg }
func (e *toldError) Unwrap() error { return e.err }
