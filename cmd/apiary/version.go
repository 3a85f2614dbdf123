package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/apiary-llm/apiary/internal/cpuvariant"
	"github.com/apiary-llm/apiary/internal/version"
)

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version, the llama.cpp it links, and the CPU backend workers load here",
		Long: `Print the version on the first line, then the llama.cpp the binary links
(tag, commit and commit date), then which of the CPU backends beside the
binary (libggml-cpu-<level>.so) workers load on this machine, and why: the
best level this CPU runs, or the one APIARY_CPU_VARIANT names.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out := cmd.OutOrStdout()
			llama := version.LlamaCpp
			if llama == "" {
				llama = "unknown (built without the Makefile)"
			}
			if _, err := fmt.Fprintf(out, "%s\nllama.cpp: %s\n", version.Version, llama); err != nil {
				return err
			}
			exe, err := os.Executable()
			if err != nil {
				return err
			}
			if r, err := filepath.EvalSymlinks(exe); err == nil {
				exe = r
			}
			c, err := cpuvariant.Choose(filepath.Dir(exe))
			if err != nil {
				return usagef("%w", err)
			}
			_, err = fmt.Fprintf(out, "CPU backend: %s, %s (%s)\n", c.Name, c.Path, c.Reason)
			return err
		},
	}
}
