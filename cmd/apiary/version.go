package main

import (
	"fmt"
	"os"

	"github.com/apiary-llm/apiary/internal/cpuvariant"
	"github.com/apiary-llm/apiary/internal/version"
	"github.com/spf13/cobra"
)

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version, and the CPU build workers run here",
		Long: `Print the version on the first line, then which build of apiary runs
llama.cpp on this machine (portable, x86-64-v3 or x86-64-v4: the best the
CPU has whose file, apiary-<build>, is beside this binary) and why.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out := cmd.OutOrStdout()
			if _, err := fmt.Fprintln(out, version.Version); err != nil {
				return err
			}
			exe, err := os.Executable()
			if err != nil {
				return err
			}
			c, err := cpuvariant.Choose(exe)
			if err != nil {
				return usagef("%w", err)
			}
			variant := c.Variant
			if variant == "" {
				variant = "unnamed"
			}
			_, err = fmt.Fprintf(out, "workers: %s build, %s (%s)\n", variant, c.Path, c.Reason)
			return err
		},
	}
}
